//! Hand-broken schedules: each must be rejected with the right violation.

use super::*;
use crate::algorithms::{Algorithm, AlgorithmParams, generate};
use crate::schedule::{ScheduleBuilder, Step};
use crate::types::{Buffer, Collective};

fn built_in(algorithm: Algorithm, collective: Collective, n: u32) -> Schedule {
    generate(algorithm, collective, n, &AlgorithmParams::default()).unwrap()
}

/// Verify and return the violation kinds, failing if the schedule passes.
fn kinds(schedule: Schedule) -> Vec<ViolationKind> {
    match verify(schedule, &VerifyOptions::default()) {
        Ok(_) => panic!("a broken schedule verified"),
        Err(e) => e.violations.into_iter().map(|v| v.kind).collect(),
    }
}

fn has(kinds: &[ViolationKind], pred: impl Fn(&ViolationKind) -> bool) -> bool {
    kinds.iter().any(pred)
}

#[test]
fn a_dropped_step_leaves_a_receive_unmatched() {
    let mut s = built_in(Algorithm::Ring, Collective::AllReduce, 4);
    s.ranks[2].channels[0].remove(3);
    let k = kinds(s);
    assert!(
        has(&k, |k| matches!(
            k,
            ViolationKind::UnmatchedRecv { .. } | ViolationKind::Deadlock { .. }
        )),
        "{k:?}"
    );
}

#[test]
fn a_duplicated_reduce_is_a_double_count() {
    // Two ranks: rank 1 completes the sum and sends it back; rank 0 then
    // adds its own input a second time.
    let mut b = ScheduleBuilder::new("dup", Collective::AllReduce, 2, 1, 1);
    b.push(0, 0, Step::new(1).read(Buffer::Input, 0).send(1));
    b.push(
        0,
        0,
        Step::new(1)
            .recv(1)
            .read(Buffer::Input, 0)
            .write(Buffer::Output, 0),
    );
    b.push(
        1,
        0,
        Step::new(1)
            .recv(0)
            .read(Buffer::Input, 0)
            .write(Buffer::Output, 0)
            .send(0),
    );
    let k = kinds(b.build());
    assert!(
        k.contains(&ViolationKind::DoubleCounted { ranks: vec![0] }),
        "{k:?}"
    );
}

#[test]
fn a_duplicated_step_in_a_built_in_is_caught() {
    let mut s = built_in(Algorithm::Direct, Collective::AllReduce, 3);
    // Rank 0 sends its contribution for chunk 1 twice.
    let first = s.ranks[0].channels[0][0].clone();
    s.ranks[0].channels[0].insert(0, first);
    let k = kinds(s);
    assert!(
        has(&k, |k| matches!(
            k,
            ViolationKind::UnmatchedSend { to: 1, .. }
        )),
        "{k:?}"
    );
}

#[test]
fn receives_before_sends_on_both_sides_deadlock() {
    let mut s = built_in(Algorithm::Direct, Collective::SendRecv, 2);
    for r in 0..2 {
        s.ranks[r].channels[0].swap(0, 1);
    }
    let k = kinds(s);
    assert_eq!(k.len(), 2, "{k:?}");
    assert!(
        k.iter()
            .all(|k| matches!(k, ViolationKind::Deadlock { .. })),
        "{k:?}"
    );
}

#[test]
fn unordered_writes_on_two_channels_race() {
    let mut b = ScheduleBuilder::new("race", Collective::AllReduce, 1, 1, 2);
    b.push(
        0,
        0,
        Step::new(1).read(Buffer::Input, 0).write(Buffer::Output, 0),
    );
    b.push(
        0,
        1,
        Step::new(1).read(Buffer::Input, 0).write(Buffer::Output, 0),
    );
    let k = kinds(b.build());
    assert!(
        has(&k, |k| matches!(k, ViolationKind::Race { .. })),
        "{k:?}"
    );

    // The same with an `after` edge is fine.
    let mut b = ScheduleBuilder::new("ordered", Collective::AllReduce, 1, 1, 2);
    b.push(
        0,
        0,
        Step::new(1).read(Buffer::Input, 0).write(Buffer::Output, 0),
    );
    b.push(
        0,
        1,
        Step::new(1)
            .read(Buffer::Input, 0)
            .write(Buffer::Output, 0)
            .after(0, 0),
    );
    assert!(verify(b.build(), &VerifyOptions::default()).is_ok());
}

