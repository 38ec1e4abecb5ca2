//! Checks that need no execution: sizes, peers, bounds, references.

use super::violation::{Mode, Violation, ViolationKind as K, Violations};
use crate::schedule::{Schedule, Slice, Step, StepAt};
use crate::types::Buffer;

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
    check_sizes(schedule, &mut out);
    if !out.is_empty() {
        return out;
    }
    for (at, step) in schedule.steps() {
        check_step(schedule, at, step, &mut out);
    }
    out
}

/// Symbolic state the verifier may allocate, in 64-bit words (2 GiB).
pub(crate) const MAX_SYMBOLIC_WORDS: u64 = 1 << 28;

/// Refuse schedules whose symbolic state or link table would not fit, before
/// allocating anything, so a small hostile file cannot exhaust memory.
fn check_sizes(schedule: &Schedule, out: &mut Violations) {
    let n = u64::from(schedule.world_size);
    let cpb = u64::from(schedule.chunks_per_block);
    let c = schedule.collective;
    // Saturating: a hostile file's sizes must be refused, not overflow.
    let chunks = (u64::from(c.input_blocks(schedule.world_size))
        + u64::from(c.output_blocks(schedule.world_size)))
    .saturating_mul(cpb)
    .saturating_add(u64::from(schedule.scratch_chunks));
    let words = n.div_ceil(64) + 1;
    let channels = schedule.channel_count().max(1) as u64;
    let largest_step = schedule
        .steps()
        .map(|(_, s)| u64::from(s.chunks))
        .max()
        .unwrap_or(0);
    let sizes = [
        (
            "symbolic state (ranks × chunks × rank-set words)",
            n.saturating_mul(chunks).saturating_mul(words),
        ),
        (
            "link table (ranks² × channels)",
            n.saturating_mul(n).saturating_mul(channels),
        ),
        (
            "one step (chunks × rank-set words)",
            largest_step.saturating_mul(words),
        ),
    ];
    for (what, value) in sizes {
        if value > MAX_SYMBOLIC_WORDS {
            out.push(Violation::global(
                Mode::Structure,
                K::TooLarge {
                    what,
                    value,
                    limit: MAX_SYMBOLIC_WORDS,
                },
            ));
        }
    }
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
