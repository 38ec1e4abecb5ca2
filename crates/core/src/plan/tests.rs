//! The plan's invariants for every built-in schedule, its hash, its
//! checks against tampering, and the planner's cache.

use crate::types::CallShape;
use std::sync::Arc;

use super::*;
use crate::algorithms::{Algorithm, AlgorithmParams, applicable, generate};
use crate::verify::{VerifyOptions, verify};

pub(crate) fn verified(algorithm: Algorithm, collective: Collective, n: u32) -> crate::Verified {
    let s = generate(algorithm, collective, n, &AlgorithmParams::default()).unwrap();
    verify(s, &VerifyOptions::default()).unwrap()
}

pub(crate) fn shape(collective: Collective, count: usize, in_place: bool) -> CallShape {
    CallShape {
        collective,
        count,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        in_place,
        purpose: Default::default(),
    }
}

#[test]
fn every_builtin_plan_is_well_formed_and_ordered() {
    for (algorithm, kind) in applicable() {
        for n in [1, 2, 3, 4, 5, 7, 8, 12] {
            let collective = kind.with_root(n / 2);
            let v = verified(algorithm, collective, n);
            let compiler = Compiler::new(Arc::new(v.clone()));
            for count in [0, 1, 7, 1000] {
                for in_place in [false, true] {
                    if in_place && !v.supports_in_place() {
                        continue;
                    }
                    let s = shape(collective, count, in_place);
                    for chunking in [Chunking::Segments(1), Chunking::MaxBytes(64)] {
                        let plan = compiler.compile(&s, chunking, 2).unwrap();
                        let ctx = format!(
                            "{algorithm} {collective} n={n} count={count} in_place={in_place} {chunking:?}"
                        );
                        plan.check().unwrap_or_else(|e| panic!("{ctx}: {e}"));
                        assert_eq!(plan.ranks.len(), n as usize);
                        if in_place {
                            assert!(
                                all_regions(&plan).all(|r| r.buffer != Buffer::Input),
                                "{ctx}"
                            );
                        }
                    }
                }
            }
        }
    }
}

fn all_regions(plan: &ExecutionPlan) -> impl Iterator<Item = &Region> {
    plan.ranks
        .iter()
        .flat_map(|r| &r.channels)
        .flatten()
        .flat_map(|i| [&i.read, &i.write])
        .flatten()
}

#[test]
fn segments_tile_every_byte_a_collective_must_write() {
    // Every output byte of an all-gather is written exactly once per rank.
    let v = verified(Algorithm::Ring, Collective::AllGather, 5);
    let plan = compile(
        &v,
        &shape(Collective::AllGather, 1003, false),
        Chunking::MaxBytes(256),
        2,
    )
    .unwrap();
    assert!(plan.segments > 1);
    for rp in &plan.ranks {
        let mut written = vec![0u8; plan.output_bytes as usize];
        for ins in rp.channels.iter().flatten() {
            for p in ins.write.iter().flat_map(|w| &w.pieces) {
                for b in &mut written[p.offset as usize..(p.offset + p.bytes) as usize] {
                    *b += 1;
                }
            }
        }
        assert!(written.iter().all(|&k| k == 1), "rank {}", rp.rank);
    }
}

#[test]
fn forwarding_steps_take_the_length_of_what_they_forward() {
    // Whatever forwards a message (no region of its own) carries exactly
    // what it received; `check` compares every message at both ends.
    for (algorithm, kind) in applicable() {
        let collective = kind.with_root(1);
        let v = verified(algorithm, collective, 6);
        let plan = compile(&v, &shape(collective, 101, false), Chunking::Segments(3), 2).unwrap();
        plan.check().unwrap();
        assert!(plan.links.iter().all(
            |l| l.bytes <= l.messages * plan.chunk_bytes * u64::from(plan.chunks_per_block) * 6
        ));
    }
}