#[test]
fn the_tree_root_without_its_after_edge_races() {
    let mut s = built_in(Algorithm::Tree, Collective::AllReduce, 4);
    for prog in &mut s.ranks {
        for steps in &mut prog.channels {
            for step in steps {
                step.after.clear();
            }
        }
    }
    let k = kinds(s);
    assert!(
        has(&k, |k| matches!(
            k,
            ViolationKind::Race { .. } | ViolationKind::ReadsUnwritten { .. }
        )),
        "{k:?}"
    );
}

#[test]
fn reading_an_input_after_overwriting_it_fails_in_place_only() {
    // Rank 0 completes its output, then sends "its input" on. Out of place
    // that is the original input; in place it is the finished sum, and rank
    // 1 counts its own contribution twice.
    let mut b = ScheduleBuilder::new("clobber", Collective::AllReduce, 2, 1, 1);
    b.push(
        0,
        0,
        Step::new(1)
            .recv(1)
            .read(Buffer::Input, 0)
            .write(Buffer::Output, 0),
    );
    b.push(0, 0, Step::new(1).read(Buffer::Input, 0).send(1));
    b.push(1, 0, Step::new(1).read(Buffer::Input, 0).send(0));
    b.push(
        1,
        0,
        Step::new(1)
            .recv(0)
            .read(Buffer::Input, 0)
            .write(Buffer::Output, 0),
    );
    let s = b.build();
    let out_of_place = VerifyOptions {
        in_place: false,
        ..VerifyOptions::default()
    };
    let v = verify(s.clone(), &out_of_place).unwrap();
    assert!(!v.supports_in_place());
    let e = verify(s, &VerifyOptions::default()).unwrap_err();
    assert!(
        e.violations.iter().all(|v| v.mode == Mode::InPlace),
        "{e:?}"
    );
    assert!(
        e.violations.iter().any(
            |v| v.kind == ViolationKind::DoubleCounted { ranks: vec![1] } && v.rank == Some(1)
        ),
        "{e:?}"
    );
}

#[test]
fn a_wrong_chunk_shape_is_named() {
    // Input chunk 0 written into output chunk 1: with two chunks per block
    // their sizes differ for odd counts.
    let mut b = ScheduleBuilder::new("shape", Collective::AllReduce, 1, 2, 1);
    b.push(
        0,
        0,
        Step::new(1).read(Buffer::Input, 0).write(Buffer::Output, 1),
    );
    b.push(
        0,
        0,
        Step::new(1).read(Buffer::Input, 1).write(Buffer::Output, 0),
    );
    let k = kinds(b.build());
    assert!(
        k.contains(&ViolationKind::ShapeMismatch {
            value_chunk: 0,
            slot_chunk: 1
        }),
        "{k:?}"
    );
}

#[test]
fn a_missing_contribution_is_a_wrong_result_naming_the_chunk() {
    let mut s = built_in(Algorithm::Ring, Collective::AllReduce, 3);
    // Rank 1 forwards without adding its own input at its middle step.
    s.ranks[1].channels[0][1].read = None;
    let e = verify(s, &VerifyOptions::default()).unwrap_err();
    let wrong: Vec<_> = e
        .violations
        .iter()
        .filter(|v| matches!(v.kind, ViolationKind::WrongResult { .. }))
        .collect();
    assert!(!wrong.is_empty(), "{e:?}");
    assert!(wrong.iter().all(|v| v.chunk.is_some() && v.rank.is_some()));
    assert!(
        wrong[0].to_string().contains("expected input chunk"),
        "{}",
        wrong[0]
    );
}

