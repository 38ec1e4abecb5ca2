//! The conformance kit across processes: a reduced matrix — every
//! collective × algorithm, awkward lengths (0, 1, odd, several segments),
//! every dtype and op in turn, in place and out of place — over shared
//! memory with 4 ranks, over TCP loopback with 3, and over both at once
//! (ranks on two emulated hosts, shared memory inside each, TCP between).
//! Each rank is a real process and checks its own output against the
//! serial reference.

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
    println!(
        "rank {} on {} hosts passed {ran} cases",
        env.rank,
        comm.layout().hosts()
    );
}

fn run(transport: TransportKind, n: u32) {
    run_on(transport, n, "");
}

/// `hosts`: each rank's emulated host, comma-separated (empty: one host).
fn run_on(transport: TransportKind, n: u32, hosts: &str) {
    let all: Vec<u32> = (0..n).collect();
    let env: &[(&str, &str)] = if hosts.is_empty() {
        &[]
    } else {
        &[("FERROCOLL_TEST_HOSTS", hosts)]
    };
    let ranks = common::spawn_some("child", "conformance", &all, n, transport, env);
    let finished = ranks.finish(Duration::from_secs(240), Vec::new());
    common::assert_all_ok(&finished);
    let hosts = if hosts.is_empty() {
        1
    } else {
        hosts
            .split(',')
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    for f in &finished {
        assert!(f.output.contains("passed"), "{}", f.output);
        assert!(
            f.output.contains(&format!("on {hosts} hosts")),
            "{}",
            f.output
        );
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

#[test]
fn every_collective_passes_the_kit_across_two_emulated_hosts_over_shm_and_tcp() {
    // Hosts interleaved, so no rank's place among its host's ranks is its
    // group rank, and one host holds three ranks.
    run_on(TransportKind::Auto, 5, "a,b,a,b,a");
}
