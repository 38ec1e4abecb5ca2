//! The device program: an [`ExecutionPlan`] lowered to flat, fixed-size
//! records that a persistent kernel (one thread block per channel) walks,
//! and the memory layout its peers share — where each link's slots and
//! sequence counters live.
//!
//! Nothing here decides what moves where: every offset, length, peer and
//! message number is the plan's. The lowering flattens the plan's vectors
//! into index ranges (the device cannot chase `Vec`s), picks how each
//! message travels from the plan's zero-copy facts ([`Transfer`]), and
//! checks that the plan fits the layout the communicator set up.
//!
//! # The protocol the records drive
//!
//! Every rank owns an *inbox*: for each (channel, sender) a ring of
//! `slots` slots of `slot_bytes`, written by the sender straight into the
//! receiver's memory (over NVLink/P2P on a GPU). Two counters per link
//! order it, each written by one side only and never reset, so a call
//! needs no host work between calls:
//!
//! - `posted[c][from]`, in the receiver's memory: messages the sender has
//!   finished (stored, or made readable) on the link, ever;
//! - `consumed[c][to]`, in the sender's memory: messages the receiver has
//!   finished reading, ever.
//!
//! Message `i` of a call on a link is message `g = base + i` of the link's
//! life, where `base` counts the link's messages in earlier calls — both
//! ends count the same plans, so they agree. A staged message occupies
//! slot `g % slots`; the sender stores it once `consumed ≥ g + 1 − slots`
//! and then publishes `posted = g + 1`; the receiver reads it once
//! `posted ≥ g + 1` and then publishes `consumed = g + 1`.
//!
//! Where ranks address each other's buffers ([`Layout::zero_copy`]), the
//! plan's facts let most messages skip the slot: a value that stays put in
//! the sender's buffer until every receiver has read it
//! ([`Source`](ferrocoll_core::plan::Source)) is read there by the
//! receiver ([`Transfer::InSender`]; the sender's call ends only once
//! such messages are consumed), and a receive its sender may store into
//! unannounced ([`Instruction::stored_by_sender`](ferrocoll_core::plan::Instruction::stored_by_sender))
//! is stored there by the sender ([`Transfer::InReceiver`]). Direct
//! all-reduce then moves each byte once: the owner of a chunk reads every
//! peer's input chunk in place and stores the sum into every peer's
//! output. The counters order these as they order slots. Each rank
//! publishes its buffers' addresses in its window for the call (they come
//! from the launch's parameters, so a captured graph replays correctly).
//!
//! Before its first store to a peer in a call, a block compares the
//! peer's *hello* word for its channel — the call's sequence number and the
//! plan's hash, which every block writes first thing — with its own: ranks
//! that disagree on the call fail it with a mismatch before any of their
//! data lands in the other's memory. The kernel's own source runs on CPU
//! threads in the tests (`crate::host_kernel`), so offsets, slot reuse, the
//! transfers and the counters are tested on machines without a GPU.

pub mod abi;
mod layout;
mod lower;
pub mod params;
#[cfg(all(test, unix))]
mod tests;
mod validate;

pub use abi::{
    After, BufferId, Channel, Count, End, MAX_RANKS, Op, Params, Piece, Region, Scope, Span,
    Tables, Transfer,
};
pub use layout::{Layout, State, Window};

use ferrocoll_core::plan::ExecutionPlan;
use thiserror::Error;

/// Why a plan does not fit the layout.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProgramError {
    /// The plan's world size differs from the communicator's.
    #[error("the plan is for {plan} ranks; this communicator has {layout}")]
    WorldSize {
        /// The plan's.
        plan: u32,
        /// The layout's.
        layout: u32,
    },
    /// More channels than the inboxes were set up for.
    #[error("the plan uses {plan} channels; the device buffers were set up for {layout}")]
    Channels {
        /// The plan's.
        plan: u32,
        /// The layout's.
        layout: u32,
    },
    /// A message larger than a slot, or fewer slots than the plan assumes.
    #[error("{0}")]
    Slots(String),
    /// More records than the 32-bit indices of the device format hold, or
    /// more ranks than [`MAX_RANKS`].
    #[error("the plan is too large for the device format: {0}")]
    TooLarge(String),
    /// The plan, or a program edited after lowering, contradicts itself.
    #[error("invalid device program: {0}")]
    Invalid(String),
}

