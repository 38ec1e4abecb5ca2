//! The device protocol on threads, end to end: every built-in algorithm
//! and collective through the conformance kit (each case run twice on one
//! fabric, so the second call's messages start mid-ring in every slot),
//! every dtype and op, calls across the 32-bit call number's wrap, and
//! the failures: a rank that calls another plan, a rank that never calls,
//! programs and buffers the host refuses. Each runs on two rigs: the Rust
//! mirror ([`Fabric`]) and the kernel's own source built for the host
//! ([`host_kernel`](crate::program::host_kernel)); `tests/rig.rs` has the
//! rigs and the harnesses.

use std::sync::Arc;
use std::time::Duration;

use ferrocoll_core::algorithms::{Algorithm, AlgorithmParams, applicable};
use ferrocoll_core::conformance::{Case, SplitMix64};
use ferrocoll_core::plan::CallShape;
use ferrocoll_core::{Collective, DataType, ReduceOp};

use super::*;
use crate::interpreter::setup;
use crate::program::{ProgramError, Protocol, Span};

mod rig;
use rig::*;

#[test]
fn the_interpreter_groups_plans_run_through_the_device_protocol() {
    // Slots of 64 bytes: every call past a few elements cuts many
    // segments, and the group's planner must size them to fit. Calls of
    // up to 1 KiB per rank take LL, larger ones the bulk protocol.
    let config = crate::CudaConfig {
        channels: 2,
        max_chunk_bytes: 64,
        slots_per_link: 2,
        ll_max_bytes: 1024,
        ..crate::CudaConfig::default()
    };
    let mut rng = SplitMix64(29);
    let layout = setup::layout(3, &config).unwrap();
    let mut planner =
        ferrocoll_core::plan::Planner::new(3, setup::planner_settings(&config, &layout));
    let mut shape = CallShape {
        collective: Collective::AllReduce,
        count: 256,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        in_place: false,
    };
    let planned = planner.plan(&shape).unwrap();
    assert_eq!(setup::protocol(&planned, &layout, &config), Protocol::Ll);
    shape.count = 257;
    let planned = planner.plan(&shape).unwrap();
    assert_eq!(
        setup::protocol(&planned, &layout, &config),
        Protocol::Simple
    );
    for n in [1, 2, 3, 5, 8] {
        for kind in ferrocoll_core::CollectiveKind::ALL {
            let collective = kind.with_root(n - 1);
            for algorithm in [None, Some(Algorithm::Ring), Some(Algorithm::Direct)] {
                for (count, in_place, dtype) in [
                    (0, false, DataType::F32),
                    (37, true, DataType::Bf16),
                    (301, false, DataType::I64),
                    (57, false, DataType::U8),
                ] {
                    let case = Case {
                        collective,
                        algorithm,
                        world_size: n,
                        count,
                        dtype,
                        op: ReduceOp::Avg,
                        in_place,
                        seed: rng.next_u64(),
                    };
                    if in_place && collective.in_place_alias(0).is_none() {
                        continue;
                    }
                    if algorithm.is_some_and(|a| !applicable().any(|x| x == (a, kind))) {
                        continue;
                    }
                    check_group_planned(&config, &case);
                }
            }
        }
    }
}

/// A selector that always picks LL halving-doubling at a wide grain, as a
/// topology selector built for a larger LL slot than the group's would.
#[derive(Debug)]
struct WideLl;

impl ferrocoll_core::select::Selector for WideLl {
    fn select(&self, _: Collective, _: u32, _: usize) -> Option<ferrocoll_core::select::Selection> {
        Some(ferrocoll_core::select::Selection {
            choice: ferrocoll_core::select::Choice::Builtin {
                algorithm: Algorithm::HalvingDoubling,
                params: AlgorithmParams::default(),
            },
            max_chunk_bytes: Some(64 << 10),
            protocol: Some(ferrocoll_core::select::Protocol::LowLatency),
            why: "wide LL".into(),
        })
    }
}

#[test]
fn a_selected_ll_call_runs_as_ll_with_its_chunks_cut_to_the_ll_slot() {
    // Halving-doubling sends half its chunks in its first step: at the
    // selector's grain that message is past a 1 KiB LL slot, and the call
    // used to run in bulk instead of the protocol it was simulated with.
    let config = crate::CudaConfig {
        max_chunk_bytes: 4096,
        slots_per_link: 2,
        ll_max_bytes: 1024,
        selector: Some(ferrocoll_core::select::SharedSelector(Arc::new(WideLl))),
        ..crate::CudaConfig::default()
    };
    let layout = setup::layout(4, &config).unwrap();
    let mut planner =
        ferrocoll_core::plan::Planner::new(4, setup::planner_settings(&config, &layout));
    let mut rng = SplitMix64(31);
    for count in [2000, 2001, 3] {
        let case = Case {
            collective: Collective::AllReduce,
            algorithm: None,
            world_size: 4,
            count,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            in_place: false,
            seed: rng.next_u64(),
        };
        let shape = CallShape {
            collective: case.collective,
            count,
            dtype: case.dtype,
            op: case.op,
            in_place: false,
        };
        let planned = planner.plan(&shape).unwrap();
        assert_eq!(planned.plan.schedule, "halving-doubling");
        assert_eq!(setup::protocol(&planned, &layout, &config), Protocol::Ll);
        check_group_planned(&config, &case);
    }
}

