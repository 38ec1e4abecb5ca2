//! What the zero-copy paths may rely on, derived once per schedule and
//! buffer arrangement from the happens-before order of its steps: which
//! sent values stay put until every receiver has read them, which
//! receives the sender may write straight into once announced, and which
//! it may write into unannounced.

use std::collections::HashMap;

use super::Source;
use crate::flow::{self, HappensBefore, Semantics};
use crate::schedule::{Schedule, Slice, Step, StepAt};
use crate::types::Buffer;

/// The facts of one step (the same in every segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepFacts {
    pub source: Source,
    /// For a direct receive: the earliest step index of its channel from
    /// which the destination may be announced.
    pub direct_from: Option<u32>,
    /// For a direct receive: its sender may store into the destination
    /// whenever the sender's step fires, with no announcement.
    pub stored_by_sender: bool,
}

/// `facts[rank][channel][step]` for one buffer arrangement.
pub(crate) type Facts = Vec<Vec<Vec<StepFacts>>>;

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

/// A plain receive into `write`: one message, nothing read, no wait.
fn plain_receive(step: &Step) -> bool {
    step.recv_from.len() == 1 && step.read.is_none() && step.after.is_empty()
}

/// The facts of every step of `s` with buffers arranged in place or not.
pub(crate) fn analyse(s: &Schedule, in_place: bool) -> Facts {
    let outcome = flow::run(
        s,
        crate::verify::DEFAULT_SLOTS_PER_LINK,
        &mut Deliveries,
        true,
    );
    let order = Order {
        s,
        in_place,
        happens: HappensBefore::new(s, &outcome.deliveries),
        analyse_order: s.step_count() <= MAX_ORDER_ANALYSIS_STEPS,
        receivers: HashMap::new(),
        sender: HashMap::new(),
    }
    .with_deliveries(&outcome.deliveries);
    (0..s.world_size).map(|rank| order.rank(rank)).collect()
}

struct Order<'a> {
    s: &'a Schedule,
    in_place: bool,
    happens: HappensBefore,
    analyse_order: bool,
    receivers: HashMap<StepAt, Vec<StepAt>>,
    sender: HashMap<StepAt, StepAt>,
}

