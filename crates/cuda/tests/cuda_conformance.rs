//! The conformance kit on the CUDA executor, and its behaviour without
//! CUDA. On a machine without a GPU the device tests print `SKIPPED:` and
//! pass; `FERROCOLL_REQUIRE_GPU=1` turns that into a failure.
//! `FERROCOLL_CUDA_DEVICES=0,1` picks the devices ranks go round (default:
//! every rank on device 0, as on a single-GPU machine).

use std::time::Duration;

use ferrocoll_core::conformance::{Case, Harness, KitElement, check_case, run_on_threads};
use ferrocoll_core::{Algorithm, Collective, CollectiveKind, DataType, ReduceOp};
use ferrocoll_cuda::{CudaConfig, CudaError, probe};

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

struct Cuda {
    max_chunk_bytes: usize,
    p2p: bool,
}

impl Harness for Cuda {
    fn run<T: KitElement>(
        &self,
        case: &Case,
        inputs: &[Vec<T>],
        outputs: Vec<Vec<T>>,
    ) -> Result<Vec<Vec<T>>, String> {
        let config = CudaConfig {
            timeout: Duration::from_secs(30),
            algorithm: case.algorithm,
            max_chunk_bytes: self.max_chunk_bytes,
            p2p: self.p2p,
            ..CudaConfig::default()
        };
        run_on_threads(case, inputs, outputs, |f| {
            ferrocoll_cuda::run(&devices(case.world_size), &config, f).map_err(|e| e.to_string())
        })
    }
}

fn run_all(cases: Vec<Case>, harness: &Cuda) {
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

#[test]
fn every_algorithm_and_collective_with_2_4_8_ranks() {
    if let Some(reason) = skip() {
        println!("SKIPPED: {reason}");
        return;
    }
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
    // Small chunks: even short buffers cross several segments.
    run_all(
        cases,
        &Cuda {
            max_chunk_bytes: 256,
            p2p: true,
        },
    );
}

#[test]
fn every_dtype_and_op() {
    if let Some(reason) = skip() {
        println!("SKIPPED: {reason}");
        return;
    }
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
    run_all(
        cases,
        &Cuda {
            max_chunk_bytes: 1024,
            p2p: true,
        },
    );
}

#[test]
fn the_host_relay_gives_the_same_results() {
    if let Some(reason) = skip() {
        println!("SKIPPED: {reason}");
        return;
    }
    let cases = (0..6)
        .map(|i| Case {
            collective: [
                Collective::AllReduce,
                Collective::AllGather,
                Collective::ReduceScatter,
            ][i % 3],
            algorithm: Some([Algorithm::Ring, Algorithm::Direct][i / 3]),
            world_size: 4,
            count: 3001,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            in_place: false,
            seed: 5000 + i as u64,
        })
        .collect();
    run_all(
        cases,
        &Cuda {
            max_chunk_bytes: 4096,
            p2p: false,
        },
    );
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
}
