//! Agreement before data across processes: ranks that disagree on a call
//! all report `Mismatch` at once and nothing is written — over both
//! transports. Before, broadcasts from different roots returned `Ok` with
//! different data, and reduce with different roots (or reduce against
//! broadcast, or a barrier against a collective) waited out the timeout.

mod common;

use std::time::Duration;

use ferrocoll_core::ReduceOp;
use ferrocoll_core::comm::{CommError, Communicator, CommunicatorExt};
use ferrocoll_process::TransportKind;

const TIMEOUT: Duration = Duration::from_secs(30);

/// Exit codes the parent reads.
const MISMATCH: i32 = 4;
const OTHER_ERROR: i32 = 3;

fn call(scenario: &str, comm: &mut impl Communicator, rank: u32) -> Result<(), CommError> {
    let input = vec![rank as f32 + 1.0; 1000];
    let mut output = vec![-7.0f32; 1000];
    let result = match scenario {
        "broadcast-roots" => comm.broadcast(&input, &mut output, u32::from(rank == 2)),
        "reduce-roots" => comm.reduce(&input, &mut output, ReduceOp::Sum, rank % 2),
        "reduce-vs-broadcast" if rank == 1 => comm.broadcast(&input, &mut output, 0),
        "reduce-vs-broadcast" => comm.reduce(&input, &mut output, ReduceOp::Sum, 0),
        "barrier-vs-collective" if rank == 3 => comm.barrier(),
        "barrier-vs-collective" => comm.all_reduce(&input, &mut output, ReduceOp::Sum),
        "in-place-vs-out" if rank == 0 => {
            let mut x = input.clone();
            comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
        }
        "in-place-vs-out" => comm.all_reduce(&input, &mut output, ReduceOp::Sum),
        "agree" => {
            comm.broadcast(&input, &mut output, 1)?;
            assert!(output.iter().all(|&x| x == 2.0), "broadcast from rank 1");
            comm.barrier()?;
            return comm.reduce(&input, &mut output, ReduceOp::Sum, 3);
        }
        other => panic!("unknown scenario {other}"),
    };
    assert!(
        result.is_ok() || output.iter().all(|&x| x == -7.0),
        "a disagreeing call wrote into rank {rank}'s output"
    );
    result
}

#[test]
#[ignore = "one rank of the multi-process tests in this file: they start copies of this binary running it with FERROCOLL_TEST_RANK set; alone it does nothing"]
fn child() {
    let Some((env, mut comm)) = common::child_group(TIMEOUT) else {
        return;
    };
    match call(&env.scenario, &mut comm, env.rank) {
        Ok(()) => println!("rank {} finished", env.rank),
        Err(e @ CommError::Mismatch { .. }) => {
            println!("rank {} mismatch: {e}", env.rank);
            // Leave as a program returning the error would: the
            // communicator closes its connections in order.
            drop(comm);
            std::process::exit(MISMATCH);
        }
        Err(e) => {
            println!("rank {} error: {e}", env.rank);
            drop(comm);
            std::process::exit(OTHER_ERROR);
        }
    }
}

fn run(scenario: &str, transport: TransportKind) -> Vec<common::Finished> {
    common::spawn("child", scenario, 4, transport).finish(Duration::from_secs(60), Vec::new())
}

fn every_rank_reports_a_mismatch(scenario: &str) {
    for t in [TransportKind::Shm, TransportKind::Tcp] {
        let finished = run(scenario, t);
        let all = common::show(&finished);
        for f in &finished {
            assert_eq!(f.code, Some(MISMATCH), "{scenario} over {t}\n{all}");
            assert!(
                f.at < Duration::from_secs(15),
                "{scenario} over {t}: waited {:?} (timeout {TIMEOUT:?})\n{all}",
                f.at
            );
        }
        if let Some(line) = all.lines().find(|l| l.contains("mismatch")) {
            println!("{scenario} over {t}: {line}");
        }
    }
}

#[test]
fn broadcasts_from_different_roots_are_a_mismatch_on_every_rank() {
    every_rank_reports_a_mismatch("broadcast-roots");
}

#[test]
fn reduces_to_different_roots_are_a_mismatch_not_a_timeout() {
    every_rank_reports_a_mismatch("reduce-roots");
}

#[test]
fn a_reduce_against_a_broadcast_is_a_mismatch_not_a_timeout() {
    every_rank_reports_a_mismatch("reduce-vs-broadcast");
}

#[test]
fn a_barrier_against_a_collective_is_a_mismatch() {
    every_rank_reports_a_mismatch("barrier-vs-collective");
}

#[test]
fn in_place_against_out_of_place_is_a_mismatch() {
    every_rank_reports_a_mismatch("in-place-vs-out");
}

#[test]
fn ranks_that_agree_run_broadcast_barrier_and_reduce() {
    for t in [TransportKind::Shm, TransportKind::Tcp] {
        let finished = run("agree", t);
        let all = common::show(&finished);
        assert!(finished.iter().all(|f| f.code == Some(0)), "{t}\n{all}");
    }
}
