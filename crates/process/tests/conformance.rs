//! The conformance kit across processes: a reduced matrix — every
//! collective × algorithm, awkward lengths (0, 1, odd, several segments),
//! every dtype and op in turn, in place and out of place — over shared
//! memory with 4 ranks and over TCP loopback with 3. Each rank is a real
//! process and checks its own output against the serial reference.

mod common;

use std::time::Duration;

use ferrocoll_core::conformance::{Case, check_rank};
use ferrocoll_core::{Collective, DataType, ReduceOp};
use ferrocoll_process::{ProcessConfig, TransportKind};

const DTYPES: [DataType; 10] = [
    DataType::F32,
    DataType::I32,
    DataType::Bf16,
    DataType::U8,
    DataType::F64,
    DataType::I8,
    DataType::F16,
    DataType::U32,
    DataType::I64,
    DataType::U64,
];
const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Max,
    ReduceOp::Avg,
    ReduceOp::Prod,
    ReduceOp::Min,
];

/// The cases, the same in every process.
fn cases(n: u32) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut i = 0usize;
    for (algorithm, kind) in ferrocoll_core::algorithms::applicable() {
        let collective = kind.with_root(n - 1);
        for count in [0, 1, 7, 1000, 20_011] {
            for in_place in [false, true] {
                if in_place && collective.in_place_alias(0).is_none() {
                    continue;
                }
                i += 1;
                cases.push(Case {
                    collective,
                    algorithm: Some(algorithm),
                    world_size: n,
                    count,
                    dtype: DTYPES[i % DTYPES.len()],
                    op: OPS[(i / DTYPES.len()) % OPS.len()],
                    in_place,
                    seed: i as u64,
                });
            }
        }
    }
    // Point to point, which no algorithm generates.
    for (k, count) in [0usize, 5, 70_001].into_iter().enumerate() {
        cases.push(Case {
            collective: Collective::SendRecv,
            algorithm: None,
            world_size: n,
            count,
            dtype: DTYPES[k],
            op: ReduceOp::Sum,
            in_place: false,
            seed: 1000 + k as u64,
        });
    }
    cases
}

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
            timeout: Duration::from_secs(30),
            // Small messages, so that even short buffers cross many
            // segments and every slot of every link is reused.
            max_message_bytes: 4096,
            ..ProcessConfig::default()
        },
    );
    let mut ran = 0;
    for case in cases(env.world_size) {
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
