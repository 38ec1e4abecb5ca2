//! Why a plan could not be compiled, and the structural check of a plan
//! that did not come from [`compile`](super::compile) (a file, an edited copy).

use std::collections::BTreeMap;

use thiserror::Error;

use super::{ExecutionPlan, Instruction, LinkLoad, PLAN_FORMAT_VERSION, Region};
use crate::types::{Collective, Link, Rank};

/// Why a call has no plan, or a plan is not well formed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    /// The schedule computes another collective (or another root).
    #[error("schedule `{schedule}` computes {proven}, not {called}")]
    WrongCollective {
        /// The schedule's name.
        schedule: String,
        /// What it was proven for.
        proven: Collective,
        /// What the call asks for.
        called: Collective,
    },
    /// The schedule was not proven for the in-place call.
    #[error("{collective} with schedule `{schedule}` has no proven in-place form")]
    InPlaceUnproven {
        /// The schedule's name.
        schedule: String,
        /// Its collective.
        collective: Collective,
    },
    /// The executor's links hold fewer messages than the proof assumed.
    #[error(
        "the schedule was proven deadlock-free with {proven} slots per link; the executor has {given}"
    )]
    TooFewSlots {
        /// Slots the verifier proved the schedule with.
        proven: u32,
        /// Slots the executor offers.
        given: u32,
    },
    /// The plan would be too large to hold.
    #[error("plan too large: {value} {what} (limit {limit})")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// How large it would be.
        value: u64,
        /// The limit.
        limit: u64,
    },
    /// Not valid JSON, or not the plan format.
    #[error("malformed plan: {0}")]
    Malformed(String),
    /// A plan whose parts contradict each other.
    #[error("invalid plan: {0}")]
    Invalid(String),
}

fn invalid<T>(what: String) -> Result<T, PlanError> {
    Err(PlanError::Invalid(what))
}

impl ExecutionPlan {
    /// Check the structure executors and the simulator rely on: ranks,
    /// peers, channels and waits in range; regions inside their buffers
    /// and as long as their instruction's value; messages numbered in
    /// order on each link, every one received, at the length it was sent;
    /// the link table and the hash matching the instructions.
    pub fn check(&self) -> Result<(), PlanError> {
        if self.version != PLAN_FORMAT_VERSION {
            return invalid(format!(
                "format version {} (this build reads {PLAN_FORMAT_VERSION})",
                self.version
            ));
        }
        let n = self.world_size;
        if n == 0 || self.ranks.len() != n as usize || self.slots_per_link == 0 {
            return invalid(format!(
                "world size {n} with {} rank parts and {} slots per link",
                self.ranks.len(),
                self.slots_per_link
            ));
        }
        for (r, rp) in self.ranks.iter().enumerate() {
            if rp.rank != r as Rank {
                return invalid(format!("rank part {r} says it is rank {}", rp.rank));
            }
            if rp.channels.len() > self.channels as usize {
                return invalid(format!(
                    "rank {r} has {} channels; the plan says at most {}",
                    rp.channels.len(),
                    self.channels
                ));
            }
            for (c, list) in rp.channels.iter().enumerate() {
                for (i, ins) in list.iter().enumerate() {
                    self.check_instruction(rp, c, i, ins).map_err(|e| {
                        PlanError::Invalid(format!("rank {r} channel {c} instruction {i}: {e}"))
                    })?;
                }
            }
            if let Some(d) = &rp.divide {
                self.check_region(d, d.bytes())
                    .map_err(|e| PlanError::Invalid(format!("rank {r} divide: {e}")))?;
            }
        }
        let busiest = self
            .ranks
            .iter()
            .map(|r| r.channels.len())
            .max()
            .unwrap_or(0);
        if busiest != self.channels as usize {
            return invalid(format!(
                "the plan says {} channels; its busiest rank has {busiest}",
                self.channels
            ));
        }
        self.check_messages()?;
        let computed = self.compute_hash();
        if computed != self.hash {
            return invalid(format!(
                "hash {:016x} does not match its contents ({computed:016x})",
                self.hash
            ));
        }
        Ok(())
    }

