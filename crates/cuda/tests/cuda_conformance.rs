//! The conformance kit on the CUDA executor — zero copy, staged through
//! windows in host memory, and LL — the failures a group must report
//! rather than hang on, a call captured in a CUDA graph and replayed, and
//! the behaviour without CUDA. On a machine without a GPU the device
//! tests print `SKIPPED:` and pass; `FERROCOLL_REQUIRE_GPU=1` turns that
//! into a failure. `FERROCOLL_CUDA_DEVICES=0,1` picks the devices ranks
//! go round (default: every rank on device 0, as on a single-GPU
//! machine). The kernel's own source also runs on CPU threads in the
//! crate's unit tests.

use std::time::Duration;

use cudarc::driver::{CudaSlice, sys};
use ferrocoll_core::comm::{CommError, CommunicatorExt, Planning};
use ferrocoll_core::conformance::{Case, Harness, KitElement, check_case, run_on_threads};
use ferrocoll_core::{Algorithm, Collective, CollectiveKind, DataType, ReduceOp};
use ferrocoll_cuda::{CudaCommunicator, CudaConfig, CudaError, probe};
use ferrocoll_device::DeviceCommunicator;

/// Whether a skip must be a failure (`FERROCOLL_REQUIRE_GPU=1`, set by
/// scripts/gpu-check.sh on the GPU machine).
fn gpu_required() -> bool {
    std::env::var("FERROCOLL_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// `Some(reason)` when the device tests must skip.
fn skip() -> Option<String> {
    match probe::available() {
        Ok(_) => None,
        Err(e) if !gpu_required() => Some(e.to_string()),
        Err(e) => panic!("FERROCOLL_REQUIRE_GPU=1 but {e}"),
    }
}

fn devices(n: u32) -> Vec<usize> {
    let list: Vec<usize> = std::env::var("FERROCOLL_CUDA_DEVICES")
        .ok()
        .map(|s| s.split(',').filter_map(|d| d.trim().parse().ok()).collect())
        .filter(|l: &Vec<usize>| !l.is_empty())
        .unwrap_or_else(|| vec![0]);
    (0..n as usize).map(|r| list[r % list.len()]).collect()
}

/// The executor with small slots, so even short buffers cross several
/// segments and reuse every slot.
struct Cuda {
    max_chunk_bytes: usize,
    /// `false`: windows in host memory, every message staged there.
    p2p: bool,
    /// Calls up to this size take LL (0: every call the bulk protocol).
    ll_max_bytes: usize,
}

impl Harness for Cuda {
    fn run<T: KitElement>(
        &self,
        case: &Case,
        inputs: &[Vec<T>],
        outputs: Vec<Vec<T>>,
    ) -> Result<Vec<Vec<T>>, String> {
        let config = CudaConfig {
            ll_max_bytes: self.ll_max_bytes,
            p2p: self.p2p,
            ..config(case.algorithm, self.max_chunk_bytes, 30)
        };
        run_on_threads(case, inputs, outputs, |f| {
            ferrocoll_cuda::run(&devices(case.world_size), &config, f).map_err(|e| e.to_string())
        })
    }
}

/// Every way messages travel: zero copy, staged in host memory, LL.
const WAYS: [Cuda; 3] = [
    Cuda {
        max_chunk_bytes: 256,
        p2p: true,
        ll_max_bytes: 0,
    },
    Cuda {
        max_chunk_bytes: 256,
        p2p: false,
        ll_max_bytes: 0,
    },
    Cuda {
        max_chunk_bytes: 256,
        p2p: true,
        ll_max_bytes: 1 << 20,
    },
];

fn config(algorithm: Option<Algorithm>, max_chunk_bytes: usize, timeout: u64) -> CudaConfig {
    CudaConfig {
        planning: Planning {
            timeout: Duration::from_secs(timeout),
            algorithm,
            channels: Some(2),
            max_chunk_bytes: Some(max_chunk_bytes),
            ..CudaConfig::default().planning
        },
        ..CudaConfig::default()
    }
}

fn run_all(cases: Vec<Case>, harness: &impl Harness) {
    let total = cases.len();
    for case in cases {
        if let Err(e) = check_case(harness, &case) {
            panic!("{e}");
        }
    }
    println!("{total} cases passed");
}

fn supported() -> Vec<(Algorithm, CollectiveKind)> {
    ferrocoll_core::algorithms::applicable().collect()
}

/// Every algorithm and collective on 1, 2, 3, 4 and 8 ranks, odd and
/// zero counts, in place and out.
fn algorithm_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut seed = 0;
    for (algorithm, kind) in supported() {
        for n in [1u32, 2, 3, 4, 8] {
            let collective = kind.with_root(n / 2);
            for count in [0usize, 1, n as usize + 1, 97, 4099] {
                for in_place in [false, true] {
                    if in_place && collective.in_place_alias(0).is_none() {
                        continue;
                    }
                    seed += 1;
                    cases.push(Case {
                        collective,
                        algorithm: Some(algorithm),
                        world_size: n,
                        count,
                        dtype: DataType::I32,
                        op: ReduceOp::Sum,
                        in_place,
                        seed,
                    });
                }
            }
        }
    }
    cases
}

/// Every dtype and op through ring, direct and tree all-reduce; 1031
/// elements put chunk boundaries off 16 bytes for every element size, so
/// element-wise paths run beside the vector ones.
fn dtype_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut seed = 1000;
    for algorithm in [Algorithm::Ring, Algorithm::Direct, Algorithm::Tree] {
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                for (n, in_place) in [(3u32, false), (4, true)] {
                    seed += 1;
                    cases.push(Case {
                        collective: Collective::AllReduce,
                        algorithm: Some(algorithm),
                        world_size: n,
                        count: 1031,
                        dtype,
                        op,
                        in_place,
                        seed,
                    });
                }
            }
        }
    }
    cases
}

