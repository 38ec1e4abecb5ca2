//! Where each channel of one rank stands while an executor runs a
//! schedule segment after segment — the bookkeeping every executor shares,
//! so none re-derives the firing order's `after` rule on its own.

use super::{RankProgram, Step};

/// A channel's next step: step `index` of segment `segment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    /// The segment.
    pub segment: u32,
    /// The step's index within the channel.
    pub index: u32,
}

/// One rank's cursors over all its channels, for `segments` segments.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    program: &'a RankProgram,
    segments: u32,
    cursors: Vec<Cursor>,
}

impl<'a> Progress<'a> {
    /// Every channel at its first step (a channel with no steps is done).
    pub fn new(program: &'a RankProgram, segments: u32) -> Self {
        let cursors = program
            .channels
            .iter()
            .map(|steps| Cursor {
                segment: if steps.is_empty() { segments } else { 0 },
                index: 0,
            })
            .collect();
        Progress {
            program,
            segments,
            cursors,
        }
    }

    /// Channels of the rank.
    pub fn channels(&self) -> usize {
        self.cursors.len()
    }

    /// Where `channel` stands, and its next step; `None` once it has run
    /// every segment.
    pub fn next(&self, channel: usize) -> Option<(Cursor, &'a Step)> {
        let at = self.cursors[channel];
        (at.segment < self.segments)
            .then(|| (at, &self.program.channels[channel][at.index as usize]))
    }

    /// Whether every step `step` (at `at`) waits for on other channels
    /// (`after`) has fired in the same segment.
    pub fn after_done(&self, step: &Step, at: Cursor) -> bool {
        step.after.iter().all(|dep| {
            self.cursors[dep.channel as usize]
                > Cursor {
                    segment: at.segment,
                    index: dep.step,
                }
        })
    }

    /// `channel`'s step has fired: move to the next (and on to the next
    /// segment after the last step).
    pub fn advance(&mut self, channel: usize) {
        let steps = self.program.channels[channel].len();
        let c = &mut self.cursors[channel];
        c.index += 1;
        if c.index as usize == steps {
            c.index = 0;
            c.segment += 1;
        }
    }

    /// Whether every channel has run every segment.
    pub fn done(&self) -> bool {
        self.cursors.iter().all(|c| c.segment >= self.segments)
    }

    /// The step each unfinished channel waits at, for timeout messages.
    pub fn describe(&self) -> String {
        (0..self.channels())
            .filter_map(|ch| self.next(ch).map(|(at, step)| (ch, at, step)))
            .map(|(ch, at, step)| {
                format!(
                    "channel {ch} step {} of segment {} ({}, from {:?} to {:?})",
                    at.index,
                    at.segment,
                    step.primitive_name(),
                    step.recv_from,
                    step.send_to
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::StepRef;

    #[test]
    fn cursors_walk_segments_and_respect_after() {
        let mut waiting = Step::new(1);
        waiting.after.push(StepRef {
            channel: 0,
            step: 1,
        });
        let program = RankProgram {
            channels: vec![vec![Step::new(1), Step::new(1)], vec![waiting], vec![]],
        };
        let mut p = Progress::new(&program, 2);
        assert_eq!(p.next(2), None, "a channel without steps is done");
        let (at, step) = p.next(1).unwrap();
        assert!(!p.after_done(step, at));
        p.advance(0);
        assert!(!p.after_done(step, at), "step 1 of channel 0 has not fired");
        p.advance(0);
        assert!(p.after_done(step, at));
        assert_eq!(
            p.next(0).unwrap().0,
            Cursor {
                segment: 1,
                index: 0
            }
        );
        p.advance(1);
        let (at, step) = p.next(1).unwrap();
        assert_eq!(at.segment, 1);
        assert!(!p.after_done(step, at), "segment 1 needs segment 1's step");
        assert!(p.describe().contains("channel 1 step 0 of segment 1"));
        p.advance(0);
        p.advance(0);
        p.advance(1);
        assert!(p.done());
    }
}
