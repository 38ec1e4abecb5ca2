//! The conformance kit on the CPU executor: every collective × algorithm ×
//! world size × awkward length, and every dtype × op, against the serial
//! reference, in place and out of place, with chunks so small that even
//! short buffers cross many segments.

mod common;

use std::time::Duration;

use common::Cpu;
use ferrocoll_core::conformance::{Case, check_case};
use ferrocoll_core::{Algorithm, Collective, CollectiveKind, DataType, ReduceOp};

fn supported() -> Vec<(Algorithm, CollectiveKind)> {
    ferrocoll_core::algorithms::applicable().collect()
}

fn run_all(cases: impl IntoIterator<Item = Case>, max_chunk_bytes: usize) -> usize {
    let harness = Cpu {
        max_chunk_bytes,
        timeout: Duration::from_secs(20),
    };
    let mut ran = 0;
    for case in cases {
        if let Err(e) = check_case(&harness, &case) {
            panic!("{e}");
        }
        ran += 1;
    }
    ran
}

fn in_place_ok(c: Collective) -> bool {
    c.in_place_alias(0).is_some()
}

#[test]
fn every_algorithm_and_collective_over_world_sizes_and_awkward_lengths() {
    let mut cases = Vec::new();
    let mut seed = 0;
    for (algorithm, kind) in supported() {
        for n in (1..=9).chain([16, 17]) {
            let collective = kind.with_root(n / 2);
            let n_us = n as usize;
            for count in [0, 1, n_us - 1, n_us, n_us + 1, 97] {
                for in_place in [false, true] {
                    if in_place && !in_place_ok(collective) {
                        continue;
                    }
                    seed += 1;
                    cases.push(Case {
                        collective,
                        algorithm: Some(algorithm),
                        world_size: n,
                        count,
                        dtype: DataType::I32,
                        op: ReduceOp::Sum,
                        in_place,
                        seed,
                    });
                }
            }
        }
    }
    let ran = run_all(cases, 16);
    println!("{ran} cases passed");
}

#[test]
fn every_dtype_and_op() {
    let mut cases = Vec::new();
    let mut seed = 1000;
    for (algorithm, kind) in supported() {
        let collective = kind.with_root(1);
        if !collective.reduces() {
            continue;
        }
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                for (n, in_place) in [(3, false), (4, true)] {
                    seed += 1;
                    cases.push(Case {
                        collective,
                        algorithm: Some(algorithm),
                        world_size: n,
                        count: 61,
                        dtype,
                        op,
                        in_place,
                        seed,
                    });
                }
            }
        }
    }
    // Data movement without reduction, for every dtype.
    for dtype in DataType::ALL {
        for kind in [
            CollectiveKind::AllGather,
            CollectiveKind::Broadcast,
            CollectiveKind::AllToAll,
        ] {
            seed += 1;
            cases.push(Case {
                collective: kind.with_root(2),
                algorithm: None,
                world_size: 5,
                count: 33,
                dtype,
                op: ReduceOp::Sum,
                in_place: false,
                seed,
            });
        }
    }
    let ran = run_all(cases, 24);
    println!("{ran} cases passed");
}

#[test]
fn a_million_elements_stream_through_every_algorithm_and_collective() {
    let mut cases = Vec::new();
    for (algorithm, kind) in supported() {
        let collective = kind.with_root(1);
        let modes: &[(DataType, bool)] = if in_place_ok(collective) {
            &[(DataType::F32, false), (DataType::U8, true)]
        } else {
            &[(DataType::F32, false)]
        };
        for &(dtype, in_place) in modes {
            cases.push(Case {
                collective,
                algorithm: Some(algorithm),
                world_size: 3,
                count: (1 << 20) + 3,
                dtype,
                op: ReduceOp::Sum,
                in_place,
                seed: 7,
            });
        }
    }
    run_all(cases, 64 << 10);
}

#[test]
fn auto_choice_and_default_chunking_work_too() {
    let cases = (1..=6).map(|n| Case {
        collective: Collective::AllReduce,
        algorithm: None,
        world_size: n,
        count: 100_003,
        dtype: DataType::F64,
        op: ReduceOp::Avg,
        in_place: n % 2 == 0,
        seed: n as u64,
    });
    run_all(cases, ferrocoll_core::plan::HOST_CHUNK_BYTES);
}

#[test]
fn large_chunks_take_the_streaming_paths() {
    // 1 MiB chunks: stretches ≥ 256 KiB go through the streaming stores
    // (fused for f32/f64 sums, staged for the rest). In place on 4 ranks,
    // a value goes over the blocks three peers lent: the fused kernel with
    // destinations that are its sources.
    let mut cases = Vec::new();
    for algorithm in Algorithm::ALL {
        for (dtype, op, in_place, world_size) in [
            (DataType::F32, ReduceOp::Sum, false, 2),
            (DataType::F64, ReduceOp::Sum, true, 2),
            (DataType::I32, ReduceOp::Max, false, 2),
            (DataType::F32, ReduceOp::Sum, true, 4),
        ] {
            cases.push(Case {
                collective: Collective::AllReduce,
                algorithm: Some(algorithm),
                world_size,
                count: (1 << 19) + 5,
                dtype,
                op,
                in_place,
                seed: 11,
            });
        }
    }
    run_all(cases, 1 << 20);
}
