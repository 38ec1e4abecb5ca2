//! Failure semantics of the CPU executor: nobody hangs.

use std::time::{Duration, Instant};

use ferrocoll_core::comm::{CommError, Communicator, CommunicatorExt, Planning};
use ferrocoll_core::cpu::{self, CpuConfig};
use ferrocoll_core::{Algorithm, ReduceOp};

fn config(timeout_ms: u64) -> CpuConfig {
    CpuConfig {
        planning: Planning {
            timeout: Duration::from_millis(timeout_ms),
            max_chunk_bytes: Some(256),
            ..CpuConfig::default().planning
        },
        ..CpuConfig::default()
    }
}

#[test]
fn a_rank_that_panics_mid_collective_fails_every_other_rank() {
    for algorithm in Algorithm::ALL {
        let started = Instant::now();
        let cfg = CpuConfig {
            planning: Planning {
                algorithm: Some(algorithm),
                ..config(10_000).planning
            },
            ..config(10_000)
        };
        let results = cpu::run(4, &cfg, |comm| {
            let input = vec![1.0f32; 10_000];
            let mut output = vec![0.0f32; 10_000];
            comm.all_reduce(&input, &mut output, ReduceOp::Sum)?;
            if comm.rank() == 2 {
                panic!("rank 2 gives up");
            }
            comm.all_reduce(&input, &mut output, ReduceOp::Sum)?;
            Ok(())
        });
        // Others fail as soon as the panic is seen, long before the timeout.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{algorithm}: took {:?}",
            started.elapsed()
        );
        for (r, res) in results.iter().enumerate() {
            match res {
                Err(CommError::PeerFailed { rank: 2, reason }) => {
                    assert!(reason.contains("panicked"), "{reason}")
                }
                other => panic!("{algorithm}: rank {r} returned {other:?}"),
            }
        }
    }
}

#[test]
fn a_rank_that_never_arrives_times_out_instead_of_hanging() {
    let started = Instant::now();
    let results = cpu::run(3, &config(200), |comm| {
        if comm.rank() == 0 {
            // Rank 0 skips the collective but stays alive (no error, no panic).
            std::thread::sleep(Duration::from_millis(600));
            return Ok(());
        }
        let mut buf = vec![1u64; 1000];
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
    });
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(results[0].is_ok());
    let timed_out = results[1..]
        .iter()
        .filter(|r| matches!(r, Err(CommError::Timeout { .. })))
        .count();
    assert!(timed_out >= 1, "{results:?}");
    assert!(results[1..].iter().all(Result::is_err), "{results:?}");
}

#[test]
fn mismatched_counts_are_reported_not_hung() {
    let results = cpu::run(3, &config(5_000), |comm| {
        let len = if comm.rank() == 1 { 11 } else { 10 };
        let mut buf = vec![1i32; len];
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
    });
    assert!(results.iter().all(Result::is_err), "{results:?}");
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(CommError::Mismatch { .. }))),
        "{results:?}"
    );
    let text = format!("{results:?}");
    assert!(
        text.contains("count=11") && text.contains("count=10"),
        "{text}"
    );
}

