//! The device protocol on the kernel's own source, on CPU threads
//! ([`host_kernel`](crate::host_kernel)), end to end: every
//! built-in algorithm and collective through the conformance kit (each
//! case run twice on one fabric, so the second call's messages start
//! mid-ring in every slot) in every way messages travel (zero copy,
//! staged, LL), every dtype and op, calls across the 32-bit call number's
//! wrap, and the failures: a rank that calls another plan, a rank that
//! never calls; `tests/refusals.rs` the programs the host refuses; `tests/rig.rs` has
//! the rig and the harnesses.

use std::sync::Arc;
use std::time::Duration;

use ferrocoll_core::algorithms::{Algorithm, AlgorithmParams, applicable};
use ferrocoll_core::comm::{CommError, Planning};
use ferrocoll_core::conformance::{Case, SplitMix64};
use ferrocoll_core::types::CallShape;
use ferrocoll_core::{Collective, DataType, ReduceOp};

use crate::host_kernel::Buffers;
use crate::interpreter::setup;
use crate::program::{DeviceProgram, Layout, ProgramError, Protocol, RankProgram, Transfer};

mod refusals;
mod rig;
use rig::*;

use crate::host_kernel::HostFabric;

#[test]
fn the_interpreter_groups_plans_run_through_the_device_protocol() {
    // Slots of 64 bytes: every call past a few elements cuts many
    // segments, and the group's planner must size them to fit. Calls of
    // up to 1 KiB per rank take LL, larger ones the bulk protocol.
    let config = crate::CudaConfig {
        ll_max_bytes: 1024,
        planning: Planning {
            channels: Some(2),
            max_chunk_bytes: Some(64),
            slots_per_link: 2,
            ..crate::CudaConfig::default().planning
        },
        ..crate::CudaConfig::default()
    };
    let mut rng = SplitMix64(29);
    let layout = setup::layout(3, 2, &config, true).unwrap();
    let mut planner =
        ferrocoll_core::comm::Planner::new(3, setup::planner_settings(&config, &layout));
    let mut shape = CallShape {
        collective: Collective::AllReduce,
        count: 256,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        in_place: false,
        purpose: Default::default(),
    };
    let planned = planner.plan(&shape).unwrap();
    assert_eq!(
        setup::protocol(&planned, &layout, &config),
        Protocol::LowLatency
    );
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
        ll_max_bytes: 1024,
        planning: Planning {
            max_chunk_bytes: Some(4096),
            slots_per_link: 2,
            selector: Some(ferrocoll_core::select::SharedSelector(Arc::new(WideLl))),
            ..crate::CudaConfig::default().planning
        },
        ..crate::CudaConfig::default()
    };
    let layout = setup::layout(4, 1, &config, true).unwrap();
    let mut planner =
        ferrocoll_core::comm::Planner::new(4, setup::planner_settings(&config, &layout));
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
            purpose: Default::default(),
        };
        let planned = planner.plan(&shape).unwrap();
        assert_eq!(planned.plan.schedule, "halving-doubling");
        assert_eq!(
            setup::protocol(&planned, &layout, &config),
            Protocol::LowLatency
        );
        check_group_planned(&config, &case);
    }
}

#[test]
fn every_algorithm_and_collective_runs_through_the_device_protocol() {
    let mut rng = SplitMix64(17);
    for ((algorithm, kind), way) in applicable().flat_map(|a| WAYS.map(|w| (a, w))) {
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
                check_emulated(2, way, &case);
            }
        }
    }
}

#[test]
fn every_dtype_and_op_runs_through_the_device_protocol() {
    let mut rng = SplitMix64(23);
    for (dtype, way) in DataType::ALL.into_iter().flat_map(|d| WAYS.map(|w| (d, w))) {
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
                check_emulated(3, way, &case);
            }
        }
    }
}

#[test]
fn the_protocols_take_turns_on_one_fabric() {
    // Both protocols share the links' counters and slot numbers (their
    // slots are apart): calls switching between them must still line up.
    let (simple, ll) = both_protocols(&all_reduce(300));
    let Some(fabric) = fabric(simple.layout, Duration::from_secs(20)) else {
        return;
    };
    take_turns(&fabric, &simple, &ll);
}

/// Six all-reduces of 300 f32 on every rank of `fabric`, switching
/// protocols between calls; each call's sums checked.
fn take_turns(fabric: &HostFabric, simple: &DeviceProgram, ll: &DeviceProgram) {
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
    if let Some(fabric) = fabric(layout, Duration::from_secs(20)) {
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
            "{results:?}"
        );
    }
}

