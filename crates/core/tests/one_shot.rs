//! The one-shot protocol on threads: every collective, world size, dtype
//! and op against the serial reference, in place and out of place, with
//! proof that the calls took it (no link carried a byte); back-to-back
//! calls with a straggler, so a staging half rewritten too early shows;
//! and the switch between one-shot and planned calls in one stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ferrocoll_core::comm::{CommError, Communicator, CommunicatorExt, Planning};
use ferrocoll_core::conformance::{Case, Harness, KitElement, check_case, run_on_threads};
use ferrocoll_core::cpu::{self, CpuConfig};
use ferrocoll_core::{Collective, CollectiveKind, DataType, ReduceOp};

/// Threads with a one-shot budget large enough for every case; records
/// whether any link carried data (then the case did not go one-shot).
struct OneShotThreads {
    links_used: AtomicBool,
}

fn config(budget: usize) -> CpuConfig {
    CpuConfig {
        one_shot_bytes: budget,
        planning: Planning {
            timeout: Duration::from_secs(20),
            ..CpuConfig::builtin().planning
        },
        ..CpuConfig::builtin()
    }
}

impl Harness for OneShotThreads {
    fn run<T: KitElement>(
        &self,
        case: &Case,
        inputs: &[Vec<T>],
        outputs: Vec<Vec<T>>,
    ) -> Result<Vec<Vec<T>>, String> {
        let config = config(4 << 20);
        run_on_threads(case, inputs, outputs, |f| {
            Ok(cpu::run(case.world_size, &config, |comm| {
                let out = f(comm)?;
                if !comm.link_traffic().is_empty() {
                    self.links_used.store(true, Ordering::SeqCst);
                }
                Ok(out)
            }))
        })
    }
}

fn check_all(cases: &[Case]) {
    let harness = OneShotThreads {
        links_used: AtomicBool::new(false),
    };
    for case in cases {
        if let Err(e) = check_case(&harness, case) {
            panic!("{e}");
        }
        assert!(
            !harness.links_used.load(Ordering::SeqCst),
            "{case:?} moved data over links: it did not take the one-shot path"
        );
    }
}

fn collectives(n: u32) -> impl Iterator<Item = Collective> {
    CollectiveKind::ALL
        .into_iter()
        .filter(|k| *k != CollectiveKind::SendRecv)
        .flat_map(move |k| {
            let roots: Vec<u32> = if k.with_root(0).root().is_some() {
                vec![0, n - 1]
            } else {
                vec![0]
            };
            roots.into_iter().map(move |r| k.with_root(r))
        })
}

