//! Failure across processes: a rank killed mid-run, a rank that panics or
//! leaves early, an abort, and calls that disagree across ranks. Every
//! survivor must return a typed error, well before the timeout, and
//! nothing may hang. Run over both transports.

mod common;

use std::time::Duration;

use ferrocoll_core::ReduceOp;
use ferrocoll_core::comm::{CommError, Communicator, CommunicatorExt, Planning};
use ferrocoll_process::{ProcessConfig, TransportKind};

/// Long enough that a survivor reporting within a few seconds proves the
/// loss was detected, not timed out.
const TIMEOUT: Duration = Duration::from_secs(30);

fn all_reduce_loop(
    comm: &mut impl Communicator,
    rank: u32,
    count: usize,
    iterations: usize,
) -> Result<(), CommError> {
    let input = vec![1.0f32; count];
    let mut output = vec![0.0f32; count];
    for i in 0..iterations {
        comm.all_reduce(&input, &mut output, ReduceOp::Sum)?;
        if i == 20 {
            println!("rank {rank} reached iteration 20");
        }
    }
    Ok(())
}

/// [`all_reduce_loop`] on buffers in the shared heap, checking each result;
/// large enough that the calls run on the heap's plan (chunks past the
/// slot), checked too.
fn heap_loop(
    comm: &mut ferrocoll_process::ProcessCommunicator,
    rank: u32,
) -> Result<(), CommError> {
    let mut input = comm.shared_buffer::<f32>(1 << 20)?;
    input.fill(1.0);
    let mut output = comm.shared_buffer::<f32>(1 << 20)?;
    let n = comm.world_size() as f32;
    for i in 0.. {
        comm.all_reduce(&input, &mut output, ReduceOp::Sum)?;
        assert!(
            output.iter().all(|&v| v == n),
            "a wrong sum at iteration {i}"
        );
        if i == 20 {
            assert_eq!(comm.heap_plan_calls(), 21, "on the heap's plan");
            println!("rank {rank} reached iteration 20");
        }
    }
    Ok(())
}

#[test]
#[ignore = "one rank of the multi-process tests in this file: they start copies of this binary running it with FERROCOLL_TEST_RANK set; alone it does nothing"]
fn child() {
    let Some(env) = common::child_env() else {
        return;
    };
    let mut comm = common::connect(
        &env,
        ProcessConfig {
            shared_heap_bytes: 16 << 20,
            planning: Planning {
                timeout: TIMEOUT,
                ..ProcessConfig::default().planning
            },
            ..ProcessConfig::default()
        },
    );
    let rank = env.rank;
    let result = match env.scenario.as_str() {
        // Runs until the parent kills rank 2.
        "killed" => all_reduce_loop(&mut comm, rank, 64 << 10, usize::MAX),
        // The same with buffers in the shared heap: peers read the killed
        // rank's values in place until it dies.
        "killed-heap" => heap_loop(&mut comm, rank),
        "panics" if rank == 1 => {
            all_reduce_loop(&mut comm, rank, 1000, 30).unwrap();
            panic!("rank 1 panics on purpose");
        }
        "leaves" if rank == 1 => {
            all_reduce_loop(&mut comm, rank, 1000, 30).unwrap();
            drop(comm);
            println!("rank 1 left");
            return;
        }
        "panics" | "leaves" => all_reduce_loop(&mut comm, rank, 1000, usize::MAX),
        "aborts" if rank == 0 => {
            let handle = comm.abort_handle();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                handle.abort();
            });
            std::thread::sleep(Duration::from_secs(3));
            Err(CommError::PeerFailed {
                rank: 0,
                reason: "aborted on purpose".into(),
            })
        }
        "aborts" => all_reduce_loop(&mut comm, rank, 1000, 1),
        "count" => {
            let count = if rank == 1 { 1001 } else { 1000 };
            all_reduce_loop(&mut comm, rank, count, 1)
        }
        "dtype" if rank == 0 => {
            let mut x = vec![1i32; 1000];
            comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
        }
        "dtype" => all_reduce_loop(&mut comm, rank, 1000, 1),
        "op" => {
            let op = if rank == 3 {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            let mut x = vec![1.0f32; 1000];
            comm.all_reduce_in_place(&mut x, op)
        }
        other => panic!("unknown scenario {other}"),
    };
    match result {
        Ok(()) => println!("rank {rank} finished"),
        Err(e) => {
            println!("rank {rank} error: {e}");
            // A poisoned communicator refuses later calls at once.
            let again = comm.barrier();
            assert!(again.is_err(), "a failed group must stay failed");
            std::process::exit(3);
        }
    }
}

/// Run `scenario` on 4 ranks; returns each rank's end.
fn run(scenario: &str, transport: TransportKind) -> Vec<common::Finished> {
    let env: &[(&str, &str)] = match transport {
        TransportKind::Auto => &TWO_HOSTS,
        _ => &[],
    };
    let ranks = common::spawn_some("child", scenario, &[0, 1, 2, 3], 4, transport, env);
    ranks.finish(Duration::from_secs(60), Vec::new())
}

