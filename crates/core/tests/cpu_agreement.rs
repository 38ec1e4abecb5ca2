//! Agreement before data on threads: every case here once ended in a
//! timeout, a silent success or reinterpreted bits (issue 14, class 5).

use std::time::{Duration, Instant};

use ferrocoll_core::comm::{CommError, Communicator, CommunicatorExt, Planning};
use ferrocoll_core::cpu::{self, CpuConfig};
use ferrocoll_core::{Algorithm, ReduceOp};

/// A long timeout: every test must end far sooner, by detection.
fn config() -> CpuConfig {
    CpuConfig {
        planning: Planning {
            timeout: Duration::from_secs(30),
            ..CpuConfig::builtin().planning
        },
        ..CpuConfig::builtin()
    }
}

fn quick(started: Instant) {
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}: waited for the timeout instead of detecting",
        started.elapsed()
    );
}

fn every_rank_mismatched<T: std::fmt::Debug>(results: &[Result<T, CommError>]) {
    for (r, res) in results.iter().enumerate() {
        assert!(
            matches!(res, Err(CommError::Mismatch { .. })),
            "rank {r}: {res:?}"
        );
    }
}

#[test]
fn a_rank_that_returns_early_is_reported_as_left_at_once() {
    let started = Instant::now();
    let results = cpu::run(3, &config(), |comm| {
        let mut x = vec![1.0f32; 64];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        if comm.rank() == 1 {
            return Ok(());
        }
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
    });
    quick(started);
    assert!(results[1].is_ok());
    for r in [0, 2] {
        match &results[r] {
            Err(CommError::PeerFailed { rank: 1, reason }) => {
                assert!(reason.contains("left the group"), "{reason}")
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn a_dropped_communicator_is_reported_as_left_at_once() {
    let mut comms = cpu::group(3, &config()).unwrap();
    drop(comms.pop());
    let started = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter_mut()
            .map(|c| s.spawn(move || c.barrier()))
            .collect();
        for h in handles {
            match h.join().unwrap() {
                Err(CommError::PeerFailed { rank: 2, reason }) => {
                    assert!(reason.contains("left the group"), "{reason}")
                }
                other => panic!("{other:?}"),
            }
        }
    });
    quick(started);
}

#[test]
fn a_barrier_against_a_collective_is_a_mismatch_on_every_rank() {
    let started = Instant::now();
    let results = cpu::run(3, &config(), |comm| {
        if comm.rank() == 0 {
            comm.barrier()
        } else {
            let mut x = vec![1u8; 8];
            comm.all_reduce_in_place(&mut x, ReduceOp::Max)
        }
    });
    quick(started);
    every_rank_mismatched(&results);
}

#[test]
fn broadcasts_from_different_roots_are_a_mismatch_on_every_rank_and_write_nothing() {
    let started = Instant::now();
    let results = cpu::run(4, &config(), |comm| {
        let root = u32::from(comm.rank() == 3);
        let input = vec![comm.rank() as f32; 100];
        let mut output = vec![-1.0f32; 100];
        let res = comm.broadcast(&input, &mut output, root);
        assert!(output.iter().all(|&x| x == -1.0), "data moved");
        res
    });
    quick(started);
    every_rank_mismatched(&results);
}

#[test]
fn a_recv_of_another_type_with_the_same_bytes_is_a_mismatch_not_reinterpreted_bits() {
    let started = Instant::now();
    let results = cpu::run(2, &config(), |comm| {
        if comm.rank() == 0 {
            comm.send(&[1.5f32; 4], 1).map(|()| Vec::new())
        } else {
            let mut got = [0i32; 4];
            comm.recv(&mut got, 0).map(|()| got.to_vec())
        }
    });
    quick(started);
    match &results[1] {
        Err(CommError::Mismatch {
            expected,
            got: mine,
            ..
        }) => {
            assert!(
                expected.contains("f32") || expected.contains("float"),
                "{expected}"
            );
            assert!(mine.contains("i32") || mine.contains("int32"), "{mine}");
        }
        other => panic!("rank 1: {other:?}"),
    }
    assert!(results[0].is_err(), "the send cannot have completed");
}

#[test]
fn a_timeout_names_the_ranks_that_never_arrived() {
    let cfg = CpuConfig {
        planning: Planning {
            timeout: Duration::from_millis(300),
            ..CpuConfig::builtin().planning
        },
        ..CpuConfig::builtin()
    };
    let results = cpu::run(4, &cfg, |comm| {
        if comm.rank() >= 2 {
            // Alive, but busy elsewhere for longer than the timeout.
            std::thread::sleep(Duration::from_millis(1200));
            return Ok(());
        }
        let mut x = vec![0.0f64; 8];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
    });
    match &results[0] {
        Err(CommError::Timeout { what, .. }) => {
            assert!(what.contains("[2, 3]"), "{what}")
        }
        // Rank 1 may have timed out first and failed the group.
        Err(CommError::PeerFailed { reason, .. }) => {
            assert!(reason.contains("[2, 3]"), "{reason}")
        }
        other => panic!("rank 0: {other:?}"),
    }
}

#[test]
fn a_forced_algorithm_that_cannot_run_a_collective_falls_back_instead_of_failing() {
    let cfg = CpuConfig {
        planning: Planning {
            algorithm: Some(Algorithm::Tree),
            ..config().planning
        },
        ..config()
    };
    let results = cpu::run(3, &cfg, |comm| {
        let input = vec![comm.rank() as i32; 5];
        let mut output = vec![0i32; 15];
        comm.all_gather(&input, &mut output)?;
        let mut x = vec![1i32; 5];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        Ok((output, x))
    });
    for res in results {
        let (gathered, summed) = res.unwrap();
        assert_eq!(gathered, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2]);
        assert_eq!(summed, [3; 5]);
    }
}

#[test]
fn nan_propagates_through_min_and_max_whatever_the_order() {
    for op in [ReduceOp::Min, ReduceOp::Max] {
        for nan_rank in 0..3u32 {
            let results = cpu::run(3, &config(), |comm| {
                let mut x = vec![comm.rank() as f32 + 1.0; 4];
                let mut h = vec![half::f16::from_f32(comm.rank() as f32); 4];
                if comm.rank() == nan_rank {
                    x[1] = f32::NAN;
                    h[2] = half::f16::NAN;
                }
                comm.all_reduce_in_place(&mut x, op)?;
                comm.all_reduce_in_place(&mut h, op)?;
                Ok((x, h))
            });
            for res in results {
                let (x, h) = res.unwrap();
                assert!(
                    x[1].is_nan() && !x[0].is_nan(),
                    "{op} NaN at rank {nan_rank}: {x:?}"
                );
                assert!(
                    h[2].is_nan() && !h[0].is_nan(),
                    "{op} f16 at {nan_rank}: {h:?}"
                );
            }
        }
    }
}

#[test]
fn a_gathers_descriptions_against_a_plain_all_gather_of_their_shape_is_a_mismatch() {
    // A gather first all-gathers five words per rank describing itself.
    // Before: a peer's plain all-gather of five u64 matched it and
    // returned Ok with the descriptions as its data.
    let started = Instant::now();
    let results = cpu::run(3, &config(), |comm| {
        if comm.rank() == 1 {
            let mut out = [0u64; 15];
            comm.all_gather(&[7u64; 5], &mut out)
        } else {
            let mut out = vec![0u32; if comm.rank() == 0 { 12 } else { 0 }];
            comm.gather(&[1u32; 4], &mut out, 0)
        }
    });
    quick(started);
    every_rank_mismatched(&results);
}

#[test]
fn a_splits_exchange_against_a_plain_all_gather_of_its_shape_is_a_mismatch() {
    // Before: the plain all-gather returned Ok with colors and keys, and
    // the splitting ranks read its data as rank 1's color and key.
    let started = Instant::now();
    let results = cpu::run(3, &config(), |comm| {
        if comm.rank() == 1 {
            let mut out = [0u64; 6];
            comm.all_gather(&[1u64, 0], &mut out)
        } else {
            comm.split(Some(0), comm.rank()).map(|_| ())
        }
    });
    quick(started);
    every_rank_mismatched(&results);
}
