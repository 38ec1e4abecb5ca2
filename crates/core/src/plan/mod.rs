//! The execution plan: one verified schedule compiled for one concrete call.
//!
//! A [`Schedule`](crate::Schedule) moves *chunks* and knows no element
//! count, type or op. An [`ExecutionPlan`] is where it meets a call — the
//! collective with its root, the count, the type, the op, in place or not,
//! the chunking and the slots per link — and everything an executor or the
//! simulator needs is resolved once, here:
//!
//! - per rank and channel, a flat list of [`Instruction`]s: the schedule's
//!   steps unrolled over every segment, each with its byte [`Region`]s in a
//!   physical buffer (input, output, scratch; in place only the caller's
//!   one buffer, [`Buffer::Output`]), the value's length, its messages
//!   ([`Message`]: peer, number on the link, slot) and the instructions of
//!   other channels it waits for ([`Wait`]);
//! - the facts the zero-copy paths need ([`Source`], [`Instruction::direct`],
//!   [`Instruction::stored_by_sender`]),
//!   derived once from the happens-before order of the schedule;
//! - the resources: scratch bytes, slots per link (at least what the
//!   verifier proved), every link with its messages and bytes ([`LinkLoad`]);
//! - where `Avg` divides ([`RankPlan::divide`]);
//! - a stable [`hash`](ExecutionPlan::hash) of all of it, which ranks
//!   compare so that a disagreement on any part of a call is caught.
//!
//! ```text
//!  Verified schedule ──┐
//!  call (collective,   ├─▶ compile ─▶ ExecutionPlan ─▶ threads │ processes │ simulator │ CUDA interpreter
//!  count, dtype, op,   │              (plain data,      each interprets it and derives nothing
//!  in place, chunking, │               JSON, hash)
//!  slots) ─────────────┘
//! ```
//!
//! ## The model executors implement
//! A rank's channels advance independently. The next instruction of a
//! channel *fires* when (1) every [`Wait`] is met — the named instruction of
//! another channel of the rank has fired —, (2) every link it receives from
//! holds its message, and (3) every link it sends on holds fewer than
//! [`slots_per_link`](ExecutionPlan::slots_per_link) messages. Firing
//! combines the received messages and the `read` region with the op (one
//! input alone is copied), stores the value in the `write` region and sends
//! it on every outgoing link. Message `k` of a link is the `k`-th send on it
//! and meets the `k`-th receive; it occupies slot `k % slots_per_link`.
//! [`Walk`] keeps a rank's cursors and checks (1); executors check (2) and
//! (3) with their own transports.
//!
//! ## Invariants of a compiled plan
//! - Every region lies inside its buffer ([`ExecutionPlan::buffer_bytes`]);
//!   the regions of an instruction and all its messages cover exactly
//!   [`Instruction::bytes`].
//! - The verifier's guarantees carry over: no instruction waits forever
//!   under the model, a read and a write of one instruction coincide or do
//!   not overlap, two instructions of different channels that touch the same
//!   bytes (one writing) are ordered.
//! - Plans are deterministic: every rank compiles the same plan, byte for
//!   byte, from the same schedule and call.
//!
//! [`ExecutionPlan::check`] re-establishes the structural part of these
//! for a plan that did not come from [`compile`] (a file, a hand-edited
//! copy); executors only run plans they compiled themselves.

mod check;
mod compile;
mod facts;
mod hash;

pub(crate) use hash::stable_hash;
mod layout;
mod oneshot;
mod render;
mod walk;

pub use check::PlanError;
pub use compile::{Chunking, Compiler, MAX_PLAN_INSTRUCTIONS, compile};
pub use layout::Layout;
pub use oneshot::{Gather, ONE_SHOT_BYTES, OneShot, OneShotRule, describe as one_shot_describe};
pub use render::human_bytes;
pub use walk::Walk;

use serde::{Deserialize, Serialize};

use crate::types::{Buffer, Collective, DataType, Link, Purpose, Rank, ReduceOp};

/// The version of the plan's JSON form (and of what its hash covers).
pub const PLAN_FORMAT_VERSION: u32 = 1;

/// The largest chunk the thread executor moves by default; the simulator
/// and the selector take the same number for threads. Every segment
/// boundary is a round of hand-offs between ranks, and with zero-copy
/// messages little is gained from finer pipelining: measured on 2 cores,
/// 64 MiB all-reduce, 4 MiB beat 1 MiB by 0.1–0.2 of the memory-bandwidth
/// ceiling at 4 ranks and matched it at 2 (docs/benchmarks.md).
pub const HOST_CHUNK_BYTES: usize = 4 << 20;

/// The largest chunk the CUDA executor moves by default; the simulator and
/// the selector take the same number for GPUs. Larger launches amortise the
/// launch cost on one device (NCCL's Simple protocol moves 512 KiB per
/// step slot).
pub const DEVICE_CHUNK_BYTES: usize = 2 << 20;