#[test]
fn every_algorithm_and_collective_runs_through_the_device_protocol() {
    let mut rng = SplitMix64(17);
    for ((algorithm, kind), protocol) in applicable().flat_map(|a| PROTOCOLS.map(|p| (a, p))) {
        for n in [1, 2, 3, 4, 5, 8] {
            for (count, in_place) in [(0, false), (1, true), (37, false), (300, true)] {
                let case = Case {
                    collective: kind.with_root(n / 2),
                    algorithm: Some(algorithm),
                    world_size: n,
                    count,
                    dtype: DataType::F32,
                    op: ReduceOp::Sum,
                    in_place,
                    seed: rng.next_u64(),
                };
                if in_place && case.collective.in_place_alias(0).is_none() {
                    continue;
                }
                check_emulated(2, protocol, &case);
            }
        }
    }
}

#[test]
fn every_dtype_and_op_runs_through_the_device_protocol() {
    let mut rng = SplitMix64(23);
    for (dtype, protocol) in DataType::ALL
        .into_iter()
        .flat_map(|d| PROTOCOLS.map(|p| (d, p)))
    {
        for op in ReduceOp::ALL {
            for collective in [Collective::AllReduce, Collective::ReduceScatter] {
                let case = Case {
                    collective,
                    algorithm: Some(Algorithm::Ring),
                    world_size: 3,
                    count: 101,
                    dtype,
                    op,
                    in_place: false,
                    seed: rng.next_u64(),
                };
                check_emulated(3, protocol, &case);
            }
        }
    }
}

#[test]
fn the_protocols_take_turns_on_one_fabric() {
    // Both protocols share the links' counters and slot numbers (their
    // slots are apart): calls switching between them must still line up.
    let (simple, ll) = both_protocols(&all_reduce(300));
    for rig in rigs() {
        let fabric = AnyFabric::new(rig, simple.layout, Duration::from_secs(20));
        take_turns(&fabric, &simple, &ll);
    }
}

/// Six all-reduces of 300 f32 on every rank of `fabric`, switching
/// protocols between calls; each call's sums checked.
fn take_turns(fabric: &AnyFabric, simple: &DeviceProgram, ll: &DeviceProgram) {
    let n = simple.layout.world_size as usize;
    for (round, program) in [simple, ll, ll, simple, ll, simple].into_iter().enumerate() {
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| vec![(round * n + r) as f32; 300]).collect();
        let mut outputs = vec![vec![0f32; 300]; n];
        let results = fabric.call(&vec![program; n], f32_buffers(&mut outputs, &inputs));
        assert!(
            results.iter().all(Result::is_ok),
            "round {round}: {results:?}"
        );
        let want = (0..n).map(|r| (round * n + r) as f32).sum::<f32>();
        assert!(
            outputs.iter().flatten().all(|&x| x == want),
            "round {round} ({:?})",
            program.protocol
        );
    }
}

#[test]
fn calls_run_on_across_the_call_numbers_wrap() {
    // The device numbers calls in 32 bits (hello words, progress words,
    // the board): calls 2^32 - 3 through 2 must greet, wait and publish
    // as any others, under both protocols.
    let (simple, ll) = both_protocols(&Case {
        world_size: 4,
        ..all_reduce(300)
    });
    let layout = simple.layout;
    for rig in rigs() {
        let fabric = AnyFabric::new(rig, layout, Duration::from_secs(20));
        fabric.start_after(u64::from(u32::MAX) - 3);
        take_turns(&fabric, &simple, &ll);
        // Past the wrap, a mismatch is still caught (and numbered).
        let other = DeviceProgram::lower(
            &plan_of(
                &Case {
                    world_size: 4,
                    ..all_reduce(299)
                },
                2,
            ),
            layout,
            Protocol::Simple,
        )
        .unwrap();
        let inputs = [
            vec![1f32; 300],
            vec![1f32; 299],
            vec![1f32; 300],
            vec![1f32; 300],
        ];
        let mut outputs = [
            vec![0f32; 300],
            vec![0f32; 299],
            vec![0f32; 300],
            vec![0f32; 300],
        ];
        let results = fabric.call(
            &[&simple, &other, &simple, &simple],
            f32_buffers(&mut outputs, &inputs),
        );
        assert!(
            results
                .iter()
                .any(|r| matches!(r, Err(CommError::Mismatch { call: 2, .. }))),
            "{rig:?} {results:?}"
        );
    }
}

