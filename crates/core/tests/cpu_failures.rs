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

/// Memory of its own mapping, which a test can fence off: any touch
/// after [`Fenced::fence`] faults.
#[cfg(target_os = "linux")]
struct Fenced {
    at: *mut f32,
    len: usize,
}

#[cfg(target_os = "linux")]
impl Fenced {
    fn new(len: usize, value: f32) -> Fenced {
        let bytes = len * 4;
        // SAFETY: an anonymous private mapping of our own, checked below.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED, "mmap");
        let mut f = Fenced { at: at.cast(), len };
        f.as_mut().fill(value);
        f
    }

    fn as_ref(&self) -> &[f32] {
        // SAFETY: the mapping holds `len` f32s and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.at, self.len) }
    }

    fn as_mut(&mut self) -> &mut [f32] {
        // SAFETY: as above, borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.at, self.len) }
    }

    /// From now on, a read or write of the mapping faults.
    fn fence(&self) {
        // SAFETY: our own mapping; nothing of ours touches it afterwards.
        let rc = unsafe { libc::mprotect(self.at.cast(), self.len * 4, libc::PROT_NONE) };
        assert_eq!(rc, 0, "mprotect");
    }
}

#[cfg(target_os = "linux")]
impl Drop for Fenced {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping `new` made.
        unsafe { libc::munmap(self.at.cast(), self.len * 4) };
    }
}

// SAFETY: plain memory, used by one thread at a time.
#[cfg(target_os = "linux")]
unsafe impl Send for Fenced {}

/// Ranks read peers' buffers in place and write into peers' outputs. A
/// group aborted mid-walk must leave no rank inside another's buffers once
/// that rank's call returned: here each rank fences its buffers off the
/// moment its call fails, so a peer still reading or writing them faults
/// (and the test with it). A rank whose call succeeds must hold the exact
/// sum. With `give_up`'s wait for the movement lock taken out, this test
/// died of SIGSEGV in 3 of 4 runs on a 2-core host; with it, 5 of 5 passed.
#[cfg(target_os = "linux")]
#[test]
fn an_abort_mid_walk_leaves_no_rank_inside_buffers_their_owners_took_back() {
    // 16 MiB per buffer, moved in 4 MiB steps: a step takes longer than a
    // waiting rank takes to see the abort.
    let len = 4 << 20;
    // Two ranks run side by side on two cores: one sees the abort within
    // microseconds while the other is inside a step on its buffers.
    for (ranks, algorithm) in [2, 4]
        .into_iter()
        .flat_map(|n| Algorithm::ALL.map(|a| (n, a)))
    {
        for (trial, delay_us) in [0u64, 100, 200, 300, 500, 700, 1_000, 2_000, 3_000, 10_000]
            .into_iter()
            .enumerate()
        {
            let cfg = CpuConfig {
                planning: Planning {
                    algorithm: Some(algorithm),
                    max_chunk_bytes: Some(4 << 20),
                    ..config(20_000).planning
                },
                ..config(20_000)
            };
            let comms = cpu::group(ranks, &cfg).unwrap();
            let handle = comms[0].abort_handle();
            let in_place = trial % 2 == 1;
            // The abort's clock starts once every rank placed its buffers.
            let placed = &std::sync::Barrier::new(ranks as usize + 1);
            std::thread::scope(|s| {
                s.spawn(move || {
                    placed.wait();
                    std::thread::sleep(Duration::from_micros(delay_us));
                    handle.abort();
                });
                for mut comm in comms {
                    s.spawn(move || {
                        let rank = comm.rank() as f32;
                        // Placed once: the trial's time goes to calls.
                        let mut output = Fenced::new(len, 0.0);
                        let input = Fenced::new(len, rank + 1.0);
                        placed.wait();
                        loop {
                            let result = if in_place {
                                output.as_mut().fill(rank + 1.0);
                                comm.all_reduce_in_place(output.as_mut(), ReduceOp::Sum)
                            } else {
                                comm.all_reduce(input.as_ref(), output.as_mut(), ReduceOp::Sum)
                            };
                            if result.is_err() {
                                input.fence();
                                output.fence();
                                // Time for a stray peer to fault.
                                std::thread::sleep(Duration::from_millis(20));
                                return;
                            }
                            let sum = (ranks * (ranks + 1) / 2) as f32;
                            assert!(
                                output.as_ref().iter().all(|&x| x == sum),
                                "{algorithm}: a completed call with a wrong sum"
                            );
                        }
                    });
                }
            });
        }
    }
}