#[test]
fn structural_faults_are_all_reported_together() {
    let mut b = ScheduleBuilder::new("bad", Collective::AllReduce, 2, 1, 1);
    b.push(
        0,
        0,
        Step::new(1).read(Buffer::Input, 0).write(Buffer::Input, 0),
    ); // writes input
    b.push(0, 0, Step::new(1).read(Buffer::Input, 1).send(7)); // out of bounds, bad peer
    b.push(1, 0, Step::new(1).recv(1).write(Buffer::Output, 0)); // self message
    b.push(1, 0, Step::new(0).read(Buffer::Output, 0)); // zero chunks, no effect
    b.push(
        1,
        0,
        Step::new(1).read(Buffer::Output, 0).send(0).after(0, 9),
    ); // bad after
    let k = kinds(b.build());
    for want in [
        ViolationKind::WritesInput,
        ViolationKind::PeerOutOfRange { peer: 7 },
        ViolationKind::SelfMessage,
        ViolationKind::ZeroChunks,
        ViolationKind::NoEffect,
        ViolationKind::BadAfter {
            channel: 0,
            step: 9,
        },
    ] {
        assert!(k.contains(&want), "missing {want:?} in {k:?}");
    }
    assert!(
        has(&k, |k| matches!(k, ViolationKind::SliceOutOfBounds { .. })),
        "{k:?}"
    );
}

#[test]
fn message_sizes_must_agree() {
    let mut b = ScheduleBuilder::new("sizes", Collective::Broadcast { root: 0 }, 2, 2, 1);
    b.push(
        0,
        0,
        Step::new(2)
            .read(Buffer::Input, 0)
            .write(Buffer::Output, 0)
            .send(1),
    );
    b.push(1, 0, Step::new(1).recv(0).write(Buffer::Output, 0));
    let k = kinds(b.build());
    assert!(
        k.contains(&ViolationKind::MessageSizeMismatch {
            from: 0,
            expected: 1,
            got: 2
        }),
        "{k:?}"
    );
}

#[test]
fn a_reduction_in_all_gather_and_mixed_chunks_are_named() {
    let mut b = ScheduleBuilder::new("mix", Collective::AllGather, 2, 1, 1);
    b.push(0, 0, Step::new(1).read(Buffer::Input, 0).send(1));
    b.push(
        0,
        0,
        Step::new(1)
            .recv(1)
            .read(Buffer::Input, 0)
            .write(Buffer::Output, 0),
    );
    b.push(1, 0, Step::new(1).read(Buffer::Input, 0).send(0));
    b.push(1, 0, Step::new(1).recv(0).write(Buffer::Output, 1));
    b.push(
        1,
        0,
        Step::new(1).read(Buffer::Input, 0).write(Buffer::Output, 0),
    );
    let k = kinds(b.build());
    assert!(
        has(&k, |k| matches!(
            k,
            ViolationKind::ReductionWithoutOp { .. }
        )),
        "{k:?}"
    );

    let mut b = ScheduleBuilder::new("mix", Collective::AllReduce, 2, 2, 1);
    b.push(0, 0, Step::new(1).read(Buffer::Input, 1).send(1));
    b.push(
        1,
        0,
        Step::new(1)
            .recv(0)
            .read(Buffer::Input, 0)
            .write(Buffer::Output, 0),
    );
    let k = kinds(b.build());
    assert!(
        k.contains(&ViolationKind::MixedChunks {
            first: 1,
            second: 0
        }),
        "{k:?}"
    );
}

#[test]
fn scratch_shared_between_channels_is_rejected() {
    let mut b = ScheduleBuilder::new("scratch", Collective::AllReduce, 1, 2, 2).scratch_chunks(2);
    b.push(
        0,
        0,
        Step::new(1)
            .read(Buffer::Input, 0)
            .write(Buffer::Scratch, 0),
    );
    b.push(
        0,
        0,
        Step::new(1)
            .read(Buffer::Scratch, 0)
            .write(Buffer::Output, 0),
    );
    b.push(
        0,
        1,
        Step::new(1)
            .read(Buffer::Input, 1)
            .write(Buffer::Output, 1)
            .after(0, 1),
    );
    b.push(
        0,
        1,
        Step::new(1)
            .read(Buffer::Output, 0)
            .write(Buffer::Scratch, 0),
    );
    let k = kinds(b.build());
    assert!(
        has(&k, |k| matches!(
            k,
            ViolationKind::ScratchSharedAcrossChannels { .. }
        )),
        "{k:?}"
    );
}

