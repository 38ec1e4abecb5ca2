//! What the CPU executor knows about a verified schedule before it runs:
//! which sent values may be read in place by the receiver (zero copy) and
//! which receives may be written straight into by the sender.

use std::collections::HashMap;

use crate::algorithms::{Algorithm, AlgorithmParams};
use crate::flow::{self, HappensBefore, Semantics};
use crate::schedule::{Buffer, Schedule, Step, StepAt};
use crate::types::Collective;
use crate::verify::Verified;

/// Identifies a cached plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum PlanKey {
    /// A built-in algorithm's schedule.
    Builtin {
        algorithm: Algorithm,
        collective: Collective,
        params: AlgorithmParams,
    },
    /// The configured schedule of the user's.
    Custom,
}

/// Where a sent value can be read from without a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stable {
    /// Nowhere: it must be materialised in the link's slot.
    No,
    /// In the step's `write` slice: every other write to it happens
    /// before this step or after every receiver has read it.
    Written,
    /// In the step's `read` slice, under the same condition.
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

/// Runs the schedule through the buffering model without data, to learn
/// which step receives each message.
struct Deliveries;

impl Semantics for Deliveries {
    type Payload = ();

    fn fire(&mut self, _: StepAt, step: &Step, _: &mut Vec<()>) -> Option<()> {
        (!step.send_to.is_empty()).then_some(())
    }
}

/// Above this many steps the happens-before queries would cost more than
/// the copies they save; values with other writers then travel in slots.
const MAX_ORDER_ANALYSIS_STEPS: usize = 4_096;

fn analyse(s: &Schedule, in_place: bool) -> Vec<Vec<Vec<StepPlan>>> {
    let analyse_order = s.step_count() <= MAX_ORDER_ANALYSIS_STEPS;
    let outcome = flow::run(
        s,
        crate::verify::DEFAULT_SLOTS_PER_LINK,
        &mut Deliveries,
        true,
    );
    let order = HappensBefore::new(s, &outcome.deliveries);
    let mut receivers: HashMap<StepAt, Vec<StepAt>> = HashMap::new();
    let mut sender: HashMap<StepAt, StepAt> = HashMap::new();
    for &(from, to) in &outcome.deliveries {
        receivers.entry(from).or_default().push(to);
        sender.insert(to, from);
    }
    // A direct target's memory may be written by its message's sender, at
    // the sender's step: that is the write that must come late enough.
    let effective = |w: StepAt| -> StepAt {
        let step = s.step(w).expect("writers are steps");
        let direct = step.recv_from.len() == 1 && step.read.is_none() && step.after.is_empty();
        if direct {
            sender.get(&w).copied().unwrap_or(w)
        } else {
            w
        }
    };
    (0..s.world_size)
        .map(|rank| {
            // Which steps write each physical chunk of this rank.
            let mut writers: [Vec<Vec<StepAt>>; 3] = [
                vec![Vec::new(); s.buffer_chunks(Buffer::Input) as usize],
                vec![Vec::new(); s.buffer_chunks(Buffer::Output) as usize],
                vec![Vec::new(); s.buffer_chunks(Buffer::Scratch) as usize],
            ];
            let prog = &s.ranks[rank as usize];
            for (c, steps) in prog.channels.iter().enumerate() {
                for (i, step) in steps.iter().enumerate() {
                    if let Some(w) = step.write {
                        let (buffer, first) = s.physical(in_place, rank, w.buffer, w.chunk);
                        let at = StepAt {
                            rank,
                            channel: c as u32,
                            index: i as u32,
                        };
                        for c in first..first + step.chunks {
                            writers[buffer as usize][c as usize].push(at);
                        }
                    }
                }
            }
            // A value may be read in place if every other write to its
            // memory happens before the sending step, or after every step
            // that receives it.
            let in_place_ok = |at: StepAt, step: &Step, slice: crate::schedule::Slice| {
                let (buffer, first) = s.physical(in_place, rank, slice.buffer, slice.chunk);
                if buffer == Buffer::Scratch {
                    return false;
                }
                let readers = receivers.get(&at).map_or(&[][..], Vec::as_slice);
                (first..first + step.chunks).all(|c| {
                    writers[buffer as usize][c as usize].iter().all(|&w| {
                        w == at
                            || analyse_order && order.reaches(w, at)
                            || readers
                                .iter()
                                .all(|&b| order.reaches(b, w) && order.reaches(b, effective(w)))
                    })
                })
            };
            prog.channels
                .iter()
                .enumerate()
                .map(|(channel, steps)| {
                    steps
                        .iter()
                        .enumerate()
                        .map(|(index, step)| {
                            let at = StepAt {
                                rank,
                                channel: channel as u32,
                                index: index as u32,
                            };
                            let sends = !step.send_to.is_empty();
                            let stable = match (step.write, step.read) {
                                (Some(w), _) if sends && in_place_ok(at, step, w) => {
                                    Stable::Written
                                }
                                (None, Some(r))
                                    if sends
                                        && step.recv_from.is_empty()
                                        && in_place_ok(at, step, r) =>
                                {
                                    Stable::Read
                                }
                                _ => Stable::No,
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