#[test]
fn a_rank_that_calls_another_plan_fails_every_rank_before_its_data_lands() {
    for rig in rigs() {
        for protocol in PROTOCOLS {
            another_plan_fails_every_rank(rig, protocol);
        }
    }
}

fn another_plan_fails_every_rank(rig: Rig, protocol: Protocol) {
    let ours = plan_of(&all_reduce(300), 1);
    let theirs = plan_of(&all_reduce(299), 1);
    let layout = layout_for(&ours, 2);
    let a = DeviceProgram::lower(&ours, layout, protocol).unwrap();
    let b = DeviceProgram::lower(&theirs, layout, protocol).unwrap();
    let fabric = AnyFabric::new(rig, layout, Duration::from_secs(20));
    let inputs = [vec![1.0f32; 300], vec![1.0f32; 299], vec![1.0f32; 300]];
    let mut outputs = [vec![0.0f32; 300], vec![0.0f32; 299], vec![0.0f32; 300]];
    let buffers = f32_buffers(&mut outputs, &inputs);
    let started = std::time::Instant::now();
    let results = fabric.call(&[&a, &b, &a], buffers);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "it waited out the timeout"
    );
    assert!(results.iter().all(Result::is_err), "{rig:?} {results:?}");
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(CommError::Mismatch { call: 0, .. }))),
        "{rig:?} {results:?}"
    );
    // Nothing of rank 1's landed in rank 2's output, nor the other way.
    assert!(outputs[2].iter().all(|&x| x == 0.0 || x == 1.0));
    // The fabric is failed for good: counters no longer agree. (The
    // mirror reports the first failure to every rank; the kernel's board
    // keeps each rank's own word.)
    let again = fabric.call(&[&a, &a, &a], f32_buffers(&mut outputs, &inputs));
    assert!(again.iter().all(Result::is_err), "{rig:?} {again:?}");
}

#[test]
fn a_rank_that_never_sends_times_the_others_out_with_the_reason() {
    let plan = plan_of(&all_reduce(64), 1);
    let layout = layout_for(&plan, 2);
    let p = DeviceProgram::lower(&plan, layout, Protocol::Simple).unwrap();
    // Rank 2's part emptied: it returns at once, as a rank whose kernel
    // never ran would leave its peers waiting.
    let mut silent = p.clone();
    silent.ranks[2] = RankProgram {
        channels: vec![Span::default()],
        ..RankProgram::default()
    };
    for rig in rigs() {
        let fabric = AnyFabric::new(rig, layout, Duration::from_millis(300));
        let inputs = vec![vec![1.0f32; 64]; 3];
        let mut outputs = vec![vec![0.0f32; 64]; 3];
        let buffers = f32_buffers(&mut outputs, &inputs);
        let started = std::time::Instant::now();
        let results = fabric.call(&[&p, &p, &silent], buffers);
        assert!(started.elapsed() < Duration::from_secs(10), "{rig:?}");
        assert!(
            results[..2].iter().all(Result::is_err),
            "{rig:?} {results:?}"
        );
        assert!(
            results[..2]
                .iter()
                .any(|r| matches!(r, Err(CommError::Timeout { .. }))),
            "{rig:?} {results:?}"
        );
    }
}

#[test]
fn plans_that_do_not_fit_the_layout_are_typed_errors() {
    let plan = plan_of(&all_reduce(300), 2);
    let fits = layout_for(&plan, 2);
    assert!(DeviceProgram::lower(&plan, fits, Protocol::Simple).is_ok());
    let cases = [
        Layout {
            world_size: 4,
            ..fits
        },
        Layout {
            max_channels: 1,
            ..fits
        },
        Layout { slots: 1, ..fits },
        Layout {
            slot_bytes: 16,
            ..fits
        },
        Layout {
            slot_bytes: fits.slot_bytes + 8,
            ..fits
        },
        Layout { slots: 0, ..fits },
    ];
    for layout in cases {
        assert!(
            DeviceProgram::lower(&plan, layout, Protocol::Simple).is_err(),
            "{layout:?}"
        );
    }
}

#[test]
fn an_instruction_receiving_from_many_peers_runs() {
    // Direct all-reduce on 12 ranks: each rank combines 11 messages in one
    // instruction (past the 8 pointers the v1 kernels take per launch).
    let case = Case {
        collective: Collective::AllReduce,
        algorithm: Some(Algorithm::Direct),
        world_size: 12,
        count: 50,
        dtype: DataType::I32,
        op: ReduceOp::Sum,
        in_place: false,
        seed: 3,
    };
    let plan = plan_of(&case, 1);
    assert!(
        plan.ranks[0].channels[0].iter().any(|i| i.recv.len() == 11),
        "the case must fan in 11 messages"
    );
    for protocol in PROTOCOLS {
        check_emulated(1, protocol, &case);
    }
}