/// One verified schedule compiled for one call. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionPlan {
    /// [`PLAN_FORMAT_VERSION`].
    pub version: u32,
    /// The schedule's name (`ring`, `tree`, a file's name).
    pub schedule: String,
    /// A stable hash of the schedule's JSON form.
    pub schedule_hash: u64,
    /// The collective, with its root.
    pub collective: Collective,
    /// Elements per block (the per-rank `count` of the call).
    pub count: u64,
    /// The element type.
    pub dtype: DataType,
    /// The reduction op (recorded for agreement even where nothing reduces).
    pub op: ReduceOp,
    /// In place: the caller passes one buffer, [`Buffer::Output`].
    pub in_place: bool,
    /// What the call is for (a program's own call unless the library
    /// exchanges something of its own).
    #[serde(default, skip_serializing_if = "Purpose::is_user")]
    pub purpose: Purpose,
    /// Ranks.
    pub world_size: u32,
    /// Channels of the busiest rank.
    pub channels: u32,
    /// Chunks per block of the schedule.
    pub chunks_per_block: u32,
    /// Times the schedule runs, each over its own slice of every chunk.
    pub segments: u32,
    /// Bytes of the largest chunk of one segment.
    pub chunk_bytes: u64,
    /// Messages a link holds in flight; at least what the verifier proved.
    pub slots_per_link: u32,
    /// Bytes of each rank's input buffer (0 in place).
    pub input_bytes: u64,
    /// Bytes of each rank's output buffer (in place: the one buffer).
    pub output_bytes: u64,
    /// Bytes of scratch each rank needs.
    pub scratch_bytes: u64,
    /// `ranks[r]` is rank `r`'s part.
    pub ranks: Vec<RankPlan>,
    /// Every link some instruction sends on, with its traffic.
    pub links: Vec<LinkLoad>,
    /// A stable hash of everything above (see [`ExecutionPlan::compute_hash`]).
    pub hash: u64,
}

/// One rank's part of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankPlan {
    /// The rank.
    pub rank: Rank,
    /// `channels[c]` is channel `c`'s instructions, in firing order.
    pub channels: Vec<Vec<Instruction>>,
    /// With [`ReduceOp::Avg`]: the elements to divide by the world size
    /// once every channel has finished (`None`: nothing to divide here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub divide: Option<Region>,
}

/// One step of the schedule in one segment, resolved to bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instruction {
    /// The schedule step this is an instance of (its index on the channel).
    pub step: u32,
    /// The segment.
    pub segment: u32,
    /// Bytes of the value: of every received message, the `read` region,
    /// the `write` region and every sent message alike.
    pub bytes: u64,
    /// Messages to receive, one per peer, combined in this order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recv: Vec<Message>,
    /// Local bytes combined with the messages (or copied, alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<Region>,
    /// Where the value is stored locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<Region>,
    /// Messages to send, one per peer, each carrying the value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub send: Vec<Message>,
    /// Instructions of other channels of this rank that must have fired.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<Wait>,
    /// Where receivers may read the value without a copy.
    pub source: Source,
    /// Set on a plain receive into `write` (one message, nothing read, no
    /// wait): the sender may store the value straight into `write`, and
    /// this rank may announce that destination from instruction `direct`
    /// of this channel on — nothing from there up to this instruction
    /// touches those bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<u32>,
    /// Set on a direct receive whose sender may store the value into
    /// `write` whenever its own instruction fires, with no announcement:
    /// every other access to those bytes — by this rank, by a peer storing
    /// into them, or by a peer reading a value there in place — happens
    /// before the sender's instruction or after this one. The device
    /// executor's senders store such messages straight into the
    /// receiver's buffer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stored_by_sender: bool,
}

impl Instruction {
    /// Values combined: messages plus the local read.
    pub fn inputs(&self) -> usize {
        self.recv.len() + usize::from(self.read.is_some())
    }

    /// True when two or more values are combined with the op.
    pub fn reduces(&self) -> bool {
        self.inputs() > 1
    }

    /// The NCCL-style name of what it does: `recv_reduce_copy_send`, ...
    pub fn primitive_name(&self) -> String {
        crate::schedule::primitive_name(
            !self.recv.is_empty(),
            self.reduces(),
            self.write.is_some(),
            !self.send.is_empty(),
        )
    }
}

/// One end of a message: the peer, the message's number on its link within
/// the call, and the slot it occupies (`index % slots_per_link`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// The rank at the other end.
    pub peer: Rank,
    /// Its number on the link (sender, receiver, channel), from 0 in each call.
    pub index: u64,
    /// The link slot it occupies.
    pub slot: u32,
}