#[test]
fn lent_pieces_answers_only_where_every_value_sent_lies_in_a_buffer() {
    let plan = |algorithm, n, in_place| {
        let v = verified(algorithm, Collective::AllReduce, n);
        let shape = shape(Collective::AllReduce, 1000 * n as usize, in_place);
        compile(&v, &shape, Chunking::MaxBytes(1024), 2).unwrap()
    };
    // Two ranks: each sends its input, then the sum it wrote.
    for in_place in [false, true] {
        let p = plan(Algorithm::Ring, 2, in_place);
        assert_eq!(p.lent_pieces(), Some(1), "in place {in_place}");
    }
    // Four: partial sums travel through slots, stored nowhere.
    assert_eq!(plan(Algorithm::Ring, 4, false).lent_pieces(), None);
    // Whatever it answers, it is the largest sent region's piece count.
    let mut answered = 0;
    for (algorithm, kind) in applicable() {
        let collective = kind.with_root(1);
        let v = verified(algorithm, collective, 5);
        let p = compile(&v, &shape(collective, 101, false), Chunking::Segments(3), 2).unwrap();
        let Some(most) = p.lent_pieces() else {
            continue;
        };
        answered += 1;
        let sent = p.ranks.iter().flat_map(|r| r.channels.iter().flatten());
        for i in sent.filter(|i| !i.send.is_empty()) {
            let region = match i.source {
                Source::Read => i.read.as_ref(),
                Source::Write => i.write.as_ref(),
                Source::Slot => panic!("{algorithm:?} {collective}: a slot's value answered"),
            };
            let region = region.expect("the source's region");
            assert_ne!(region.buffer, Buffer::Scratch);
            assert!(region.pieces.len() <= most);
        }
    }
    assert!(answered > 0, "no schedule on 5 ranks lends every value");
}

#[test]
fn ring_all_reduce_moves_its_cost_line() {
    // 2(n−1)/n · S bytes per rank: each rank sends that much to its successor.
    for n in 2..=9u32 {
        let v = verified(Algorithm::Ring, Collective::AllReduce, n);
        let count = 64 * n as usize;
        let plan = compile(
            &v,
            &shape(Collective::AllReduce, count, false),
            Chunking::MaxBytes(1 << 20),
            2,
        )
        .unwrap();
        let s = (count * 4) as u64;
        for r in 0..n {
            let sent: u64 = plan
                .links
                .iter()
                .filter(|l| l.link.from == r)
                .map(|l| l.bytes)
                .sum();
            assert_eq!(
                sent,
                2 * u64::from(n - 1) * s / u64::from(n),
                "n={n} rank {r}"
            );
        }
    }
}

#[test]
fn the_hash_is_deterministic_and_covers_every_part_of_the_call() {
    let v = verified(Algorithm::Ring, Collective::AllReduce, 4);
    let base = shape(Collective::AllReduce, 1000, false);
    let plan = |s: CallShape, chunking, slots| compile(&v, &s, chunking, slots).unwrap().hash;
    let h = plan(base, Chunking::MaxBytes(4096), 2);
    assert_eq!(h, plan(base, Chunking::MaxBytes(4096), 2));
    let others = [
        plan(
            CallShape {
                count: 1001,
                ..base
            },
            Chunking::MaxBytes(4096),
            2,
        ),
        plan(
            CallShape {
                dtype: DataType::I32,
                ..base
            },
            Chunking::MaxBytes(4096),
            2,
        ),
        plan(
            CallShape {
                op: ReduceOp::Max,
                ..base
            },
            Chunking::MaxBytes(4096),
            2,
        ),
        plan(
            CallShape {
                in_place: true,
                ..base
            },
            Chunking::MaxBytes(4096),
            2,
        ),
        plan(base, Chunking::MaxBytes(64), 2),
        plan(base, Chunking::MaxBytes(4096), 3),
        compile(
            &verified(Algorithm::Direct, Collective::AllReduce, 4),
            &base,
            Chunking::MaxBytes(4096),
            2,
        )
        .unwrap()
        .hash,
    ];
    for (i, other) in others.iter().enumerate() {
        assert_ne!(h, *other, "variation {i} hashes alike");
    }
    // Roots are part of the call.
    let b0 = verified(Algorithm::Tree, Collective::Broadcast { root: 0 }, 4);
    let b1 = verified(Algorithm::Tree, Collective::Broadcast { root: 1 }, 4);
    let h0 = compile(
        &b0,
        &shape(Collective::Broadcast { root: 0 }, 9, false),
        Chunking::Segments(1),
        2,
    )
    .unwrap();
    let h1 = compile(
        &b1,
        &shape(Collective::Broadcast { root: 1 }, 9, false),
        Chunking::Segments(1),
        2,
    )
    .unwrap();
    assert_ne!(h0.hash, h1.hash);
}

