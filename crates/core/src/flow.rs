//! The buffering model, and an engine that steps a schedule through it.
//!
//! **The model.** A *link* is an ordered pair of ranks plus a channel. It is a
//! FIFO that holds at most `slots_per_link` messages in flight. A step fires
//! only when (1) every step it names in `after` has fired, (2) the head of
//! each link it receives from holds a message, and (3) each link it sends on
//! has a free slot; firing takes the received messages off their links and
//! puts one message on each outgoing link. Executors must provide at least
//! the slots a schedule was verified with (never fewer than 1).
//!
//! **Why one run decides.** Each link has one writer and one reader, and a
//! fired step never disables another ready step: a receive only removes from
//! its own links and a send only adds to its own. The system is therefore
//! confluent — every order of firing reaches the same final state — so if
//! one greedy run completes, no interleaving an executor might take can
//! deadlock, and if it stalls, every interleaving stalls.
//!
//! **Why one segment decides.** Executors run the schedule once per segment,
//! back to back on each channel. If one run completes with every link
//! drained, the segment-by-segment interleaving of the repeated schedule
//! completes too (each segment starts from empty links), and by confluence
//! so does every other interleaving: verifying one segment covers any number.

use std::collections::{HashMap, VecDeque};

use crate::schedule::{Schedule, Step, StepAt, StepRef};
use crate::types::Rank;

/// Identifies a link: sender, receiver, channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Link {
    /// The sending rank.
    pub from: Rank,
    /// The receiving rank.
    pub to: Rank,
    /// The channel both ends use.
    pub channel: u32,
}

/// Why a step could not fire when the engine stalled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// No message arrived from this rank.
    Message {
        /// The rank that was expected to send.
        from: Rank,
    },
    /// The link to this rank stayed full.
    Slot {
        /// The receiving rank.
        to: Rank,
    },
    /// A step on another channel of the same rank never fired.
    Step(StepRef),
}

/// A step that never fired, and what it waited for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stalled {
    pub at: StepAt,
    pub waits: Vec<Wait>,
}

/// What the data side of an execution does when a step fires.
pub(crate) trait Semantics {
    /// What a message carries.
    type Payload: Clone;

    /// Perform `step`, given the messages received from `step.recv_from` in
    /// order; return the value to send (`None` when the step sends nothing).
    fn fire(&mut self, at: StepAt, step: &Step, received: Vec<Self::Payload>)
    -> Option<Self::Payload>;
}

/// The result of running a schedule through the buffering model.
#[derive(Debug, Default)]
pub(crate) struct FlowOutcome {
    /// Steps that never fired (empty when the schedule completed).
    pub stalled: Vec<Stalled>,
    /// Links left holding messages nobody received, with how many.
    pub leftover: Vec<(Link, usize)>,
    /// For each delivered message, (sending step, receiving step).
    pub deliveries: Vec<(StepAt, StepAt)>,
}

struct Message<P> {
    from: StepAt,
    payload: P,
}

