//! The host API a training loop uses, on the threads executor: started
//! calls and their `Work` handles, split into a 2 × 3 grid used along rows
//! and columns at once, gather / scatter / the `-v` collectives against a
//! serial reference, batched point-to-point, and how each fails.

use std::time::Duration;

use ferrocoll_core::ReduceOp;
use ferrocoll_core::comm::{AsyncCommunicator, CommError, Communicator, CommunicatorExt, P2pOp};
use ferrocoll_core::cpu::{self, CpuConfig};

mod async_ranks;

use async_ranks::{config, run_async};

#[test]
fn started_calls_run_in_issue_order_while_the_caller_computes() {
    let results = run_async(4, |mut comm| {
        let r = comm.rank() as f32;
        let sum = comm.iall_reduce(vec![r + 1.0; 1001], ReduceOp::Sum);
        let bcast = comm.ibroadcast(vec![r; 17], 2);
        let gathered = comm.iall_gather_into(vec![r; 3], vec![0.0f32; 12]);
        let max = comm.iall_reduce_into(vec![r as i64; 5], vec![0i64; 5], ReduceOp::Max);
        // The caller's thread is free meanwhile.
        let busy: u64 = (0..100_000u64).sum();
        assert!(busy > 0);
        let mut sum = sum;
        while !sum.is_complete() {
            sum.wait_timeout(Duration::from_millis(1));
        }
        assert!(sum.error().is_none());
        assert_eq!(sum.wait()?, vec![10.0; 1001]);
        assert_eq!(bcast.wait()?, vec![2.0; 17]);
        let (_, all) = gathered.wait()?;
        assert_eq!(all, vec![0., 0., 0., 1., 1., 1., 2., 2., 2., 3., 3., 3.]);
        assert_eq!(max.wait()?.1, vec![3; 5]);
        comm.ibarrier().wait()?;
        // Blocking calls queue behind started ones.
        let pending = comm.iall_reduce(vec![1u32; 4], ReduceOp::Sum);
        let mut x = [1u8; 3];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        assert_eq!(x, [4; 3]);
        assert_eq!(pending.wait()?, vec![4; 4]);
        Ok(())
    });
    for r in results {
        r.unwrap();
    }
}

#[test]
fn a_failed_group_fails_every_outstanding_work_and_returns_the_buffers() {
    let results = run_async(3, |mut comm| {
        if comm.rank() == 2 {
            // Leave without taking part: the others must not hang.
            let mut inner = comm.into_inner();
            inner.abort();
            return Ok(Vec::new());
        }
        let works: Vec<_> = (0..4)
            .map(|i| comm.iall_reduce(vec![i as f32; 64], ReduceOp::Sum))
            .collect();
        let mut errors = Vec::new();
        for work in works {
            let failed = work.wait().expect_err("the group has failed");
            assert_eq!(failed.buffers.as_ref().map(Vec::len), Some(64));
            errors.push(failed.error.to_string());
        }
        Ok(errors)
    });
    for errors in results.into_iter().take(2) {
        let errors = errors.unwrap();
        assert_eq!(errors.len(), 4);
        assert!(errors.iter().all(|e| e.contains("rank 2")), "{errors:?}");
    }
}