#[test]
fn json_round_trips_and_tampering_is_caught() {
    let v = verified(Algorithm::Tree, Collective::AllReduce, 5);
    let plan = compile(
        &v,
        &shape(Collective::AllReduce, 77, true),
        Chunking::MaxBytes(64),
        2,
    )
    .unwrap();
    let text = plan.to_json();
    assert_eq!(ExecutionPlan::from_json(&text).unwrap(), plan);
    assert!(matches!(
        ExecutionPlan::from_json("{"),
        Err(PlanError::Malformed(_))
    ));

    let tamper = |f: &dyn Fn(&mut ExecutionPlan)| {
        let mut p = plan.clone();
        f(&mut p);
        p.hash = p.compute_hash();
        p.check()
    };
    fn first(p: &mut ExecutionPlan) -> &mut Instruction {
        p.ranks[1].channels[0]
            .iter_mut()
            .find(|i| !i.send.is_empty())
            .unwrap()
    }
    assert!(
        tamper(&|p| first(p).send[0].peer = 99).is_err(),
        "peer out of range"
    );
    assert!(
        tamper(&|p| first(p).send[0].index += 1).is_err(),
        "message numbering"
    );
    assert!(tamper(&|p| first(p).bytes += 4).is_err(), "length");
    assert!(
        tamper(&|p| {
            let w = p.ranks[0]
                .channels
                .iter_mut()
                .flatten()
                .find_map(|i| i.write.as_mut())
                .unwrap();
            w.pieces[0].offset = p.output_bytes;
        })
        .is_err(),
        "region out of bounds"
    );
    assert!(tamper(&|p| p.links[0].bytes += 1).is_err(), "link table");
    assert!(tamper(&|p| p.channels += 1).is_err(), "channel count");
    assert!(
        tamper(&|p| {
            let i = first(p);
            let twice = i.send[0];
            i.send.push(twice);
        })
        .is_err(),
        "one peer twice"
    );
    let mut stale = plan.clone();
    stale.count += 1;
    assert!(stale.check().is_err(), "a stale hash");
    assert!(ExecutionPlan::from_json(&stale.to_json()).is_err());
}

#[test]
fn compile_refuses_what_the_proof_does_not_cover() {
    let v = verified(Algorithm::Ring, Collective::AllReduce, 4);
    let s = shape(Collective::AllReduce, 8, false);
    assert!(matches!(
        compile(&v, &s, Chunking::Segments(1), 1),
        Err(PlanError::TooFewSlots {
            proven: 2,
            given: 1
        })
    ));
    let wrong = shape(Collective::AllGather, 8, false);
    assert!(matches!(
        compile(&v, &wrong, Chunking::Segments(1), 2),
        Err(PlanError::WrongCollective { .. })
    ));
    let huge = shape(Collective::AllReduce, 1 << 40, false);
    assert!(matches!(
        compile(&v, &huge, Chunking::MaxBytes(4), 2),
        Err(PlanError::TooLarge { .. })
    ));
    let overflow = shape(Collective::AllReduce, usize::MAX / 2, false);
    assert!(matches!(
        compile(&v, &overflow, Chunking::Segments(1), 2),
        Err(PlanError::TooLarge { .. })
    ));
    let a2a = verified(Algorithm::Direct, Collective::AllToAll, 3);
    let in_place = shape(Collective::AllToAll, 8, true);
    assert!(matches!(
        compile(&a2a, &in_place, Chunking::Segments(1), 2),
        Err(PlanError::InPlaceUnproven { .. })
    ));
}

#[test]
fn avg_divides_the_result_once_where_it_lands() {
    let n = 4;
    for (collective, in_place, offset) in [
        (Collective::AllReduce, false, 0),
        (Collective::ReduceScatter, true, 2 * 10 * 4),
        (Collective::ReduceScatter, false, 0),
    ] {
        let v = verified(Algorithm::Ring, collective, n);
        let s = CallShape {
            op: ReduceOp::Avg,
            ..shape(collective, 10, in_place)
        };
        let plan = compile(&v, &s, Chunking::Segments(1), 2).unwrap();
        let d = plan.ranks[2].divide.as_ref().unwrap();
        assert_eq!(
            (d.buffer, d.pieces[0].offset, d.pieces[0].bytes),
            (Buffer::Output, offset, 40)
        );
    }
    let v = verified(Algorithm::Tree, Collective::Reduce { root: 1 }, n);
    let s = CallShape {
        op: ReduceOp::Avg,
        ..shape(Collective::Reduce { root: 1 }, 10, false)
    };
    let plan = compile(&v, &s, Chunking::Segments(1), 2).unwrap();
    assert!(plan.ranks[0].divide.is_none() && plan.ranks[1].divide.is_some());
}