#[test]
fn a_rank_that_calls_another_plan_fails_every_rank_before_its_data_lands() {
    for way in WAYS {
        another_plan_fails_every_rank(way);
    }
}

fn another_plan_fails_every_rank(way: Way) {
    let ours = plan_of(&all_reduce(300), 1);
    let theirs = plan_of(&all_reduce(299), 1);
    let layout = layout_for(&ours, 2, way.zero_copy);
    let a = DeviceProgram::lower(&ours, layout, way.protocol).unwrap();
    let b = DeviceProgram::lower(&theirs, layout, way.protocol).unwrap();
    let Some(fabric) = fabric(layout, Duration::from_secs(20)) else {
        return;
    };
    let inputs = [vec![1.0f32; 300], vec![1.0f32; 299], vec![1.0f32; 300]];
    let mut outputs = [vec![0.0f32; 300], vec![0.0f32; 299], vec![0.0f32; 300]];
    let buffers = f32_buffers(&mut outputs, &inputs);
    let started = std::time::Instant::now();
    let results = fabric.call(&[&a, &b, &a], buffers);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "it waited out the timeout"
    );
    assert!(results.iter().all(Result::is_err), "{way:?} {results:?}");
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(CommError::Mismatch { call: 0, .. }))),
        "{way:?} {results:?}"
    );
    // Nothing of rank 1's landed in rank 2's output, nor the other way.
    assert!(outputs[2].iter().all(|&x| x == 0.0 || x == 1.0));
    // The fabric is failed for good: counters no longer agree (the board
    // keeps each rank's own word).
    let again = fabric.call(&[&a, &a, &a], f32_buffers(&mut outputs, &inputs));
    assert!(again.iter().all(Result::is_err), "{way:?} {again:?}");
}

#[test]
fn a_rank_that_never_sends_times_the_others_out_with_the_reason() {
    let plan = plan_of(&all_reduce(64), 1);
    for way in WAYS {
        let layout = layout_for(&plan, 2, way.zero_copy);
        let p = DeviceProgram::lower(&plan, layout, way.protocol).unwrap();
        let Some(fabric) = fabric(layout, Duration::from_millis(300)) else {
            return;
        };
        // Rank 2 never launches: its peers wait for it.
        let inputs = vec![vec![1.0f32; 64]; 2];
        let mut outputs = vec![vec![0.0f32; 64]; 2];
        let started = std::time::Instant::now();
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = outputs
                .iter_mut()
                .zip(&inputs)
                .enumerate()
                .map(|(r, (output, input))| {
                    let (fabric, p) = (&fabric, &p);
                    scope.spawn(move || fabric.rank_call(r as u32, p, Buffers { input, output }))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(started.elapsed() < Duration::from_secs(10), "{way:?}");
        assert!(results.iter().all(Result::is_err), "{way:?} {results:?}");
        assert!(
            results
                .iter()
                .any(|r| matches!(r, Err(CommError::Timeout { .. }))),
            "{way:?} {results:?}"
        );
    }
}

#[test]
fn an_instruction_receiving_from_many_peers_runs() {
    // Direct all-reduce on 12 ranks: each rank combines 11 messages in one
    // instruction.
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
    for way in WAYS {
        check_emulated(1, way, &case);
    }
}

#[test]
fn a_peer_already_in_its_next_call_is_not_a_mismatch() {
    // Reduce to a late root: the other ranks only send, so (staged) they
    // finish a call and write the next call's hello before the root has
    // looked at theirs. The root must still take their messages. (Zero
    // copy, they wait for the root to have read their inputs instead.)
    for way in WAYS {
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
        let layout = layout_for(&plan, 4, way.zero_copy);
        let program = DeviceProgram::lower(&plan, layout, way.protocol).unwrap();
        let Some(fabric) = fabric(program.layout, Duration::from_secs(20)) else {
            return;
        };
        runs_ahead_of_a_late_root(&fabric, &program, way);
    }
}

fn runs_ahead_of_a_late_root(fabric: &HostFabric, program: &DeviceProgram, way: Way) {
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
                            let mut input = vec![(round * 10 + rank as usize) as f32; 40];
                            let mut output = vec![0f32; 40];
                            let buffers = Buffers {
                                input: &input,
                                output: &mut output,
                            };
                            fabric
                                .rank_call(rank, program, buffers)
                                .unwrap_or_else(|e| {
                                    panic!("{way:?} rank {rank} round {round}: {e}")
                                });
                            // Returned: the call is done with the input,
                            // which a root still reading it in place
                            // would now see changed.
                            input.fill(-1e9);
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
            "{way:?} round {round}: {out:?}"
        );
    }
}