#[test]
fn reduce_must_leave_non_root_outputs_alone() {
    let mut b = ScheduleBuilder::new("nonroot", Collective::Reduce { root: 0 }, 2, 1, 1);
    b.push(
        1,
        0,
        Step::new(1)
            .read(Buffer::Input, 0)
            .write(Buffer::Output, 0)
            .send(0),
    );
    b.push(
        0,
        0,
        Step::new(1)
            .recv(1)
            .read(Buffer::Input, 0)
            .write(Buffer::Output, 0),
    );
    let k = kinds(b.build());
    assert!(k.contains(&ViolationKind::WritesNonRootOutput), "{k:?}");
}

#[test]
fn header_problems_stop_before_execution() {
    let mut s = built_in(Algorithm::Ring, Collective::AllReduce, 4);
    s.ranks.pop();
    let k = kinds(s);
    assert_eq!(
        k,
        vec![ViolationKind::RankCountMismatch {
            programs: 3,
            world_size: 4
        }]
    );
    let mut s = built_in(Algorithm::Ring, Collective::Broadcast { root: 0 }, 4);
    s.collective = Collective::Broadcast { root: 9 };
    assert_eq!(
        kinds(s),
        vec![ViolationKind::RootOutOfRange {
            root: 9,
            world_size: 4
        }]
    );
}

#[test]
fn one_slot_is_not_enough_for_a_ring_but_two_are() {
    let s = built_in(Algorithm::Ring, Collective::AllReduce, 5);
    let one = VerifyOptions {
        slots_per_link: 1,
        ..VerifyOptions::default()
    };
    let e = verify(s.clone(), &one).unwrap_err();
    assert!(
        e.violations
            .iter()
            .all(|v| matches!(v.kind, ViolationKind::Deadlock { .. }))
    );
    let v = verify(s, &VerifyOptions::default()).unwrap();
    assert_eq!(v.slots_per_link(), 2);
    assert!(v.supports_in_place());
}

#[test]
fn huge_declared_sizes_are_refused_before_allocating() {
    let text = r#"{"version": 1, "name": "huge", "collective": {"kind": "all_to_all"},
        "world_size": 2, "chunks_per_block": 2147483648,
        "ranks": [{"channels": []}, {"channels": []}]}"#;
    let s = Schedule::from_json(text).unwrap();
    let k = kinds(s);
    assert!(
        has(&k, |k| matches!(k, ViolationKind::TooLarge { .. })),
        "{k:?}"
    );

    let mut b = ScheduleBuilder::new("long message", Collective::AllReduce, 2, 1, 1);
    b.push(
        0,
        0,
        Step::new(1).read(Buffer::Input, 0).write(Buffer::Output, 0),
    );
    b.push(1, 0, Step::new(u32::MAX).recv(0).send(0));
    let k = kinds(b.build());
    assert!(
        has(&k, |k| matches!(k, ViolationKind::TooLarge { .. })),
        "{k:?}"
    );
}

#[test]
fn a_shifted_overlapping_copy_is_rejected() {
    let mut b = ScheduleBuilder::new("shift", Collective::AllGather, 3, 1, 1);
    for r in 0..3 {
        b.push(
            r,
            0,
            Step::new(1).read(Buffer::Input, 0).write(Buffer::Output, 0),
        );
        b.push(
            r,
            0,
            Step::new(2)
                .read(Buffer::Output, 0)
                .write(Buffer::Output, 1),
        );
    }
    let k = kinds(b.build());
    assert!(
        k.contains(&ViolationKind::OverlappingSlices { read: 0, write: 1 }),
        "{k:?}"
    );
}