#[test]
fn a_call_that_panics_on_one_rank_fails_the_peer_at_once() {
    let started = std::time::Instant::now();
    let results = run_async(2, |mut comm| {
        let work = if comm.rank() == 0 {
            comm.start(vec![0u8; 3], |_, _| panic!("rank 0 panics"))
        } else {
            comm.iall_reduce(vec![1u8; 3], ReduceOp::Sum)
        };
        Ok(work.wait().unwrap_err().error.to_string())
    });
    for r in results {
        assert!(r.unwrap().contains("panic"));
    }
    // Noticed, not timed out (the timeout is 20 s).
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn abort_from_the_caller_fails_pending_work_without_queueing_behind_it() {
    let started = std::time::Instant::now();
    let results = run_async(2, |mut comm| {
        if comm.rank() == 1 {
            // Never calls: rank 0's all-reduce can only end by the abort.
            std::thread::sleep(Duration::from_millis(300));
            return Ok(String::new());
        }
        let mut pending = comm.iall_reduce(vec![1.0f32; 8], ReduceOp::Sum);
        assert!(!pending.wait_timeout(Duration::from_millis(100)));
        comm.abort();
        let failed = pending.wait().unwrap_err();
        assert_eq!(failed.buffers, Some(vec![1.0; 8]));
        let after = comm
            .iall_reduce(vec![1.0f32; 8], ReduceOp::Sum)
            .wait()
            .unwrap_err();
        Ok(format!("{} / {}", failed.error, after.error))
    });
    let msg = results.into_iter().next().unwrap().unwrap();
    assert!(msg.contains("aborted"), "{msg}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_panicking_call_fails_the_calls_after_it_and_keeps_the_buffers() {
    let results = run_async(2, |mut comm| {
        let boom = comm.start(vec![7u8; 3], |_, _| panic!("boom"));
        let after = comm.iall_reduce(vec![1.0f64; 2], ReduceOp::Sum);
        let boom = boom.wait().expect_err("it panicked");
        assert!(boom.error.to_string().contains("boom"), "{}", boom.error);
        assert_eq!(boom.buffers, Some(vec![7u8; 3]));
        let after = after.wait().expect_err("queued behind a panic");
        Ok(after.error.to_string())
    });
    for r in results {
        assert!(r.unwrap().contains("boom"));
    }
}

#[test]
fn a_2_by_3_grid_reduces_along_rows_and_columns_at_the_same_time() {
    // Rank r sits at row r / 3 (data parallel) and column r % 3 (tensor
    // parallel); keys reverse the order inside rows.
    let results = cpu::run(6, &config(), |comm| {
        let (row, col) = (comm.rank() / 3, comm.rank() % 3);
        let row_comm = comm.split(Some(row), 10 - col)?.expect("has a color");
        let col_comm = comm.split(Some(100 + col), row)?.expect("has a color");
        assert!(comm.split(None, 0)?.is_none());
        assert_eq!((row_comm.world_size(), row_comm.rank()), (3, 2 - col));
        assert_eq!((col_comm.world_size(), col_comm.rank()), (2, row));
        let mut rows = AsyncCommunicator::new(row_comm)?;
        let mut cols = AsyncCommunicator::new(col_comm)?;
        let r = comm.rank() as u64;
        let along_row = rows.iall_reduce(vec![r; 4099], ReduceOp::Sum);
        let along_col = cols.iall_reduce(vec![r; 4099], ReduceOp::Sum);
        // The parent stays usable alongside its children.
        let mut all = [r];
        comm.all_reduce_in_place(&mut all, ReduceOp::Sum)?;
        let row_sum = along_row.wait()?[4098];
        let col_sum = along_col.wait()?[4098];
        Ok((row_sum, col_sum, all[0]))
    });
    for (rank, r) in results.into_iter().enumerate() {
        let (row, col) = (rank as u64 / 3, rank as u64 % 3);
        let (row_sum, col_sum, all) = r.unwrap();
        assert_eq!(row_sum, 3 * row * 3 + 3, "rank {rank}");
        assert_eq!(col_sum, col + (col + 3), "rank {rank}");
        assert_eq!(all, 15);
    }
}

#[test]
fn split_through_a_trait_object_gives_a_working_group() {
    let results = cpu::run(4, &config(), |comm| {
        let backend: &mut dyn Communicator = comm;
        let color = backend.rank() % 2;
        let mut half = backend.split(Some(color), 0)?.unwrap();
        let mut x = vec![backend.rank() as i32; 5];
        half.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        Ok(x[0])
    });
    let got: Vec<i32> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(got, vec![2, 4, 2, 4]);
}

/// A value of rank `r`, element `i`, exact in every dtype used here.
fn v(r: usize, i: usize) -> i32 {
    (r * 1000 + i) as i32 % 120
}

#[test]
fn gather_and_scatter_match_the_serial_reference() {
    for n in 1..=5u32 {
        for len in [0usize, 1, 7, 300] {
            for root in [0, n - 1] {
                let results = cpu::run(n, &config(), |comm| {
                    let r = comm.rank() as usize;
                    let mine: Vec<i32> = (0..len).map(|i| v(r, i)).collect();
                    let mut gathered = if r == root as usize {
                        vec![-1; len * n as usize]
                    } else {
                        Vec::new()
                    };
                    comm.gather(&mine, &mut gathered, root)?;
                    let mut back = vec![-1; len];
                    comm.scatter(&gathered, &mut back, root)?;
                    Ok((gathered, back, mine))
                });
                for (r, res) in results.into_iter().enumerate() {
                    let (gathered, back, mine) = res.unwrap();
                    if r == root as usize {
                        let want: Vec<i32> = (0..n as usize)
                            .flat_map(|k| (0..len).map(move |i| v(k, i)))
                            .collect();
                        assert_eq!(gathered, want, "n={n} len={len} root={root}");
                    }
                    assert_eq!(back, mine, "n={n} len={len} root={root} rank={r}");
                }
            }
        }
    }
}

#[test]
fn uneven_collectives_match_the_serial_reference() {
    for n in 1..=6u32 {
        let results = cpu::run(n, &config(), |comm| {
            let (r, n) = (comm.rank() as usize, comm.world_size() as usize);
            // Uneven, with zeros: rank k contributes (k * 3) % 5 elements.
            let counts: Vec<usize> = (0..n).map(|k| (k * 3) % 5).collect();
            let mine: Vec<f64> = (0..counts[r]).map(|i| v(r, i) as f64).collect();
            let mut all = vec![0.0f64; counts.iter().sum()];
            comm.all_gather_v(&mine, &mut all, &counts)?;
            // Rank i sends (i + j) % 4 elements to rank j.
            let sends: Vec<usize> = (0..n).map(|j| (r + j) % 4).collect();
            let recvs: Vec<usize> = (0..n).map(|i| (i + r) % 4).collect();
            let input: Vec<u32> = sends
                .iter()
                .enumerate()
                .flat_map(|(j, &c)| (0..c).map(move |i| (r * 100 + j * 10 + i) as u32))
                .collect();
            let mut output = vec![0u32; recvs.iter().sum()];
            comm.all_to_all_v(&input, &sends, &mut output, &recvs)?;
            Ok((all, output))
        });
        for (r, res) in results.into_iter().enumerate() {
            let (all, output) = res.unwrap();
            let want: Vec<f64> = (0..n as usize)
                .flat_map(|k| (0..(k * 3) % 5).map(move |i| v(k, i) as f64))
                .collect();
            assert_eq!(all, want, "n={n} rank={r}");
            let want: Vec<u32> = (0..n as usize)
                .flat_map(|i| (0..(i + r) % 4).map(move |e| (i * 100 + r * 10 + e) as u32))
                .collect();
            assert_eq!(output, want, "n={n} rank={r}");
        }
    }
}

#[test]
fn disagreeing_uneven_calls_fail_on_every_rank_and_leave_the_group_usable() {
    let results = cpu::run(3, &config(), |comm| {
        let r = comm.rank();
        // Rank 1 names another root.
        let root = if r == 1 { 1 } else { 0 };
        let mut out = vec![0i32; if r == root { 6 } else { 0 }];
        let gather = comm.gather(&[r as i32; 2], &mut out, root).unwrap_err();
        // Rank 2 expects one element too many from rank 0.
        let sends = vec![1usize; 3];
        let mut recvs = vec![1usize; 3];
        if r == 2 {
            recvs[0] = 2;
        }
        let mut output = vec![0i32; recvs.iter().sum()];
        let a2a = comm
            .all_to_all_v(&[r as i32; 3], &sends, &mut output, &recvs)
            .unwrap_err();
        // Counts lists that differ between ranks.
        let counts = if r == 0 { vec![1, 1, 1] } else { vec![1, 2, 0] };
        let mut all = vec![0i32; counts.iter().sum()];
        let input = vec![0i32; counts[r as usize]];
        let agv = comm.all_gather_v(&input, &mut all, &counts).unwrap_err();
        // Nothing moved and nobody gave up: the group still works.
        let mut x = [1i32];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        Ok((gather, a2a, agv, x[0]))
    });
    for res in results {
        let (gather, a2a, agv, x) = res.unwrap();
        for e in [&gather, &a2a, &agv] {
            assert!(matches!(e, CommError::Disagreement { .. }), "{e}");
        }
        assert!(gather.to_string().contains("root"), "{gather}");
        assert!(
            a2a.to_string().contains("rank 0") || a2a.to_string().contains("rank 2"),
            "{a2a}"
        );
        assert_eq!(x, 3);
    }
}

#[test]
fn bad_arguments_on_one_rank_fail_the_call_on_every_rank() {
    let results = cpu::run(3, &config(), |comm| {
        let r = comm.rank();
        // Rank 0, the root, passes an output one block short.
        let mut out = vec![0i32; if r == 0 { 4 } else { 0 }];
        let gather = comm.gather(&[1i32, 2], &mut out, 0).unwrap_err();
        // Rank 2 passes too few counts.
        let counts: Vec<usize> = if r == 2 { vec![1, 1] } else { vec![1, 1, 1] };
        let mut all = vec![0u8; 3];
        let agv = comm
            .all_gather_v(&[r as u8], &mut all, &counts)
            .unwrap_err();
        // Rank 1 names a root that does not exist.
        let root = if r == 1 { 7 } else { 0 };
        let mut back = [0i32; 2];
        let scatter = comm.scatter(&[0i32; 6], &mut back, root).unwrap_err();
        // Rank 0's input is longer than its send counts say.
        let input = vec![0i64; if r == 0 { 4 } else { 3 }];
        let mut output = vec![0i64; 3];
        let a2a = comm
            .all_to_all_v(&input, &[1, 1, 1], &mut output, &[1, 1, 1])
            .unwrap_err();
        let mut x = [1i32];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        Ok((r, [gather, agv, scatter, a2a], x[0]))
    });
    for res in results {
        let (r, errors, x) = res.unwrap();
        let culprits = [0, 2, 1, 0];
        for (e, culprit) in errors.iter().zip(culprits) {
            if r == culprit {
                assert!(
                    matches!(
                        e,
                        CommError::BufferSize { .. } | CommError::RankOutOfRange { .. }
                    ),
                    "{e}"
                );
            } else {
                assert!(
                    matches!(e, CommError::Disagreement { other, .. } if *other == culprit),
                    "{e}"
                );
                assert!(e.to_string().contains("invalid arguments"), "{e}");
            }
        }
        assert_eq!(x, 3);
    }
}

#[test]
fn batched_exchanges_in_both_directions_cannot_deadlock() {
    for n in 1..=5u32 {
        let results = run_async(n, |mut comm| {
            let (r, n) = (comm.rank(), comm.world_size());
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            if n == 1 {
                return Ok(vec![]);
            }
            // Every rank sends both ways first: a blocking send-first
            // program would deadlock here.
            let work = comm.batch_isend_irecv(
                vec![(vec![r; 3], next), (vec![r + 100; 2], prev)],
                vec![(vec![0u32; 3], prev), (vec![0u32; 2], next)],
            );
            let (_, recvs) = work.wait()?;
            Ok(recvs.into_iter().flat_map(|(b, _)| b).collect())
        });
        for (r, res) in results.into_iter().enumerate() {
            if n == 1 {
                continue;
            }
            let (next, prev) = ((r as u32 + 1) % n, (r as u32 + n - 1) % n);
            assert_eq!(
                res.unwrap(),
                vec![prev, prev, prev, next + 100, next + 100],
                "n={n}"
            );
        }
    }
}

#[test]
fn isend_and_irecv_pair_up_and_bad_peers_are_typed_errors() {
    let results = run_async(2, |mut comm| {
        let peer = 1 - comm.rank();
        let self_send = comm.isend(vec![1i8; 2], comm.rank()).wait().unwrap_err();
        assert!(
            matches!(self_send.error, CommError::SelfPeer { .. }),
            "{}",
            self_send.error
        );
        let out_of_range = comm.irecv(vec![0i8; 2], 9).wait().unwrap_err();
        assert!(matches!(
            out_of_range.error,
            CommError::RankOutOfRange { .. }
        ));
        let got = if comm.rank() == 0 {
            comm.isend(vec![5i8; 4], peer).wait()?;
            comm.irecv(vec![0i8; 4], peer).wait()?
        } else {
            let got = comm.irecv(vec![0i8; 4], peer).wait()?;
            comm.isend(vec![6i8; 4], peer).wait()?;
            got
        };
        let mut x = vec![0i8; 2];
        comm.send_recv_batch(vec![
            P2pOp::recv(&mut x, peer),
            P2pOp::send(&[3i8, 4], peer),
        ])?;
        Ok((got, x))
    });
    let got: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(got[0], (vec![6; 4], vec![3, 4]));
    assert_eq!(got[1], (vec![5; 4], vec![3, 4]));
}

#[test]
fn a_backend_chosen_at_run_time_runs_behind_a_progress_thread() {
    let comms = cpu::group(2, &config()).unwrap();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let boxed: Box<dyn Communicator + Send> = Box::new(c);
                    let mut comm = AsyncCommunicator::new(boxed)?;
                    let mut sub = comm.split(Some(0), 1)?.unwrap();
                    sub.barrier()?;
                    comm.iall_reduce(vec![2i32; 3], ReduceOp::Prod)
                        .wait()
                        .map_err(CommError::from)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        assert_eq!(r.unwrap(), vec![4, 4, 4]);
    }
}

/// `cpu::run` pins each rank to a CPU of its own when there are enough,
/// and leaves the threads alone when told not to or when there are not.
#[cfg(target_os = "linux")]
#[test]
fn run_pins_ranks_to_distinct_cpus_when_there_are_enough() {
    fn my_cpus() -> usize {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("Cpus_allowed_list:"))
            .unwrap();
        line.split(':')
            .nth(1)
            .unwrap()
            .trim()
            .split(',')
            .map(|r| {
                let mut ends = r.split('-').map(|x| x.trim().parse::<usize>().unwrap());
                let a = ends.next().unwrap();
                ends.next().map_or(1, |b| b - a + 1)
            })
            .sum()
    }
    let available = my_cpus();
    let pinned = cpu::run(available as u32, &config(), |_| Ok(my_cpus()));
    assert!(
        pinned.into_iter().all(|c| c.unwrap() == 1),
        "each rank on one CPU"
    );
    let free = cpu::run(
        2,
        &CpuConfig {
            pin_ranks: false,
            ..config()
        },
        |_| Ok(my_cpus()),
    );
    assert!(free.into_iter().all(|c| c.unwrap() == available));
    let too_many = cpu::run(available as u32 + 1, &config(), |_| Ok(my_cpus()));
    assert!(
        too_many.into_iter().all(|c| c.unwrap() == available),
        "not enough CPUs: no pinning"
    );
}