#[test]
fn every_algorithm_and_collective() {
    if let Some(reason) = skip() {
        println!("SKIPPED: {reason}");
        return;
    }
    for way in &WAYS {
        run_all(algorithm_cases(), way);
    }
}

#[test]
fn every_dtype_and_op() {
    if let Some(reason) = skip() {
        println!("SKIPPED: {reason}");
        return;
    }
    for way in &WAYS {
        run_all(
            dtype_cases(),
            &Cuda {
                max_chunk_bytes: 1024,
                ..*way
            },
        );
    }
}

#[test]
fn without_cuda_every_entry_point_is_a_typed_error() {
    if probe::available().is_ok() {
        println!("SKIPPED: CUDA is present; this test is for machines without it");
        return;
    }
    let err = ferrocoll_cuda::group(&[0, 0], &CudaConfig::default())
        .err()
        .expect("no CUDA here");
    assert!(matches!(err, CudaError::BackendUnavailable { .. }), "{err}");
    let err =
        ferrocoll_cuda::run(&[0], &CudaConfig::default(), |_| Ok(())).expect_err("no CUDA here");
    assert!(err.to_string().contains("unavailable"), "{err}");
    assert!(ferrocoll_cuda::group(&[], &CudaConfig::default()).is_err());
    // A world the device tables cannot hold is refused before CUDA is asked.
    let err = ferrocoll_cuda::group(&[0; 65], &CudaConfig::default())
        .err()
        .expect("too many ranks");
    assert!(matches!(err, CudaError::Invalid(_)), "{err}");
}

/// Run `f` on two ranks of a group with a short timeout.
fn two_ranks(
    f: impl Fn(&mut CudaCommunicator) -> Result<(), CommError> + Sync,
) -> Vec<Result<(), CommError>> {
    ferrocoll_cuda::run(&devices(2), &config(None, 4096, 3), f).expect("the group opens")
}

#[test]
fn ranks_calling_different_shapes_fail_with_a_mismatch_not_a_hang() {
    if let Some(reason) = skip() {
        println!("SKIPPED: {reason}");
        return;
    }
    // Two calls agree; the third differs, and the board names it.
    let results = two_ranks(|c| {
        for _ in 0..2 {
            let mut out = vec![0f32; 64];
            CommunicatorExt::all_reduce(c, &[1f32; 64], &mut out, ReduceOp::Sum)?;
        }
        let n = 100 + DeviceCommunicator::rank(c) as usize;
        let mut out = vec![0f32; n];
        CommunicatorExt::all_reduce(c, &vec![1f32; n], &mut out, ReduceOp::Sum)
    });
    assert!(results.iter().all(Result::is_err), "{results:?}");
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(CommError::Mismatch { call: 2, .. }))),
        "{results:?}"
    );
}

#[test]
fn a_rank_that_never_calls_times_its_peer_out() {
    if let Some(reason) = skip() {
        println!("SKIPPED: {reason}");
        return;
    }
    let results = two_ranks(|c| {
        if DeviceCommunicator::rank(c) == 1 {
            return Ok(());
        }
        let mut out = vec![0f32; 64];
        CommunicatorExt::all_reduce(c, &[1f32; 64], &mut out, ReduceOp::Sum)
    });
    assert!(results[1].is_ok());
    assert!(
        matches!(
            &results[0],
            Err(CommError::Timeout { .. } | CommError::PeerFailed { .. })
        ),
        "{results:?}"
    );
}

