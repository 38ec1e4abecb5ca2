//! What the CPU executor knows about a verified schedule before it runs:
//! which sent values may be read in place by the receiver (zero copy) and
//! which receives may be written straight into by the sender.

use crate::algorithms::Algorithm;
use crate::schedule::{Buffer, Schedule, Step};
use crate::types::Collective;
use crate::verify::Verified;

/// Identifies a cached plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PlanKey {
    pub algorithm: Algorithm,
    pub collective: Collective,
    pub channels: u32,
}

/// Where a sent value can be read from without a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stable {
    /// Nowhere: it must be materialised in the link's slot.
    No,
    /// In the step's `write` slice, which no other step of the rank writes.
    Written,
    /// In the step's `read` slice, which no step of the rank writes.
    Read,
}

/// Per step of one buffer arrangement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepPlan {
    pub stable: Stable,
    /// A single receive copied to `write`: the sender may write there itself.
    pub direct_target: bool,
    /// For a direct target: the earliest index on its channel from which it
    /// may post its destination — no step in between touches that memory.
    pub post_from: u32,
}

pub(crate) struct Plan {
    pub verified: Verified,
    /// `steps[in_place][rank][channel][index]`.
    steps: [Vec<Vec<Vec<StepPlan>>>; 2],
}

impl Plan {
    pub fn new(verified: Verified) -> Self {
        let s = verified.schedule();
        let steps = [analyse(s, false), analyse(s, true)];
        Plan { verified, steps }
    }

    pub fn step(&self, in_place: bool, rank: u32, channel: u32, index: u32) -> StepPlan {
        self.steps[usize::from(in_place)][rank as usize][channel as usize][index as usize]
    }
}

fn analyse(s: &Schedule, in_place: bool) -> Vec<Vec<Vec<StepPlan>>> {
    (0..s.world_size)
        .map(|rank| {
            // How many steps write each physical chunk of this rank.
            let mut writers: [Vec<u32>; 3] = [
                vec![0; s.buffer_chunks(Buffer::Input) as usize],
                vec![0; s.buffer_chunks(Buffer::Output) as usize],
                vec![0; s.buffer_chunks(Buffer::Scratch) as usize],
            ];
            let prog = &s.ranks[rank as usize];
            for step in prog.channels.iter().flatten() {
                if let Some(w) = step.write {
                    let (buffer, first) = s.physical(in_place, rank, w.buffer, w.chunk);
                    for c in first..first + step.chunks {
                        writers[buffer as usize][c as usize] += 1;
                    }
                }
            }
            let writers = &writers;
            let written = |step: &Step, buffer: Buffer, chunk: u32| {
                let (buffer, first) = s.physical(in_place, rank, buffer, chunk);
                (first..first + step.chunks)
                    .map(move |c| (buffer, writers[buffer as usize][c as usize]))
            };
            prog.channels
                .iter()
                .map(|steps| {
                    steps
                        .iter()
                        .enumerate()
                        .map(|(index, step)| {
                            let only_writer = step.write.is_some_and(|w| {
                                written(step, w.buffer, w.chunk)
                                    .all(|(b, k)| b != Buffer::Scratch && k == 1)
                            });
                            let never_written = step.recv_from.is_empty()
                                && step.read.is_some_and(|r| {
                                    written(step, r.buffer, r.chunk)
                                        .all(|(b, k)| b != Buffer::Scratch && k == 0)
                                });
                            let stable = if only_writer {
                                Stable::Written
                            } else if never_written {
                                Stable::Read
                            } else {
                                Stable::No
                            };
                            let direct_target = step.recv_from.len() == 1
                                && step.read.is_none()
                                && step.write.is_some()
                                && step.after.is_empty();
                            // With several channels, another channel's access to the
                            // destination may be ordered before this step only through
                            // steps in between; post no earlier than the step itself.
                            let post_from = if direct_target && prog.channels.len() == 1 {
                                earliest_post(s, in_place, rank, steps, index)
                            } else {
                                index as u32
                            };
                            StepPlan {
                                stable,
                                direct_target,
                                post_from,
                            }
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// How far back on its channel a direct target may post its destination.
fn earliest_post(s: &Schedule, in_place: bool, rank: u32, steps: &[Step], target: usize) -> u32 {
    let t = &steps[target];
    let w = t.write.expect("direct targets write");
    let (buffer, first) = s.physical(in_place, rank, w.buffer, w.chunk);
    let touches = |step: &Step| {
        [step.read, step.write].into_iter().flatten().any(|slice| {
            let (b, f) = s.physical(in_place, rank, slice.buffer, slice.chunk);
            b == buffer && f < first + t.chunks && first < f + step.chunks
        })
    };
    let mut from = target;
    while from > 0 {
        let prev = &steps[from - 1];
        if touches(prev) {
            break;
        }
        from -= 1;
    }
    from as u32
}