#[test]
fn walks_respect_waits_across_channels() {
    // The tree all-reduce hands the sum from its reduce channel to its
    // broadcast channel with a wait.
    let s = generate(
        Algorithm::Tree,
        Collective::AllReduce,
        4,
        &AlgorithmParams {
            channels: 2,
            ..AlgorithmParams::default()
        },
    )
    .unwrap();
    let v = verify(s, &VerifyOptions::default()).unwrap();
    let plan = compile(
        &v,
        &shape(Collective::AllReduce, 40, false),
        Chunking::Segments(2),
        2,
    )
    .unwrap();
    let (r, c, i, w) = plan
        .ranks
        .iter()
        .flat_map(|rp| rp.channels.iter().enumerate().map(move |(c, l)| (rp, c, l)))
        .flat_map(|(rp, c, l)| {
            l.iter()
                .enumerate()
                .filter_map(move |(i, ins)| ins.after.first().map(|w| (rp, c, i, *w)))
        })
        .next()
        .expect("a wait somewhere");
    let mut walk = Walk::new(r);
    for _ in 0..i {
        walk.advance(c);
    }
    let (_, ins) = walk.next(c).unwrap();
    assert!(
        !walk.waits_met(ins),
        "channel {} has fired nothing yet",
        w.channel
    );
    assert!(walk.ready(c).is_none());
    for _ in 0..=w.index {
        walk.advance(w.channel as usize);
    }
    assert!(walk.waits_met(ins));
    assert!(
        walk.describe()
            .contains(&format!("channel {c} instruction {i}"))
    );
}

#[test]
fn every_plans_link_table_moves_its_algorithms_cost_line() {
    for (algorithm, kind) in applicable() {
        for n in 1..=16u32 {
            let collective = kind.with_root(n / 3);
            let v = verified(algorithm, collective, n);
            for count in [1usize, 7, 1001] {
                let plan = compile(
                    &v,
                    &shape(collective, count, false),
                    Chunking::MaxBytes(256),
                    2,
                )
                .unwrap();
                let moved: u64 = plan.links.iter().map(|l| l.bytes).sum();
                let blocks = crate::algorithms::traffic_blocks(algorithm, kind, n).unwrap();
                assert_eq!(
                    moved,
                    blocks * count as u64 * 4,
                    "{algorithm} {collective} n={n} count={count}"
                );
            }
        }
    }
}

#[test]
fn compile_refuses_fewer_slots_than_proven() {
    let v = verified(Algorithm::Ring, Collective::AllReduce, 3);
    assert!(
        compile(
            &v,
            &shape(Collective::AllReduce, 9, false),
            Chunking::Segments(2),
            1
        )
        .is_err()
    );
}

/// The receives a sender may store into unannounced: direct all-reduce's
/// gathers (in place too: the owner reads a peer's chunk in place and
/// stores the sum back into it in one instruction), and the ring's
/// gathers.
#[test]
fn gathers_are_stored_by_their_senders() {
    for (algorithm, channels) in [
        (Algorithm::Direct, 1),
        (Algorithm::Direct, 3),
        (Algorithm::Ring, 2),
    ] {
        for in_place in [false, true] {
            let params = AlgorithmParams {
                channels,
                ..AlgorithmParams::default()
            };
            let s = generate(algorithm, Collective::AllReduce, 4, &params).unwrap();
            let compiler = Compiler::new(std::sync::Arc::new(
                verify(s, &VerifyOptions::default()).unwrap(),
            ));
            let shape = CallShape {
                collective: Collective::AllReduce,
                count: 1000,
                dtype: DataType::F32,
                op: ReduceOp::Sum,
                in_place,
                purpose: Default::default(),
            };
            let plan = compiler
                .compile(&shape, Chunking::MaxBytes(64 << 10), 2)
                .unwrap();
            for rank in &plan.ranks {
                let stored = rank
                    .channels
                    .iter()
                    .flatten()
                    .filter(|i| i.stored_by_sender)
                    .count();
                assert_eq!(
                    stored as u32,
                    3 * plan.channels * plan.segments,
                    "{algorithm:?} x{channels} in place {in_place}: rank {}",
                    rank.rank
                );
                assert!(
                    rank.channels
                        .iter()
                        .flatten()
                        .filter(|i| i.stored_by_sender)
                        .all(|i| i.direct.is_some() && i.recv.len() == 1 && i.read.is_none())
                );
            }
        }
    }
}
