//! Soak across processes: trials of 4 processes each running many random
//! collectives (random algorithm, collective, dtype, op, count, in place or
//! not), every result checked against the serial reference; in some trials
//! one process dies (aborts, as a crash would) at a random call. Counts
//! hangs (must be 0), wrong results (0) and survivors that did not report
//! an error within the timeout (0), and prints them.
//! `FERROCOLL_SOAK_TRIALS` sets the number of trials (CI runs a short version).

mod common;

use std::time::Duration;

use ferrocoll_core::conformance::{Case, SplitMix64, check_rank};
use ferrocoll_core::{DataType, ReduceOp};
use ferrocoll_process::{ProcessConfig, TransportKind};

const RANKS: u32 = 4;
const CALLS: u64 = 40;
const TIMEOUT: Duration = Duration::from_secs(5);

/// The `call`-th random case of trial `seed`, the same in every process.
fn case(seed: u64, call: u64) -> Case {
    let mut rng = SplitMix64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ call);
    let pairs: Vec<_> = ferrocoll_core::algorithms::applicable().collect();
    let (algorithm, kind) = pairs[rng.next_u64() as usize % pairs.len()];
    let collective = kind.with_root(rng.next_u64() as u32 % RANKS);
    let in_place = collective.in_place_alias(0).is_some() && rng.next_u64() % 2 == 0;
    Case {
        collective,
        algorithm: Some(algorithm),
        world_size: RANKS,
        count: (rng.next_u64() % 3000) as usize,
        dtype: DataType::ALL[rng.next_u64() as usize % DataType::ALL.len()],
        op: ReduceOp::ALL[rng.next_u64() as usize % ReduceOp::ALL.len()],
        in_place,
        seed: rng.next_u64(),
    }
}

#[test]
#[ignore = "one rank of the multi-process tests in this file: they start copies of this binary running it with FERROCOLL_TEST_RANK set; alone it does nothing"]
fn child() {
    let Some(env) = common::child_env() else {
        return;
    };
    // "seed:victim:call" (victim `-` for none).
    let parts: Vec<&str> = env.scenario.split(':').collect();
    let seed: u64 = parts[0].parse().unwrap();
    let victim: Option<u32> = parts[1].parse().ok();
    let die_at: u64 = parts[2].parse().unwrap();
    let mut comm = common::connect(
        &env,
        ProcessConfig {
            timeout: TIMEOUT,
            max_message_bytes: 2048,
            ..ProcessConfig::default()
        },
    );
    for call in 0..CALLS {
        if victim == Some(env.rank) && call == die_at {
            std::process::abort();
        }
        let case = case(seed, call);
        comm.set_algorithm(case.algorithm);
        if let Err(e) = check_rank(&mut comm, &case) {
            if e.contains("element") || e.contains("changed") {
                println!("WRONG: {e}");
                std::process::exit(4);
            }
            println!("error: {e}");
            std::process::exit(3);
        }
    }
    println!("finished {CALLS} calls");
}

#[test]
fn random_collectives_across_processes_never_hang_or_go_wrong() {
    let trials: u64 = std::env::var("FERROCOLL_SOAK_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let (mut hangs, mut wrong, mut late, mut killed_trials, mut finished_anyway, mut calls) =
        (0, 0, 0, 0, 0, 0u64);
    let started = std::time::Instant::now();
    for trial in 0..trials {
        let transport = if trial % 2 == 0 {
            TransportKind::Shm
        } else {
            TransportKind::Tcp
        };
        let mut rng = SplitMix64(trial ^ 0xfeed);
        // One trial in three loses a process.
        let victim = (trial % 3 == 2).then(|| rng.next_u64() as u32 % RANKS);
        let die_at = rng.next_u64() % CALLS;
        let scenario = format!(
            "{trial}:{}:{die_at}",
            victim.map_or("-".to_owned(), |v| v.to_string())
        );
        let ranks = common::spawn("child", &scenario, RANKS, transport);
        // Far beyond the timeout: a rank still running then is hung.
        let finished = ranks.finish(TIMEOUT * 6, Vec::new());
        let died_at = victim.map(|v| finished[v as usize].at);
        killed_trials += u64::from(victim.is_some());
        for f in &finished {
            if Some(f.rank) == victim {
                continue;
            }
            match f.code {
                None => hangs += 1,
                Some(4) => {
                    wrong += 1;
                    eprintln!("trial {trial} ({transport}) rank {}: {}", f.rank, f.output);
                }
                Some(0) if victim.is_some() => finished_anyway += 1,
                Some(0) => calls += CALLS,
                Some(3) if victim.is_some() => {
                    if f.at.saturating_sub(died_at.unwrap()) > TIMEOUT {
                        late += 1;
                    }
                }
                other => {
                    wrong += 1;
                    eprintln!(
                        "trial {trial} ({transport}) rank {} exit {other:?}: {}",
                        f.rank, f.output
                    );
                }
            }
        }
    }
    println!(
        "soak across processes: {trials} trials of {RANKS} processes × {CALLS} random collectives \
         ({killed_trials} with a process killed), {calls} rank-calls checked in {:?}: \
         hangs {hangs}, wrong {wrong}, survivors without an error in time {late}, \
         survivors that finished anyway {finished_anyway}",
        started.elapsed()
    );
    assert_eq!((hangs, wrong, late), (0, 0, 0));
}
