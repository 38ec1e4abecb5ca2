//! The symbolic verifier: proves a [`Schedule`] correct or lists everything
//! wrong with it.
//!
//! [`verify`] checks, for every rank and every chunk:
//! - **results** — each output chunk holds exactly the contributions the
//!   collective requires, each exactly once (a double-counted contribution
//!   is a violation, reported where the reduction happens);
//! - **matching** — every message sent is received, by a step expecting
//!   that many chunks, and every receive has a sender;
//! - **progress** — no step waits forever under the buffering model of
//!   [`crate::flow`] with the given slots per link; one run decides it for
//!   every interleaving and any number of segments;
//! - **races** — two steps of one rank on different channels that touch the
//!   same data, one writing, are ordered by program order, `after`
//!   references or messages; scratch chunks belong to one channel;
//! - **structure** — peers, roots, slices and references are in range, the
//!   input buffer is never written.
//!
//! Results, matching, progress and races are checked twice: with separate
//! input and output buffers, and with the buffers aliased as the
//! collective's in-place call defines, so a schedule that reads an input
//! chunk after overwriting it fails. Values are symbolic — "input chunk `c`
//! over ranks `S`" — so one run covers every element count, data type and
//! reduction op; the execution plan's chunk-to-byte map ([`crate::plan`])
//! is the other half of the proof, property-tested on its own and checked
//! by replaying plans on real values.

mod races;
mod structure;
mod symbolic;
mod violation;

pub use violation::{Mode, Violation, ViolationKind};

use std::fmt;

use thiserror::Error;

use crate::flow;
use crate::schedule::Schedule;
use crate::types::Collective;
use symbolic::Symbolic;
use violation::{MAX_STORED_VIOLATIONS, Violations};

/// Slots per link the built-in schedules are verified with: two, because a
/// step keeps the slot it receives from until it has written the slot it
/// sends to (it reduces straight from one to the other), so a ring whose
/// every link holds one message needs a second slot to move at all.
pub const DEFAULT_SLOTS_PER_LINK: u32 = 2;

/// How strictly to verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyOptions {
    /// Messages each link holds in flight (see [`crate::flow`]); executors
    /// must provide at least this many. Deadlock-freedom at k implies it at
    /// every larger value. The default, [`DEFAULT_SLOTS_PER_LINK`], is double
    /// buffering.
    pub slots_per_link: u32,
    /// Also prove the schedule with input and output aliased, for
    /// collectives that define an in-place call.
    pub in_place: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            slots_per_link: DEFAULT_SLOTS_PER_LINK,
            in_place: true,
        }
    }
}

/// A schedule the verifier has proven; executors accept only this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    schedule: Schedule,
    slots_per_link: u32,
    in_place: bool,
}

impl Verified {
    /// The proven schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The slots per link it was proven with; executors must provide at least these.
    pub fn slots_per_link(&self) -> u32 {
        self.slots_per_link
    }

    /// True when it was also proven for in-place calls.
    pub fn supports_in_place(&self) -> bool {
        self.in_place
    }

    /// Give the schedule back.
    pub fn into_schedule(self) -> Schedule {
        self.schedule
    }
}

/// A schedule that failed verification, with every violation found.
#[derive(Debug, Clone, Error)]
pub struct VerifyError {
    /// The schedule's name.
    pub name: String,
    /// Its collective.
    pub collective: Collective,
    /// Its world size.
    pub world_size: u32,
    /// The violations (at most a thousand are kept; see `omitted`).
    pub violations: Vec<Violation>,
    /// Violations found beyond the ones kept.
    pub omitted: usize,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.violations.len() + self.omitted;
        write!(
            f,
            "schedule `{}` ({}, n={}) has {total} violation(s)",
            self.name, self.collective, self.world_size
        )?;
        if let Some(first) = self.violations.first() {
            write!(f, "; first: {first}")?;
        }
        Ok(())
    }
}

/// Prove `schedule` correct, or return every violation found.
pub fn verify(schedule: Schedule, options: &VerifyOptions) -> Result<Verified, VerifyError> {
    let mut found = structure::check(&schedule);
    if found.is_empty() {
        found.extend(run(&schedule, Mode::OutOfPlace, options.slots_per_link));
        let in_place = options.in_place && schedule.collective.in_place_alias(0).is_some();
        if in_place && found.is_empty() {
            found.extend(run(&schedule, Mode::InPlace, options.slots_per_link));
        }
        if found.is_empty() {
            return Ok(Verified {
                schedule,
                slots_per_link: options.slots_per_link.max(1),
                in_place,
            });
        }
    }
    debug_assert!(found.list.len() <= MAX_STORED_VIOLATIONS);
    Err(VerifyError {
        name: schedule.name,
        collective: schedule.collective,
        world_size: schedule.world_size,
        violations: found.list,
        omitted: found.omitted,
    })
}

fn run(schedule: &Schedule, mode: Mode, slots: u32) -> Violations {
    let mut sym = Symbolic::new(schedule, mode);
    let multi_channel = schedule.channel_count() > 1;
    let outcome = flow::run(schedule, slots, &mut sym, multi_channel);
    let mut found = std::mem::take(&mut sym.violations);
    for stalled in &outcome.stalled {
        found.push(Violation::at(
            mode,
            stalled.at,
            stall_kind(schedule, &outcome, stalled),
        ));
    }
    // Messages waiting for a stalled receiver are part of that stall.
    let receiver_stalled = |link: &crate::types::Link| {
        outcome
            .stalled
            .iter()
            .any(|s| s.at.rank == link.to && s.at.channel == link.channel)
    };
    for (link, messages) in outcome
        .leftover
        .iter()
        .filter(|(l, _)| !receiver_stalled(l))
    {
        found.push(Violation {
            mode,
            rank: Some(link.from),
            channel: Some(link.channel),
            step: None,
            chunk: None,
            kind: ViolationKind::UnmatchedSend {
                to: link.to,
                channel: link.channel,
                messages: *messages,
            },
        });
    }
    if outcome.stalled.is_empty() {
        sym.check_results();
        found.extend(std::mem::take(&mut sym.violations));
        if let Some(accesses) = &sym.accesses {
            found.extend(races::check(schedule, mode, accesses, &outcome.deliveries));
        }
    }
    found
}

/// A stalled receive whose sender has finished is a receive nobody sends;
/// anything else is a deadlock.
fn stall_kind(
    schedule: &Schedule,
    outcome: &flow::FlowOutcome,
    s: &flow::Stalled,
) -> ViolationKind {
    if let [flow::Wait::Message { from }] = s.waits.as_slice() {
        let sender_done = !outcome
            .stalled
            .iter()
            .any(|o| o.at.rank == *from && o.at.channel == s.at.channel);
        let has_channel = (s.at.channel as usize) < schedule.ranks[*from as usize].channels.len();
        if sender_done || !has_channel {
            return ViolationKind::UnmatchedRecv { from: *from };
        }
    }
    ViolationKind::Deadlock {
        waits: s.waits.clone(),
    }
}

#[cfg(test)]
mod tests;