#[test]
fn every_collective_world_size_and_length() {
    let mut cases = Vec::new();
    let mut seed = 0;
    for n in (1..=9).chain([16, 33, 64]) {
        for collective in collectives(n) {
            let n_us = n as usize;
            for count in [0, 1, n_us + 1, 97] {
                for in_place in [false, true] {
                    if in_place && collective.in_place_alias(0).is_none() {
                        continue;
                    }
                    seed += 1;
                    cases.push(Case {
                        collective,
                        algorithm: None,
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
    check_all(&cases);
}

#[test]
fn every_dtype_and_op() {
    let mut cases = Vec::new();
    let mut seed = 5000;
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL {
            for collective in collectives(3) {
                for (n, in_place) in [(3, false), (4, true), (2, false)] {
                    if in_place && collective.in_place_alias(0).is_none() {
                        continue;
                    }
                    seed += 1;
                    cases.push(Case {
                        collective: match collective.root() {
                            Some(_) => collective.kind().with_root(1),
                            None => collective,
                        },
                        algorithm: None,
                        world_size: n,
                        count: 61,
                        dtype,
                        op,
                        in_place,
                        seed,
                    });
                }
            }
        }
    }
    check_all(&cases);
}

/// Back-to-back one-shot calls whose values change every call, with one
/// rank that now and then arrives late: a staging half rewritten while a
/// peer still read it would show as a wrong sum.
#[test]
fn back_to_back_calls_with_a_straggler_never_read_a_rewritten_half() {
    for n in [2u32, 3, 5] {
        let results = cpu::run(n, &config(64 << 10), |comm| {
            let r = i64::from(comm.rank());
            let world = i64::from(comm.world_size());
            for call in 0..400i64 {
                if (call + r) % 37 == 0 {
                    std::thread::sleep(Duration::from_micros(300));
                }
                let count = 1 + (call as usize % 5) * 100;
                let mut x = vec![call * 1000 + r; count];
                if call % 2 == 0 {
                    comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
                } else {
                    let input = x.clone();
                    comm.all_reduce(&input, &mut x, ReduceOp::Sum)?;
                }
                let want = call * 1000 * world + world * (world - 1) / 2;
                assert!(
                    x.iter().all(|&v| v == want),
                    "call {call}: {} != {want}",
                    x[0]
                );
            }
            Ok(comm.link_traffic().is_empty())
        });
        for r in results {
            assert!(r.unwrap(), "every call was small enough to go one-shot");
        }
    }
}

/// One-shot and planned calls alternate on one communicator (and a
/// barrier between), every result checked.
#[test]
fn one_shot_and_planned_calls_interleave() {
    let results = cpu::run(3, &config(16 << 10), |comm| {
        let r = comm.rank() as f64;
        for call in 0..60usize {
            let count = if call % 3 == 0 { 50_000 } else { 100 + call };
            let mut x = vec![r + call as f64; count];
            comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
            let want = 3.0 * call as f64 + 3.0;
            assert!(x.iter().all(|&v| v == want), "call {call}");
            if call % 7 == 0 {
                comm.barrier()?;
            }
            let mut b = vec![r; 10];
            comm.broadcast_in_place(&mut b, (call % 3) as u32)?;
            assert!(b.iter().all(|&v| v == (call % 3) as f64));
        }
        Ok(comm.link_traffic().is_empty())
    });
    for r in results {
        assert!(!r.unwrap(), "the 400 KB calls went over links");
    }
}

/// A one-shot call on one rank against a planned one on the other (the
/// counts differ) is a mismatch on both, at once.
#[test]
fn one_shot_against_planned_is_a_mismatch_on_every_rank() {
    let started = std::time::Instant::now();
    let results = cpu::run(2, &config(64 << 10), |comm| {
        let count = if comm.rank() == 0 { 10 } else { 100_000 };
        let mut x = vec![1u8; count];
        comm.all_reduce_in_place(&mut x, ReduceOp::Max)
    });
    assert!(started.elapsed() < Duration::from_secs(10));
    for r in &results {
        assert!(matches!(r, Err(CommError::Mismatch { .. })), "{results:?}");
    }
}

/// A rank that leaves instead of making its one-shot call fails its
/// peers at once with its name, not after the timeout.
#[test]
fn a_rank_that_leaves_fails_its_peers_at_once() {
    let started = std::time::Instant::now();
    let results = cpu::run(3, &config(64 << 10), |comm| {
        if comm.rank() == 2 {
            return Ok(());
        }
        let mut x = vec![1.0f32; 8];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
    });
    assert!(started.elapsed() < Duration::from_secs(10));
    for r in &results[..2] {
        assert!(
            matches!(r, Err(CommError::PeerFailed { rank: 2, .. })),
            "{results:?}"
        );
    }
}

/// After a peer left, a rank whose call failed for it and that calls
/// again gets the same error at once — it never runs a call ahead of a
/// peer still inside the previous one (whose staging it would rewrite).
#[test]
fn calls_after_a_peer_left_keep_failing_and_never_run_ahead() {
    let comms = cpu::group(3, &config(64 << 10)).unwrap();
    let results: Vec<Result<Vec<f32>, CommError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                s.spawn(move || {
                    let mut x = vec![comm.rank() as f32; 64];
                    comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
                    if comm.rank() == 2 {
                        return Ok(x); // leaves: drops its communicator
                    }
                    let mut errors = Vec::new();
                    for _ in 0..3 {
                        let mut y = vec![1.0f32; 64];
                        errors.push(comm.all_reduce_in_place(&mut y, ReduceOp::Sum));
                    }
                    for e in errors {
                        assert!(
                            matches!(e, Err(CommError::PeerFailed { rank: 2, .. })),
                            "{e:?}"
                        );
                    }
                    Ok(x)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        assert!(r.unwrap().iter().all(|&v| v == 3.0));
    }
}

/// A budget past what the settings accept is capped, not allocated.
#[test]
fn an_absurd_budget_is_capped() {
    let results = cpu::run(2, &config(usize::MAX), |comm| {
        let mut x = vec![1u8; 1 << 10];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        let mut big = vec![1u8; 12 << 20];
        comm.all_reduce_in_place(&mut big, ReduceOp::Sum)?;
        Ok(x[0] + big[0])
    });
    for r in results {
        assert_eq!(r.unwrap(), 4);
    }
}