#[test]
fn direct_all_reduce_moves_every_byte_once_where_ranks_reach_each_others_buffers() {
    // The owner of a chunk reads every peer's input chunk where it lies
    // and stores the sum into every peer's output: no message is staged.
    for in_place in [false, true] {
        let plan = plan_of(&direct_all_reduce(in_place), 2);
        let count = |p: &DeviceProgram, t: Transfer| {
            p.ranks
                .iter()
                .flat_map(|r| &r.ends)
                .filter(|e| e.transfer == t)
                .count()
        };
        let zero =
            DeviceProgram::lower(&plan, layout_for(&plan, 2, true), Protocol::Simple).unwrap();
        let ends: usize = zero.ranks.iter().map(|r| r.ends.len()).sum();
        assert_eq!(count(&zero, Transfer::Slot), 0, "in place {in_place}");
        // Each message has two ends: reads of inputs and stores of sums,
        // half each.
        assert_eq!(
            count(&zero, Transfer::InSender),
            ends / 2,
            "in place {in_place}"
        );
        assert_eq!(
            count(&zero, Transfer::InReceiver),
            ends / 2,
            "in place {in_place}"
        );
        // Every rank keeps only its inputs for others to read: it drains.
        assert!(
            zero.ranks
                .iter()
                .all(|r| r.sent.iter().any(|c| c.drain == 1))
        );
        for (zero_copy, protocol) in [(false, Protocol::Simple), (true, Protocol::LowLatency)] {
            let staged =
                DeviceProgram::lower(&plan, layout_for(&plan, 2, zero_copy), protocol).unwrap();
            assert_eq!(count(&staged, Transfer::Slot), ends, "{protocol:?}");
            assert!(
                staged
                    .ranks
                    .iter()
                    .all(|r| r.sent.iter().all(|c| c.drain == 0))
            );
        }
    }
}

#[test]
fn a_zero_copy_program_whose_ends_disagree_is_refused_before_any_store() {
    // Direct all-reduce where ranks reach each other's buffers: every
    // message is read in place or stored into its receiver. Each edit
    // below ran (and stored into the wrong bytes, or handed a buffer
    // back while a peer still read it) before the checks existed.
    let plan = plan_of(&direct_all_reduce(false), 1);
    let layout = layout_for(&plan, 2, true);
    let good = DeviceProgram::lower(&plan, layout, Protocol::Simple).unwrap();
    let r1 = &good.ranks[1];
    // The rank reads a peer's input in place, but names its own output
    // as the bytes to read.
    let mut elsewhere = good.clone();
    let at = first_end(r1, false, Transfer::InSender);
    elsewhere.ranks[1].ends[at].remote.buffer = crate::program::abi::BufferId::Output;
    // Its inputs stay in place for peers, but the call would end (and
    // hand the buffer back) without waiting for them to be read.
    let mut undrained = good.clone();
    undrained.ranks[1].sent.iter_mut().for_each(|c| c.drain = 0);
    // One instruction receives twice from one peer.
    let mut twice = good.clone();
    let op = r1.ops.iter().find(|o| o.recv.count >= 2).unwrap();
    let f = op.recv.first as usize;
    twice.ranks[1].ends[f + 1].peer = twice.ranks[1].ends[f].peer;
    for (name, bad) in [
        ("elsewhere", &elsewhere),
        ("undrained", &undrained),
        ("twice", &twice),
    ] {
        assert!(bad.validate().is_err(), "{name}");
    }
    let Some(fabric) = fabric(layout, Duration::from_secs(20)) else {
        return;
    };
    for bad in [&elsewhere, &undrained, &twice] {
        let inputs = vec![vec![1.0f32; 1000]; 4];
        let mut outputs = vec![vec![0.0f32; 1000]; 4];
        let results = fabric.call(
            &[&good, bad, &good, &good],
            f32_buffers(&mut outputs, &inputs),
        );
        assert!(results.iter().all(Result::is_err), "{results:?}");
        assert!(outputs.iter().flatten().all(|&x| x == 0.0), "nothing ran");
    }
}

/// The first end of a rank with `transfer`, receiving or sending.
fn first_end(p: &RankProgram, sending: bool, transfer: Transfer) -> usize {
    p.ops
        .iter()
        .flat_map(|o| {
            let s = if sending { o.send } else { o.recv };
            s.first as usize..(s.first + s.count) as usize
        })
        .find(|&i| p.ends[i].transfer == transfer)
        .unwrap()
}

/// Direct all-reduce of 1000 f32 on four ranks.
fn direct_all_reduce(in_place: bool) -> Case {
    Case {
        collective: Collective::AllReduce,
        algorithm: Some(Algorithm::Direct),
        world_size: 4,
        count: 1000,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        in_place,
        seed: 1,
    }
}
