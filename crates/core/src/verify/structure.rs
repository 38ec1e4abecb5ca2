//! Checks that need no execution: sizes, peers, bounds, references.

use super::violation::{Mode, Violation, ViolationKind as K, Violations};
use crate::schedule::{Buffer, Schedule, Slice, Step, StepAt};

pub(crate) fn check(schedule: &Schedule) -> Violations {
    let mut out = Violations::default();
    let n = schedule.world_size;
    if n == 0 {
        out.push(Violation::global(Mode::Structure, K::WorldSizeZero));
    }
    if schedule.ranks.len() != n as usize {
        out.push(Violation::global(
            Mode::Structure,
            K::RankCountMismatch {
                programs: schedule.ranks.len(),
                world_size: n,
            },
        ));
    }
    if schedule.chunks_per_block == 0 {
        out.push(Violation::global(Mode::Structure, K::NoChunks));
    }
    if let Some(root) = schedule.collective.root()
        && root >= n
    {
        out.push(Violation::global(
            Mode::Structure,
            K::RootOutOfRange {
                root,
                world_size: n,
            },
        ));
    }
    if !out.is_empty() {
        return out;
    }
    for (at, step) in schedule.steps() {
        check_step(schedule, at, step, &mut out);
    }
    out
}

fn check_step(schedule: &Schedule, at: StepAt, step: &Step, out: &mut Violations) {
    let mut flag = |kind| out.push(Violation::at(Mode::Structure, at, kind));
    if step.chunks == 0 {
        flag(K::ZeroChunks);
    }
    if step.input_count() == 0 {
        flag(K::NoInput);
    }
    if step.write.is_none() && step.send_to.is_empty() {
        flag(K::NoEffect);
    }
    for peers in [&step.recv_from, &step.send_to] {
        for (i, &peer) in peers.iter().enumerate() {
            if peer >= schedule.world_size {
                flag(K::PeerOutOfRange { peer });
            } else if peer == at.rank {
                flag(K::SelfMessage);
            }
            if peers[..i].contains(&peer) {
                flag(K::DuplicatePeer { peer });
            }
        }
    }
    let mut bounds = |slice: &Slice| {
        let available = schedule.buffer_chunks(slice.buffer);
        if u64::from(slice.chunk) + u64::from(step.chunks) > u64::from(available) {
            flag(K::SliceOutOfBounds {
                buffer: slice.buffer,
                first: slice.chunk,
                chunks: step.chunks,
                available,
            });
        }
    };
    if let Some(s) = &step.read {
        bounds(s);
    }
    if let Some(s) = &step.write {
        bounds(s);
    }
    if step.write.is_some_and(|w| w.buffer == Buffer::Input) {
        out.push(Violation::at(Mode::Structure, at, K::WritesInput));
    }
    let channels = &schedule.ranks[at.rank as usize].channels;
    for dep in &step.after {
        let exists = dep.channel != at.channel
            && channels
                .get(dep.channel as usize)
                .is_some_and(|s| (dep.step as usize) < s.len());
        if !exists {
            out.push(Violation::at(
                Mode::Structure,
                at,
                K::BadAfter {
                    channel: dep.channel,
                    step: dep.step,
                },
            ));
        }
    }
}