    fn check_instruction(
        &self,
        rp: &super::RankPlan,
        channel: usize,
        index: usize,
        ins: &Instruction,
    ) -> Result<(), String> {
        let n = self.world_size;
        for ms in [&ins.recv, &ins.send] {
            if ms
                .iter()
                .enumerate()
                .any(|(i, m)| ms[..i].iter().any(|o| o.peer == m.peer))
            {
                return Err("one peer twice in one instruction".into());
            }
        }
        for m in ins.recv.iter().chain(&ins.send) {
            if m.peer >= n || m.peer == rp.rank {
                return Err(format!("peer {} of a {n}-rank plan", m.peer));
            }
            if u64::from(m.slot) != m.index % u64::from(self.slots_per_link) {
                return Err(format!("message {} in slot {}", m.index, m.slot));
            }
        }
        if ins.inputs() == 0 || (ins.write.is_none() && ins.send.is_empty()) {
            return Err("nothing in or nothing out".into());
        }
        for w in &ins.after {
            let len = rp.channels.get(w.channel as usize).map_or(0, Vec::len);
            if w.channel as usize == channel || w.index as usize >= len {
                return Err(format!("waits for channel {} index {}", w.channel, w.index));
            }
        }
        if ins.direct.is_some_and(|d| d as usize > index) {
            return Err("announces a direct receive after it".into());
        }
        if ins.stored_by_sender && ins.direct.is_none() {
            return Err("has its sender store into it without being a direct receive".into());
        }
        for region in [&ins.read, &ins.write].into_iter().flatten() {
            self.check_region(region, ins.bytes)?;
        }
        Ok(())
    }

    fn check_region(&self, region: &Region, bytes: u64) -> Result<(), String> {
        let size = self.buffer_bytes(region.buffer);
        let mut total = 0u64;
        for p in &region.pieces {
            let end = p.offset.checked_add(p.bytes);
            if end.is_none_or(|e| e > size) {
                return Err(format!(
                    "piece +{} of {} bytes outside its {size}-byte buffer",
                    p.offset, p.bytes
                ));
            }
            total = total.saturating_add(p.bytes);
        }
        if total != bytes {
            return Err(format!("region of {total} bytes for a {bytes}-byte value"));
        }
        Ok(())
    }

    /// Message `k` of every link is sent and received exactly once, in
    /// order, at one length; the link table says the same.
    fn check_messages(&self) -> Result<(), PlanError> {
        let mut sent: BTreeMap<Link, Vec<u64>> = BTreeMap::new();
        let mut received: BTreeMap<Link, Vec<u64>> = BTreeMap::new();
        for (r, rp) in self.ranks.iter().enumerate() {
            for (c, list) in rp.channels.iter().enumerate() {
                for ins in list {
                    for (ms, into, outgoing) in [
                        (&ins.send, &mut sent, true),
                        (&ins.recv, &mut received, false),
                    ] {
                        for m in ms {
                            let (from, to) = if outgoing {
                                (r as Rank, m.peer)
                            } else {
                                (m.peer, r as Rank)
                            };
                            let lengths = into
                                .entry(Link {
                                    from,
                                    to,
                                    channel: c as u32,
                                })
                                .or_default();
                            if m.index != lengths.len() as u64 {
                                return invalid(format!(
                                    "{from}->{to} channel {c}: message {} out of order",
                                    m.index
                                ));
                            }
                            lengths.push(ins.bytes);
                        }
                    }
                }
            }
        }
        if sent != received {
            let bad = sent
                .iter()
                .find(|(l, v)| received.get(l) != Some(v))
                .map(|(l, _)| *l)
                .or_else(|| received.keys().find(|l| !sent.contains_key(l)).copied());
            return invalid(format!("messages sent and received differ on {bad:?}"));
        }
        let loads: Vec<LinkLoad> = sent
            .iter()
            .map(|(&link, lengths)| LinkLoad {
                link,
                messages: lengths.len() as u64,
                bytes: lengths.iter().sum(),
                largest: lengths.iter().copied().max().unwrap_or(0),
            })
            .collect();
        if loads != self.links {
            return invalid("the link table does not match the instructions".into());
        }
        Ok(())
    }
}