#[test]
fn bad_roots_and_buffer_sizes_are_typed_errors() {
    let results = cpu::run(2, &config(5_000), |comm| {
        let mut buf = vec![0u8; 4];
        let e = comm.broadcast_in_place(&mut buf, 7).unwrap_err();
        assert!(matches!(
            e,
            CommError::RankOutOfRange {
                rank: 7,
                world_size: 2
            }
        ));
        let e = comm
            .reduce_in_place(&mut buf, ReduceOp::Sum, 2)
            .unwrap_err();
        assert!(
            matches!(e, CommError::RankOutOfRange { rank: 2, .. }),
            "{e}"
        );
        let e = comm.send(&buf, 9).unwrap_err();
        assert!(
            matches!(e, CommError::RankOutOfRange { rank: 9, .. }),
            "{e}"
        );
        let input = vec![0u8; 4];
        let mut small = vec![0u8; 3];
        let e = comm.all_gather(&input, &mut small).unwrap_err();
        assert!(matches!(e, CommError::BufferSize { needed: 8, .. }), "{e}");
        let e = comm
            .all_reduce(&input, &mut small, ReduceOp::Sum)
            .unwrap_err();
        assert!(matches!(e, CommError::BufferSize { needed: 4, .. }), "{e}");
        let e = comm
            .reduce_scatter(&input, &mut small, ReduceOp::Sum)
            .unwrap_err();
        assert!(matches!(e, CommError::BufferSize { .. }), "{e}");
        let odd = vec![0u8; 5];
        let mut out = vec![0u8; 5];
        let e = comm.all_to_all(&odd, &mut out).unwrap_err();
        assert!(matches!(e, CommError::BufferSize { .. }), "{e}");
        // The group is still usable after errors caught before anything moved.
        comm.barrier()?;
        Ok(())
    });
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

#[test]
fn sending_to_yourself_is_refused_at_once() {
    let started = Instant::now();
    let results = cpu::run(2, &config(10_000), |comm| {
        let me = comm.rank();
        let e = comm.send(&[1u32], me).unwrap_err();
        assert!(matches!(e, CommError::SelfPeer { .. }), "{e}");
        Ok(())
    });
    assert!(results.iter().all(Result::is_ok));
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn send_recv_and_barrier_work() {
    let results = cpu::run(3, &config(5_000), |comm| {
        let n = comm.world_size();
        let me = comm.rank();
        let data = vec![me; 5];
        let mut got = vec![0u32; 5];
        if me == 0 {
            comm.send(&data, 1)?;
            comm.recv(&mut got, n - 1)?;
        } else {
            comm.recv(&mut got, me - 1)?;
            comm.send(&data, (me + 1) % n)?;
        }
        comm.barrier()?;
        Ok(got[0])
    });
    let got: Vec<u32> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(got, vec![2, 0, 1]);
}

#[test]
fn abort_from_a_watchdog_unblocks_every_rank_and_poisons_the_group() {
    // Rank 3 never calls; the others block in an all-reduce with a long
    // timeout; a watchdog aborts after 100 ms and everyone returns at once.
    let comms = cpu::group(4, &config(60_000)).unwrap();
    let handle = comms[0].abort_handle();
    let started = Instant::now();
    let results: Vec<Result<(), CommError>> = std::thread::scope(|s| {
        let watchdog = s.spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            handle.abort();
        });
        let joins: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                s.spawn(move || {
                    if comm.rank() == 3 {
                        // Wait to be aborted, then find the group poisoned.
                        std::thread::sleep(Duration::from_millis(300));
                        let mut x = vec![1.0f32; 8];
                        return comm.all_reduce_in_place(&mut x, ReduceOp::Sum);
                    }
                    let input = vec![1.0f32; 1000];
                    let mut output = vec![0.0f32; 1000];
                    comm.all_reduce(&input, &mut output, ReduceOp::Sum)
                })
            })
            .collect();
        watchdog.join().unwrap();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    for r in &results {
        match r {
            Err(CommError::PeerFailed { rank: 0, reason }) => assert_eq!(reason, "aborted"),
            other => panic!("expected an abort error, got {other:?}"),
        }
    }
}

#[test]
fn mismatched_types_and_ops_are_reported_not_hung() {
    // Rank 2 all-reduces f64 where the others use f32.
    let results = cpu::run(3, &config(5_000), |comm| {
        if comm.rank() == 2 {
            let mut buf = vec![1f64; 10];
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        } else {
            let mut buf = vec![1f32; 10];
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        }
    });
    assert!(results.iter().all(Result::is_err), "{results:?}");
    let text = format!("{results:?}");
    assert!(
        text.contains("type=f64") && text.contains("type=f32"),
        "{text}"
    );
    // Rank 0 takes the max where the others sum.
    let results = cpu::run(3, &config(5_000), |comm| {
        let op = if comm.rank() == 0 {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        let mut buf = vec![1i32; 10];
        comm.all_reduce_in_place(&mut buf, op)
    });
    assert!(results.iter().all(Result::is_err), "{results:?}");
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(CommError::Mismatch { .. }))),
        "{results:?}"
    );
}

#[test]
fn a_group_of_no_ranks_is_a_typed_error() {
    assert!(matches!(
        cpu::group(0, &config(1_000)),
        Err(CommError::EmptyGroup)
    ));
    let results = cpu::run(0, &config(1_000), |_| Ok(()));
    assert!(matches!(results.as_slice(), [Err(CommError::EmptyGroup)]));
}

#[test]
fn a_recv_buffer_of_the_wrong_size_is_named_on_both_sides() {
    let started = Instant::now();
    let results = cpu::run(2, &config(10_000), |comm| {
        if comm.rank() == 0 {
            comm.send(&[1u32; 10], 1)
        } else {
            let mut small = [0u32; 9];
            comm.recv(&mut small, 0)
        }
    });
    let receiver = results[1].as_ref().unwrap_err();
    assert!(
        matches!(
            receiver,
            CommError::BufferSize {
                what: "recv buffer",
                got: 9,
                needed: 10
            }
        ),
        "{receiver}"
    );
    assert!(results[0].is_err(), "the sender must not wait forever");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn overlapping_raw_buffers_are_refused() {
    use ferrocoll_core::comm::check_disjoint;
    assert!(check_disjoint(0x1000, 64, 0x1040, 64).is_ok());
    assert!(check_disjoint(0x1040, 64, 0x1000, 64).is_ok());
    assert!(check_disjoint(0x1000, 0, 0x1000, 64).is_ok());
    let e = check_disjoint(0x1000, 65, 0x1040, 64).unwrap_err();
    assert!(matches!(e, CommError::Overlap { .. }), "{e}");
    assert!(e.to_string().contains("in place"), "{e}");
    // Ranges that run past the top of the address space still compare.
    assert!(check_disjoint(u64::MAX - 4, 64, u64::MAX - 8, 8).is_err());
    assert!(check_disjoint(u64::MAX - 4, 64, u64::MAX - 8, 4).is_ok());
}
