//! A rank's cursors over its plan: which instruction each channel fires
//! next, and the wait rule — the bookkeeping every interpreter shares, so
//! none re-derives the order on its own.

use super::{Instruction, RankPlan};

/// Where each channel of one rank stands.
#[derive(Debug, Clone)]
pub struct Walk<'p> {
    plan: &'p RankPlan,
    /// Instructions fired so far, per channel.
    fired: Vec<u32>,
}

impl<'p> Walk<'p> {
    /// Every channel at its first instruction.
    pub fn new(plan: &'p RankPlan) -> Self {
        Walk {
            plan,
            fired: vec![0; plan.channels.len()],
        }
    }

    /// Channels of the rank.
    pub fn channels(&self) -> usize {
        self.fired.len()
    }

    /// `channel`'s next instruction with its index, or `None` when it has
    /// fired them all.
    pub fn next(&self, channel: usize) -> Option<(u32, &'p Instruction)> {
        let at = self.fired[channel];
        self.plan.channels[channel]
            .get(at as usize)
            .map(|ins| (at, ins))
    }

    /// Whether every instruction `ins` waits for has fired.
    pub fn waits_met(&self, ins: &Instruction) -> bool {
        ins.after
            .iter()
            .all(|w| self.fired[w.channel as usize] > w.index)
    }

    /// `channel`'s next instruction, if its waits are met.
    pub fn ready(&self, channel: usize) -> Option<(u32, &'p Instruction)> {
        self.next(channel).filter(|(_, ins)| self.waits_met(ins))
    }

    /// `channel`'s next instruction has fired.
    pub fn advance(&mut self, channel: usize) {
        self.fired[channel] += 1;
    }

    /// Instructions `channel` has fired.
    pub fn fired(&self, channel: usize) -> u32 {
        self.fired[channel]
    }

    /// Whether every channel has fired every instruction.
    pub fn done(&self) -> bool {
        (0..self.channels()).all(|c| self.next(c).is_none())
    }

    /// The instruction each unfinished channel waits at, for timeout messages.
    pub fn describe(&self) -> String {
        (0..self.channels())
            .filter_map(|c| self.next(c).map(|(i, ins)| (c, i, ins)))
            .map(|(c, i, ins)| {
                let peers = |ms: &[super::Message]| ms.iter().map(|m| m.peer).collect::<Vec<_>>();
                format!(
                    "channel {c} instruction {i} (step {} of segment {}, {}, from {:?} to {:?})",
                    ins.step,
                    ins.segment,
                    ins.primitive_name(),
                    peers(&ins.recv),
                    peers(&ins.send)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}