/// With `TransportKind::Auto`, the four ranks on two emulated hosts,
/// interleaved: every rank has a peer over shared memory and two over TCP.
const TWO_HOSTS: [(&str, &str); 1] = [("FERROCOLL_TEST_HOSTS", "a,b,a,b")];

/// Every kind of link: shared memory, TCP, and both in one group.
const EVERY_KIND: [TransportKind; 3] =
    [TransportKind::Shm, TransportKind::Tcp, TransportKind::Auto];

fn killed_mid_run(transport: TransportKind) {
    killed_mid(transport, "killed");
}

fn killed_mid(transport: TransportKind, scenario: &str) {
    let env: &[(&str, &str)] = match transport {
        TransportKind::Auto => &TWO_HOSTS,
        _ => &[],
    };
    let mut ranks = common::spawn_some("child", scenario, &[0, 1, 2, 3], 4, transport, env);
    let mut log = Vec::new();
    assert!(
        ranks.wait_for_line("reached iteration 20", Duration::from_secs(30), &mut log),
        "the ranks never got going: {log:?}"
    );
    ranks.children[2].kill().unwrap();
    let killed_at = ranks.started.elapsed();
    let finished = ranks.finish(Duration::from_secs(60), log);
    let all = common::show(&finished);
    for f in finished.iter().filter(|f| f.rank != 2) {
        assert_eq!(f.code, Some(3), "survivors exit with an error\n{all}");
        assert!(f.output.contains("error: rank"), "{all}");
        let took = f.at.saturating_sub(killed_at);
        assert!(
            took < Duration::from_secs(10),
            "rank {} took {took:?} to notice (timeout {TIMEOUT:?})\n{all}",
            f.rank
        );
        println!(
            "{transport}: rank {} reported the loss after {took:?}",
            f.rank
        );
    }
    assert!(
        finished.iter().any(|f| f.output.contains("rank 2")),
        "someone names the lost rank\n{all}"
    );
    if transport == TransportKind::Auto {
        // Ranks 1 and 3 are on the other host: they name rank 2's.
        for f in finished.iter().filter(|f| f.rank % 2 == 1) {
            assert!(
                f.output.contains("(on host 0 "),
                "rank {} does not name the host\n{all}",
                f.rank
            );
        }
    }
}

#[test]
fn a_killed_rank_is_an_error_on_every_survivor_over_shm() {
    killed_mid_run(TransportKind::Shm);
}

#[test]
fn a_killed_rank_whose_heap_peers_read_is_an_error_on_every_survivor() {
    killed_mid(TransportKind::Shm, "killed-heap");
}

#[test]
fn a_killed_rank_is_an_error_on_every_survivor_over_tcp() {
    killed_mid_run(TransportKind::Tcp);
}

/// The killed rank's peer on its host sees its process end; those on the
/// other host see its connections close.
#[test]
fn a_killed_rank_is_an_error_on_every_survivor_of_two_hosts() {
    killed_mid_run(TransportKind::Auto);
}

fn survivors_fail_fast(scenario: &str, transport: TransportKind, culprit: u32, says: &str) {
    let finished = run(scenario, transport);
    let all = common::show(&finished);
    for f in finished.iter().filter(|f| f.rank != culprit) {
        assert_eq!(
            f.code,
            Some(3),
            "{scenario}: rank {} must fail\n{all}",
            f.rank
        );
        assert!(
            f.at < Duration::from_secs(15),
            "{scenario}: rank {} waited {:?}\n{all}",
            f.rank,
            f.at
        );
    }
    assert!(
        all.contains(says),
        "{scenario}: nobody said `{says}`\n{all}"
    );
}

#[test]
fn a_panicking_rank_fails_the_group() {
    for t in EVERY_KIND {
        survivors_fail_fast(
            "panics",
            t,
            1,
            "rank 1 failed: panicked: rank 1 panics on purpose",
        );
    }
}

#[test]
fn a_rank_that_leaves_early_fails_the_calls_that_need_it() {
    for t in EVERY_KIND {
        survivors_fail_fast("leaves", t, 1, "left the group");
    }
}

#[test]
fn abort_unblocks_every_rank() {
    for t in EVERY_KIND {
        survivors_fail_fast("aborts", t, 0, "rank 0 failed: aborted");
    }
}

#[test]
fn a_count_dtype_or_op_mismatch_is_a_typed_error_not_a_hang() {
    for t in EVERY_KIND {
        for (scenario, says) in [
            ("count", "count=1001"),
            ("dtype", "type=i32"),
            ("op", "op=max"),
        ] {
            let finished = run(scenario, t);
            let all = common::show(&finished);
            for f in &finished {
                assert_eq!(
                    f.code,
                    Some(3),
                    "{scenario} over {t}: every rank fails\n{all}"
                );
                assert!(
                    f.at < Duration::from_secs(15),
                    "{scenario} over {t}: slow\n{all}"
                );
            }
            assert!(
                all.contains(says) && all.contains("called"),
                "{scenario} over {t}: the mismatch is named\n{all}"
            );
            if let Some(line) = all.lines().find(|l| l.contains("called")) {
                println!("{scenario} over {t}: {line}");
            }
        }
    }
}