/// Instruction `index` of `channel` (same rank) must have fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wait {
    /// The channel.
    pub channel: u32,
    /// The instruction's index on that channel.
    pub index: u32,
}

/// Contiguous bytes of one buffer, in value order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    /// The physical buffer.
    pub buffer: Buffer,
    /// Its pieces; the value is their concatenation. Empty for a zero-length value.
    pub pieces: Vec<Piece>,
}

impl Region {
    /// Total bytes of the pieces.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.bytes).sum()
    }
}

/// `bytes` bytes from byte `offset` of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Piece {
    /// Byte offset into the buffer.
    pub offset: u64,
    /// Length in bytes.
    pub bytes: u64,
}

/// Where the receivers of an instruction's value may read it without a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Nowhere stable: the value is materialised in each link's slot.
    Slot,
    /// In the `write` region: every other write to it happens before this
    /// instruction or after every receiver has read it.
    Write,
    /// In the `read` region, under the same condition (nothing received).
    Read,
}

/// A link's traffic in one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkLoad {
    /// The link.
    pub link: Link,
    /// Messages sent on it.
    pub messages: u64,
    /// Bytes sent on it, over all messages.
    pub bytes: u64,
    /// The largest message, in bytes.
    pub largest: u64,
}

impl LinkLoad {
    /// A link that has carried nothing yet.
    pub fn new(link: Link) -> Self {
        LinkLoad {
            link,
            messages: 0,
            bytes: 0,
            largest: 0,
        }
    }

    /// Count one message of `bytes` on the link.
    pub fn count(&mut self, bytes: u64) {
        self.messages += 1;
        self.bytes += bytes;
        self.largest = self.largest.max(bytes);
    }
}

impl ExecutionPlan {
    /// The bytes the call touches on one host: every rank's input, output
    /// and scratch (what a host's kernels weigh against its last-level
    /// cache, which the ranks share).
    pub fn host_bytes(&self) -> u64 {
        let per_rank = self.input_bytes + self.output_bytes + self.scratch_bytes;
        per_rank.saturating_mul(u64::from(self.world_size))
    }

    /// When every value sent can be read where it lies, in the input or
    /// the output (never a slot or scratch), the most pieces one of them
    /// has; `None` otherwise. A group whose buffers all sit in memory its
    /// peers map can then send every message as a reference to those
    /// pieces, and no message has to fit a transport's slot.
    pub fn lent_pieces(&self) -> Option<usize> {
        let sends = self.ranks.iter().flat_map(|r| r.channels.iter().flatten());
        sends
            .filter(|i| !i.send.is_empty())
            .map(|i| {
                let region = match i.source {
                    Source::Read => i.read.as_ref(),
                    Source::Write => i.write.as_ref(),
                    Source::Slot => None,
                };
                region
                    .filter(|r| r.buffer != Buffer::Scratch)
                    .map(|r| r.pieces.len())
            })
            .try_fold(0, |most, n| n.map(|n| most.max(n)))
    }

    /// Bytes of `buffer` on every rank.
    pub fn buffer_bytes(&self, buffer: Buffer) -> u64 {
        match buffer {
            Buffer::Input => self.input_bytes,
            Buffer::Output => self.output_bytes,
            Buffer::Scratch => self.scratch_bytes,
        }
    }

    /// Bytes of one element.
    pub fn element_bytes(&self) -> usize {
        self.dtype.size_bytes()
    }

    /// The nccl-tests size of the call: the larger of one rank's buffers.
    pub fn size_bytes(&self) -> u64 {
        let n = self.world_size;
        let blocks = self.collective.size_blocks(n);
        u64::from(blocks) * self.count * self.dtype.size_bytes() as u64
    }

    /// Total instructions over every rank and channel.
    pub fn instruction_count(&self) -> usize {
        self.ranks
            .iter()
            .flat_map(|r| &r.channels)
            .map(Vec::len)
            .sum()
    }

    /// The JSON form (pretty-printed), which `ferrocoll plan --json` prints.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plans serialise")
    }

    /// Parse a plan from its JSON form and [`check`](Self::check) it.
    pub fn from_json(text: &str) -> Result<Self, PlanError> {
        let plan: ExecutionPlan =
            serde_json::from_str(text).map_err(|e| PlanError::Malformed(e.to_string()))?;
        plan.check()?;
        Ok(plan)
    }

    /// The call in one line, with the plan's hash: what ranks compare.
    pub fn signature(&self) -> String {
        let purpose = match self.purpose {
            Purpose::User => String::new(),
            other => format!("{other} "),
        };
        format!(
            "{purpose}{} count={} type={} op={} in_place={} plan={:016x}",
            self.collective, self.count, self.dtype, self.op, self.in_place, self.hash
        )
    }
}

#[cfg(test)]
pub(crate) mod tests;