/// Run `schedule` greedily under `slots_per_link`, calling `semantics` for
/// every fired step. The schedule must have passed the structural checks
/// (peers, channels and `after` references in range).
pub(crate) fn run<S: Semantics>(
    schedule: &Schedule,
    slots_per_link: u32,
    semantics: &mut S,
) -> FlowOutcome {
    let slots = slots_per_link.max(1) as usize;
    let mut links: HashMap<Link, VecDeque<Message<S::Payload>>> = HashMap::new();
    let mut pc: Vec<Vec<u32>> = schedule
        .ranks
        .iter()
        .map(|p| vec![0; p.channels.len()])
        .collect();
    let mut queued: Vec<Vec<bool>> = pc.iter().map(|c| vec![true; c.len()]).collect();
    let mut work: Vec<(Rank, u32)> = Vec::new();
    for (r, prog) in schedule.ranks.iter().enumerate().rev() {
        for c in (0..prog.channels.len()).rev() {
            work.push((r as Rank, c as u32));
        }
    }
    let mut deliveries = Vec::new();

    while let Some((rank, channel)) = work.pop() {
        queued[rank as usize][channel as usize] = false;
        let steps = &schedule.ranks[rank as usize].channels[channel as usize];
        loop {
            let index = pc[rank as usize][channel as usize];
            let Some(step) = steps.get(index as usize) else {
                break;
            };
            if !waits(step, rank, channel, &pc, &links, slots, true).is_empty() {
                break;
            }
            let at = StepAt {
                rank,
                channel,
                index,
            };
            let mut wake: Vec<(Rank, u32)> = Vec::new();
            let received: Vec<S::Payload> = step
                .recv_from
                .iter()
                .map(|&from| {
                    let link = Link {
                        from,
                        to: rank,
                        channel,
                    };
                    let msg = links
                        .get_mut(&link)
                        .and_then(VecDeque::pop_front)
                        .expect("checked ready");
                    deliveries.push((msg.from, at));
                    wake.push((from, channel));
                    msg.payload
                })
                .collect();
            let sent = semantics.fire(at, step, received);
            if let Some(payload) = sent {
                for &to in &step.send_to {
                    let link = Link {
                        from: rank,
                        to,
                        channel,
                    };
                    links.entry(link).or_default().push_back(Message {
                        from: at,
                        payload: payload.clone(),
                    });
                    wake.push((to, channel));
                }
            }
            pc[rank as usize][channel as usize] += 1;
            let other_channels = schedule.ranks[rank as usize].channels.len() as u32;
            wake.extend((0..other_channels).filter(|&c| c != channel).map(|c| (rank, c)));
            for (r, c) in wake {
                if let Some(q) = queued
                    .get_mut(r as usize)
                    .and_then(|v| v.get_mut(c as usize))
                    && !*q
                {
                    *q = true;
                    work.push((r, c));
                }
            }
        }
    }

    let mut stalled = Vec::new();
    for (r, prog) in schedule.ranks.iter().enumerate() {
        for (c, steps) in prog.channels.iter().enumerate() {
            let index = pc[r][c];
            if let Some(step) = steps.get(index as usize) {
                stalled.push(Stalled {
                    at: StepAt {
                        rank: r as Rank,
                        channel: c as u32,
                        index,
                    },
                    waits: waits(step, r as Rank, c as u32, &pc, &links, slots, false),
                });
            }
        }
    }
    let mut leftover: Vec<(Link, usize)> = links
        .into_iter()
        .filter(|(_, q)| !q.is_empty())
        .map(|(l, q)| (l, q.len()))
        .collect();
    leftover.sort();
    FlowOutcome {
        stalled,
        leftover,
        deliveries,
    }
}

/// What keeps `step` from firing now (empty when it can fire). With
/// `first_only`, stop at the first reason.
fn waits<P>(
    step: &Step,
    rank: Rank,
    channel: u32,
    pc: &[Vec<u32>],
    links: &HashMap<Link, VecDeque<Message<P>>>,
    slots: usize,
    first_only: bool,
) -> Vec<Wait> {
    let mut out = Vec::new();
    for dep in &step.after {
        if pc[rank as usize][dep.channel as usize] <= dep.step {
            out.push(Wait::Step(*dep));
            if first_only {
                return out;
            }
        }
    }
    for &from in &step.recv_from {
        let link = Link {
            from,
            to: rank,
            channel,
        };
        if links.get(&link).is_none_or(VecDeque::is_empty) {
            out.push(Wait::Message { from });
            if first_only {
                return out;
            }
        }
    }
    for &to in &step.send_to {
        let link = Link {
            from: rank,
            to,
            channel,
        };
        if links.get(&link).is_some_and(|q| q.len() >= slots) {
            out.push(Wait::Slot { to });
            if first_only {
                return out;
            }
        }
    }
    out
}