#[test]
fn a_captured_all_reduce_replays_with_new_inputs_and_counts_its_calls() {
    if let Some(reason) = skip() {
        println!("SKIPPED: {reason}");
        return;
    }
    let n = 4u32;
    let count = 3000usize;
    let results = ferrocoll_cuda::run(&devices(n), &config(None, 4096, 20), |c| {
        let stream = c.stream().clone();
        let backend = |e| CommError::backend("cuda", e);
        let mut input: CudaSlice<f32> = stream.alloc_zeros(count).map_err(backend)?;
        let mut output: CudaSlice<f32> = stream.alloc_zeros(count).map_err(backend)?;
        // Warm up outside the capture: the plan is uploaded on first use.
        DeviceCommunicator::all_reduce(c, &input, &mut output, ReduceOp::Sum, &stream)?;
        c.synchronize(&stream)?;
        // As cudarc's own graph tests: tracking off while capturing (the
        // ranks share the context; each turns it off, and on again only
        // once every rank's capture is over: after the replays).
        // SAFETY: nothing else uses this context's buffers meanwhile.
        unsafe { stream.context().disable_event_tracking() };
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(backend)?;
        DeviceCommunicator::all_reduce(c, &input, &mut output, ReduceOp::Sum, &stream)?;
        let graph = stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(backend)?
            .expect("a graph");
        for replay in 1..=3u32 {
            let mine = vec![(DeviceCommunicator::rank(c) + replay) as f32; count];
            stream.memcpy_htod(&mine, &mut input).map_err(backend)?;
            graph.launch().map_err(backend)?;
            c.synchronize(&stream)?;
            let got = stream.clone_dtoh(&output).map_err(backend)?;
            let want = (0..n).map(|r| (r + replay) as f32).sum::<f32>();
            if got.iter().any(|&x| x != want) {
                return Err(CommError::backend(
                    "test",
                    CudaError::Invalid(format!("replay {replay}: {} != {want}", got[0])),
                ));
            }
        }
        // SAFETY: as above; every rank's capture is over (the replays
        // needed all of them).
        unsafe { stream.context().enable_event_tracking() };
        // The host issues its third call (a warm-up, the captured one,
        // this), the device runs its fifth (a warm-up, three replays,
        // this): a mismatch now is call #4 (from 0) as the device counts,
        // not the host's #2.
        let mine = 100 + DeviceCommunicator::rank(c) as usize;
        let small: CudaSlice<f32> = stream.alloc_zeros(mine).map_err(backend)?;
        let mut into: CudaSlice<f32> = stream.alloc_zeros(mine).map_err(backend)?;
        DeviceCommunicator::all_reduce(c, &small, &mut into, ReduceOp::Sum, &stream)?;
        c.synchronize(&stream)?;
        Ok(())
    })
    .expect("the group opens");
    assert!(
        results
            .iter()
            .all(|r| r.is_err() && !format!("{r:?}").contains("replay")),
        "{results:?}"
    );
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(CommError::Mismatch { call: 4, .. }))),
        "{results:?}"
    );
}

#[test]
fn a_capture_with_tracked_buffers_is_refused_with_the_reason() {
    if let Some(reason) = skip() {
        println!("SKIPPED: {reason}");
        return;
    }
    let results = ferrocoll_cuda::run(&devices(1), &config(None, 4096, 20), |c| {
        let stream = c.stream().clone();
        let backend = |e| CommError::backend("cuda", e);
        let input: CudaSlice<f32> = stream.alloc_zeros(1000).map_err(backend)?;
        let mut output: CudaSlice<f32> = stream.alloc_zeros(1000).map_err(backend)?;
        DeviceCommunicator::all_reduce(c, &input, &mut output, ReduceOp::Sum, &stream)?;
        c.synchronize(&stream)?;
        // With cudarc's tracking on, waiting on the buffers' earlier
        // events would invalidate the capture (its error surfacing later,
        // elsewhere): the call is refused before anything is enqueued.
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(backend)?;
        let tracked =
            DeviceCommunicator::all_reduce(c, &input, &mut output, ReduceOp::Sum, &stream);
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        let refused = tracked
            .as_ref()
            .is_err_and(|e| e.to_string().contains("tracking"));
        if !refused || ended.is_err() {
            return Err(CommError::backend(
                "test",
                CudaError::Invalid(format!(
                    "tracked capture: {tracked:?}, capture end: {:?}",
                    ended.err()
                )),
            ));
        }
        // The communicator is still good.
        DeviceCommunicator::all_reduce(c, &input, &mut output, ReduceOp::Sum, &stream)?;
        c.synchronize(&stream)?;
        Ok(())
    })
    .expect("the group opens");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}