impl Order<'_> {
    fn with_deliveries(mut self, deliveries: &[(StepAt, StepAt)]) -> Self {
        for &(from, to) in deliveries {
            self.receivers.entry(from).or_default().push(to);
            self.sender.insert(to, from);
        }
        self
    }

    /// A direct receive's memory may be written by its message's sender, at
    /// the sender's step: that is the write that must come late enough.
    fn effective(&self, w: StepAt) -> StepAt {
        let step = self.s.step(w).expect("writers are steps");
        if plain_receive(step) {
            self.sender.get(&w).copied().unwrap_or(w)
        } else {
            w
        }
    }

    fn rank(&self, rank: u32) -> Vec<Vec<StepFacts>> {
        let writers = self.writers(rank);
        let prog = &self.s.ranks[rank as usize];
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
                        let direct = plain_receive(step) && step.write.is_some();
                        // With several channels, another channel's access to the
                        // destination may be ordered before this step only through
                        // steps in between; announce no earlier than the step itself.
                        let direct_from = direct.then(|| {
                            if prog.channels.len() == 1 {
                                self.earliest_post(rank, steps, index)
                            } else {
                                index as u32
                            }
                        });
                        StepFacts {
                            source: self.source(&writers, at, step),
                            direct_from,
                            stored_by_sender: direct && self.stored_by_sender(at, step),
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// Which steps write each physical chunk of `rank`.
    fn writers(&self, rank: u32) -> [Vec<Vec<StepAt>>; 3] {
        let s = self.s;
        let mut writers: [Vec<Vec<StepAt>>; 3] = [
            vec![Vec::new(); s.buffer_chunks(Buffer::Input) as usize],
            vec![Vec::new(); s.buffer_chunks(Buffer::Output) as usize],
            vec![Vec::new(); s.buffer_chunks(Buffer::Scratch) as usize],
        ];
        for (c, steps) in s.ranks[rank as usize].channels.iter().enumerate() {
            for (i, step) in steps.iter().enumerate() {
                let Some(w) = step.write else { continue };
                let (buffer, first) = s.physical(self.in_place, rank, w.buffer, w.chunk);
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
        writers
    }

    fn source(&self, writers: &[Vec<Vec<StepAt>>; 3], at: StepAt, step: &Step) -> Source {
        if step.send_to.is_empty() {
            return Source::Slot;
        }
        match (step.write, step.read) {
            (Some(w), _) if self.stable(writers, at, step, w) => Source::Write,
            (None, Some(r)) if step.recv_from.is_empty() && self.stable(writers, at, step, r) => {
                Source::Read
            }
            _ => Source::Slot,
        }
    }

    /// A value may be read in place if every other write to its memory
    /// happens before the sending step, or after every step that receives it.
    fn stable(
        &self,
        writers: &[Vec<Vec<StepAt>>; 3],
        at: StepAt,
        step: &Step,
        slice: Slice,
    ) -> bool {
        let (buffer, first) = self
            .s
            .physical(self.in_place, at.rank, slice.buffer, slice.chunk);
        if buffer == Buffer::Scratch {
            return false;
        }
        let readers = self.receivers.get(&at).map_or(&[][..], Vec::as_slice);
        let h = &self.happens;
        (first..first + step.chunks).all(|c| {
            writers[buffer as usize][c as usize].iter().all(|&w| {
                w == at
                    || self.analyse_order && h.reaches(w, at)
                    || readers
                        .iter()
                        .all(|&b| h.reaches(b, w) && h.reaches(b, self.effective(w)))
            })
        })
    }

    /// Whether the sender of the direct receive `at` may store into its
    /// destination unannounced, whenever the sender's step fires: every
    /// other step of the rank that touches those bytes happens before the
    /// sender's step, or after `at` together with whoever stores into it
    /// for that step (a receive's own sender). Readers of a value kept in
    /// those bytes are covered by that value's [`Source`]: it is stable
    /// only if they read it before every later writer, the sender's step
    /// included.
    fn stored_by_sender(&self, at: StepAt, step: &Step) -> bool {
        let (Some(&sender), Some(w)) = (self.sender.get(&at), step.write) else {
            return false;
        };
        if !self.analyse_order {
            return false;
        }
        let s = self.s;
        let (buffer, first) = s.physical(self.in_place, at.rank, w.buffer, w.chunk);
        let h = &self.happens;
        let prog = &s.ranks[at.rank as usize];
        prog.channels.iter().enumerate().all(|(c, steps)| {
            steps.iter().enumerate().all(|(i, other)| {
                let o = StepAt {
                    rank: at.rank,
                    channel: c as u32,
                    index: i as u32,
                };
                let touches = [other.read, other.write]
                    .into_iter()
                    .flatten()
                    .any(|slice| {
                        let (b, f) = s.physical(self.in_place, at.rank, slice.buffer, slice.chunk);
                        b == buffer && f < first + step.chunks && first < f + other.chunks
                    });
                o == at
                    || !touches
                    || h.reaches(o, sender)
                    || (h.reaches(at, o) && h.reaches(at, self.effective(o)))
            })
        })
    }

    /// How far back on its channel a direct receive may announce its destination.
    fn earliest_post(&self, rank: u32, steps: &[Step], target: usize) -> u32 {
        let s = self.s;
        let t = &steps[target];
        let w = t.write.expect("direct receives write");
        let (buffer, first) = s.physical(self.in_place, rank, w.buffer, w.chunk);
        let touches = |step: &Step| {
            [step.read, step.write].into_iter().flatten().any(|slice| {
                let (b, f) = s.physical(self.in_place, rank, slice.buffer, slice.chunk);
                b == buffer && f < first + t.chunks && first < f + step.chunks
            })
        };
        let mut from = target;
        while from > 0 && !touches(&steps[from - 1]) {
            from -= 1;
        }
        from as u32
    }
}