#[test]
fn more_ranks_than_the_device_tables_hold_is_a_typed_error() {
    let case = Case {
        world_size: 65,
        ..all_reduce(65)
    };
    let plan = plan_of(&case, 1);
    assert!(matches!(
        DeviceProgram::lower(&plan, layout_for(&plan, 2), Protocol::Simple),
        Err(ProgramError::TooLarge(_))
    ));
}

#[test]
fn an_edited_program_is_refused_before_any_thread_walks_it() {
    let plan = plan_of(&all_reduce(64), 1);
    let layout = layout_for(&plan, 2);
    let good = DeviceProgram::lower(&plan, layout, Protocol::Simple).unwrap();
    let mut past = good.clone();
    past.ranks[1].pieces[0].offset = 1 << 40;
    let mut peer = good.clone();
    peer.ranks[0].ends[0].peer = 7;
    let mut other_layout = good.clone();
    other_layout.layout.slots = 3;
    for (rig, bad) in rigs()
        .into_iter()
        .flat_map(|rig| [&past, &peer, &other_layout].map(|bad| (rig, bad)))
    {
        assert!(bad.validate().is_err() || bad.layout != layout);
        let fabric = AnyFabric::new(rig, layout, Duration::from_secs(20));
        let inputs = vec![vec![1.0f32; 64]; 3];
        let mut outputs = vec![vec![0.0f32; 64]; 3];
        let started = std::time::Instant::now();
        let results = fabric.call(&[&good, bad, &good], f32_buffers(&mut outputs, &inputs));
        assert!(started.elapsed() < Duration::from_secs(10), "{rig:?}");
        assert!(results.iter().all(Result::is_err), "{rig:?} {results:?}");
        assert!(
            outputs.iter().flatten().all(|&x| x == 0.0),
            "{rig:?}: nothing ran"
        );
    }
    // Buffers that do not fit the program are refused as well, on both.
    for rig in rigs() {
        let fabric = AnyFabric::new(rig, layout, Duration::from_secs(20));
        let inputs = [vec![1.0f32; 64], vec![1.0f32; 63], vec![1.0f32; 64]];
        let mut outputs = vec![vec![0.0f32; 64]; 3];
        let results = fabric.call(&[&good; 3], f32_buffers(&mut outputs, &inputs));
        assert!(
            matches!(
                &results[1],
                Err(CommError::BufferSize {
                    what: "input",
                    got: 63,
                    needed: 64
                })
            ),
            "{rig:?} {results:?}"
        );
        assert!(results.iter().all(Result::is_err), "{rig:?} {results:?}");
        assert!(outputs.iter().flatten().all(|&x| x == 0.0), "{rig:?}");
    }
}

#[test]
fn a_peer_already_in_its_next_call_is_not_a_mismatch() {
    // Reduce to a late root: the other ranks only send, so they finish a
    // call (and write the next call's hello) before the root has looked
    // at theirs. The root must still take their messages.
    for protocol in PROTOCOLS {
        let case = Case {
            collective: Collective::Reduce { root: 0 },
            algorithm: Some(Algorithm::Direct),
            world_size: 4,
            count: 40,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            in_place: false,
            seed: 1,
        };
        let plan = plan_of(&case, 1);
        let program = DeviceProgram::lower(&plan, layout_for(&plan, 4), protocol).unwrap();
        for rig in rigs() {
            let fabric = AnyFabric::new(rig, program.layout, Duration::from_secs(20));
            runs_ahead_of_a_late_root(&fabric, &program, protocol);
        }
    }
}

fn runs_ahead_of_a_late_root(fabric: &AnyFabric, program: &DeviceProgram, protocol: Protocol) {
    let rounds = 6;
    let outputs: Vec<Vec<Vec<f32>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4u32)
            .map(|rank| {
                let (fabric, program) = (fabric, program);
                scope.spawn(move || {
                    (0..rounds)
                        .map(|round| {
                            if rank == 0 {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            let input = vec![(round * 10 + rank as usize) as f32; 40];
                            let mut output = vec![0f32; 40];
                            let buffers = Buffers {
                                input: &input,
                                output: &mut output,
                            };
                            fabric
                                .rank_call(rank, program, buffers)
                                .unwrap_or_else(|e| {
                                    panic!("{protocol:?} rank {rank} round {round}: {e}")
                                });
                            output
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (round, out) in outputs[0].iter().enumerate() {
        let want = (0..4).map(|r| (round * 10 + r) as f32).sum::<f32>();
        assert!(
            out.iter().all(|&x| x == want),
            "{protocol:?} round {round}: {out:?}"
        );
    }
}
