//! The conformance kit across processes: a reduced matrix — every
//! collective × algorithm, awkward lengths (0, 1, odd, several segments),
//! every dtype and op in turn, in place and out of place — over shared
//! memory with 4 ranks and over TCP loopback with 3. Each rank is a real
//! process and checks its own output against the serial reference.

mod common;

use std::time::Duration;

use ferrocoll_core::comm::Planning;
use ferrocoll_core::conformance::check_rank;
use ferrocoll_process::{ProcessConfig, TransportKind};

#[test]
#[ignore = "one rank of the multi-process tests in this file: they start copies of this binary running it with FERROCOLL_TEST_RANK set; alone it does nothing"]
fn child() {
    let Some(env) = common::child_env() else {
        return;
    };
    assert_eq!(env.scenario, "conformance");
    let mut comm = common::connect(
        &env,
        ProcessConfig {
            // Small messages, so that even short buffers cross many
            // segments and every slot of every link is reused.
            max_message_bytes: 4096,
            planning: Planning {
                timeout: Duration::from_secs(30),
                ..ProcessConfig::default().planning
            },
            ..ProcessConfig::default()
        },
    );
    let mut ran = 0;
    for case in common::kit_cases(env.world_size) {
        comm.set_algorithm(case.algorithm);
        if let Err(e) = check_rank(&mut comm, &case) {
            panic!("{e}");
        }
        ran += 1;
    }
    println!("rank {} passed {ran} cases", env.rank);
}

fn run(transport: TransportKind, n: u32) {
    let ranks = common::spawn("child", "conformance", n, transport);
    let finished = ranks.finish(Duration::from_secs(240), Vec::new());
    common::assert_all_ok(&finished);
    for f in &finished {
        assert!(f.output.contains("passed"), "{}", f.output);
        println!(
            "rank {}: {}",
            f.rank,
            f.output
                .lines()
                .find(|l| l.contains("passed"))
                .unwrap_or("")
        );
    }
}

#[test]
fn every_collective_passes_the_kit_across_4_processes_over_shared_memory() {
    run(TransportKind::Shm, 4);
}

#[test]
fn every_collective_passes_the_kit_across_3_processes_over_tcp() {
    run(TransportKind::Tcp, 3);
}