/// One rank's records.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RankProgram {
    /// `channels[c]`: channel `c`'s runs of the tables below.
    pub channels: Vec<Channel>,
    /// Every instruction, channel after channel.
    pub ops: Vec<Op>,
    /// Pieces of every region, channel after channel (remote regions
    /// too), then the division's.
    pub pieces: Vec<Piece>,
    /// Ends of every message.
    pub ends: Vec<End>,
    /// Every wait.
    pub afters: Vec<After>,
    /// With `Avg`: the region to divide by the world size at the end.
    pub divide: Option<Region>,
    /// Messages this rank sends per (channel, receiver) in a call: what
    /// the link's `base` grows by.
    pub sent: Vec<Count>,
    /// Messages this rank receives per (channel, sender), likewise.
    pub received: Vec<Count>,
}

/// How messages travel: the selector's [`Protocol`], one type from the
/// choice to the kernel.
pub use ferrocoll_core::select::Protocol;

/// A plan lowered for a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProgram {
    /// The plan's hash: what the hello words carry.
    pub hash: u64,
    /// The element type.
    pub dtype: ferrocoll_core::DataType,
    /// The reduction (with `Avg`, the sum; `divide` finishes it).
    pub op: ferrocoll_core::ReduceOp,
    /// The layout it was lowered for.
    pub layout: Layout,
    /// How its messages travel.
    pub protocol: Protocol,
    /// Bytes of each rank's input, output and scratch.
    pub input_bytes: u64,
    /// See `input_bytes`.
    pub output_bytes: u64,
    /// See `input_bytes`.
    pub scratch_bytes: u64,
    /// Per rank.
    pub ranks: Vec<RankProgram>,
}

impl DeviceProgram {
    /// Lower `plan` for `layout` with messages sent by `protocol`, or say
    /// why it does not fit.
    pub fn lower(
        plan: &ExecutionPlan,
        layout: Layout,
        protocol: Protocol,
    ) -> Result<Self, ProgramError> {
        plan.check()
            .map_err(|e| ProgramError::Invalid(e.to_string()))?;
        lower::check(plan, &layout, protocol)?;
        let transfers = lower::transfers(plan, &layout, protocol);
        let ranks = plan
            .ranks
            .iter()
            .map(|r| lower::rank(r, &layout, &transfers))
            .collect::<Result<Vec<_>, _>>()?;
        let program = DeviceProgram {
            hash: plan.hash,
            dtype: plan.dtype,
            op: plan.op,
            layout,
            protocol,
            input_bytes: plan.input_bytes,
            output_bytes: plan.output_bytes,
            scratch_bytes: plan.scratch_bytes,
            ranks,
        };
        lower::check_link_counts(plan, &program)?;
        program.validate()?;
        Ok(program)
    }

    /// What the hello words compare: the plan and the layout it was
    /// lowered for (ranks that set up different slots would compute
    /// different slot offsets for the same plan, and a different
    /// `zero_copy` means other transfers).
    pub fn agreement(&self) -> u64 {
        let l = &self.layout;
        let mut h = self.hash;
        for x in [
            u64::from(l.world_size),
            u64::from(l.max_channels),
            u64::from(l.slots),
            l.slot_bytes,
            l.ll_slot_bytes,
            u64::from(l.zero_copy),
            self.protocol as u64,
        ] {
            h = (h ^ x).wrapping_mul(0x0100_0000_01b3).rotate_left(29);
        }
        h
    }

    /// Every index, peer, piece, length and transfer within bounds: what
    /// the kernel's walk of the records relies on. The fields are public,
    /// so a program edited after lowering is checked again before it
    /// runs.
    pub fn validate(&self) -> Result<(), ProgramError> {
        let l = &self.layout;
        let bad = |why: String| Err(ProgramError::Invalid(why));
        l.check()?;
        if self.ranks.len() != l.world_size as usize {
            return bad(format!(
                "{} rank programs for {} ranks",
                self.ranks.len(),
                l.world_size
            ));
        }
        let sizes = [self.input_bytes, self.output_bytes, self.scratch_bytes];
        for (r, p) in self.ranks.iter().enumerate() {
            if let Err(why) = validate::validate_rank(p, l, self.protocol, &sizes) {
                return bad(format!("rank {r}: {why}"));
            }
        }
        validate::validate_ends_agree(&self.ranks).map_err(ProgramError::Invalid)
    }
}
