//! The device program: an [`ExecutionPlan`] lowered to flat, fixed-size
//! records that a persistent kernel (one thread block per channel) walks
//! from device memory, and the memory layout its peers share — where each
//! link's slots and sequence counters live.
//!
//! Nothing here decides what moves where: every offset, length, peer and
//! message number is the plan's. The lowering only flattens the plan's
//! vectors into index ranges (the device cannot chase `Vec`s) and checks
//! that the plan fits the layout the communicator set up.
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
//!   finished storing on the link, ever;
//! - `consumed[c][to]`, in the sender's memory: messages the receiver has
//!   finished reading, ever.
//!
//! Message `i` of a call on a link is message `g = base + i` of the link's
//! life, where `base` counts the link's messages in earlier calls — both
//! ends count the same plans, so they agree. It occupies slot `g % slots`;
//! the sender stores it once `consumed ≥ g + 1 − slots` and then publishes
//! `posted = g + 1` (release); the receiver reads it once `posted ≥ g + 1`
//! (acquire) and then publishes `consumed = g + 1`.
//!
//! Before its first store to a peer in a call, a block compares the
//! peer's *hello* word for its channel — the call's sequence number and the
//! plan's hash, which every block writes first thing — with its own: ranks
//! that disagree on the call fail it with a mismatch before any of their
//! data lands in the other's memory. [`emulate`] runs this protocol with
//! threads standing in for blocks, so offsets, slot reuse and the counters
//! are tested on machines without a GPU.

pub mod emulate;
#[cfg(all(test, unix))]
pub mod host_kernel;
mod layout;
pub mod params;

pub use layout::{Layout, State, Window};

use ferrocoll_core::plan::{ExecutionPlan, Region};
use ferrocoll_core::schedule::Buffer;
use thiserror::Error;

/// Ranks a device program may have: the kernel's per-peer tables
/// (`FC_MAX_RANKS` in `cuda/interpret.cu`), which also bound the messages
/// one instruction receives or sends (one per peer).
pub const MAX_RANKS: u32 = 64;

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

/// A run of records in one of a rank's tables: `count` from `first`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    /// The first record.
    pub first: u32,
    /// How many.
    pub count: u32,
}

/// Which buffer a region is in, as the device encodes it.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferId {
    /// The caller's input.
    Input = 0,
    /// The caller's output (in place: the one buffer).
    Output = 1,
    /// The communicator's scratch.
    Scratch = 2,
    /// No region: the instruction does not read (or write).
    None = 3,
}

impl From<Buffer> for BufferId {
    fn from(b: Buffer) -> Self {
        match b {
            Buffer::Input => BufferId::Input,
            Buffer::Output => BufferId::Output,
            Buffer::Scratch => BufferId::Scratch,
        }
    }
}

/// A local region: its buffer and its pieces in the rank's piece table
/// (`BufferId::None`: no region — the device format has no `Option`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Local {
    /// The buffer.
    pub buffer: BufferId,
    /// Its pieces, whose concatenation is the value.
    pub pieces: Span,
}

impl Local {
    /// No region.
    pub const NONE: Local = Local {
        buffer: BufferId::None,
        pieces: Span { first: 0, count: 0 },
    };

    /// The region, if there is one.
    pub fn get(&self) -> Option<&Local> {
        (self.buffer != BufferId::None).then_some(self)
    }
}

/// `bytes` bytes from byte `offset` of a buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Byte offset.
    pub offset: u64,
    /// Bytes.
    pub bytes: u64,
}

/// One end of a message: the peer and the message's number on the link
/// within the call.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// The rank at the other end.
    pub peer: u32,
    /// Always 0: the bytes `index`'s alignment leaves, named so that a
    /// packed table has no uninitialised padding.
    pub reserved: u32,
    /// Its number on the link in this call, from 0.
    pub index: u64,
}

/// Instruction `index` of `channel` (same rank) must have fired.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct After {
    /// The channel.
    pub channel: u32,
    /// The instruction's index on it.
    pub index: u32,
}

/// One instruction: receive, combine with a local read, write, send.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// Bytes of the value.
    pub bytes: u64,
    /// Messages to combine, in order (ends in the rank's table).
    pub recv: Span,
    /// The local read combined after them ([`Local::NONE`]: none).
    pub read: Local,
    /// Where the value is stored ([`Local::NONE`]: nowhere).
    pub write: Local,
    /// Messages carrying the value.
    pub send: Span,
    /// Instructions of other channels to wait for.
    pub after: Span,
}

/// Messages a rank moves on one link in a call.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// The link, by [`Layout::link_word`].
    pub word: u64,
    /// Its messages in one call.
    pub count: u64,
}

/// One rank's records.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RankProgram {
    /// `channels[c]`: channel `c`'s instructions in `ops`.
    pub channels: Vec<Span>,
    /// Every instruction, channel after channel.
    pub ops: Vec<Op>,
    /// Pieces of every region.
    pub pieces: Vec<Piece>,
    /// Ends of every message.
    pub ends: Vec<End>,
    /// Every wait.
    pub afters: Vec<After>,
    /// With `Avg`: the region to divide by the world size at the end.
    pub divide: Option<Local>,
    /// Messages this rank sends per (channel, receiver) in a call: what
    /// the link's `base` grows by.
    pub sent: Vec<Count>,
    /// Messages this rank receives per (channel, sender), likewise.
    pub received: Vec<Count>,
}

/// How messages travel.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Into the inbox's slots, then announced by `posted` (after a fence):
    /// one round trip per message, full bandwidth.
    Simple = 0,
    /// Into the LL inbox, 8 data bytes per 16-byte line, each half carrying
    /// the message's flag: the receiver polls the data itself, with no
    /// fence and no separate announcement — half the bandwidth, a fraction
    /// of the latency (NCCL's LL protocol works the same way).
    Ll = 1,
}

impl Protocol {
    /// The flag of message `g` of a link (its number over the link's
    /// life): never 0 (what an unused slot holds), and different from the
    /// flag of the message that used the slot before it (`g − slots`).
    /// Lines a shorter later message leaves untouched keep an older
    /// message's flag, which equals this one only after
    /// lcm(2³² − 1, slots) messages on the link (1.7 · 10¹⁰ at 4 slots).
    pub fn ll_flag(g: u64) -> u32 {
        ((g + 1) % 0xffff_ffff) as u32 + 1
    }
}

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
        check(plan, &layout, protocol)?;
        let ranks = plan
            .ranks
            .iter()
            .map(|r| lower_rank(r, &layout))
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
        // Each link's messages per call are the plan's own count.
        for l in &plan.links {
            let word = layout.link_word(l.link.channel, l.link.to) as u64;
            let sent = program.ranks[l.link.from as usize]
                .sent
                .iter()
                .find(|c| c.word == word)
                .map_or(0, |c| c.count);
            if sent != l.messages {
                return Err(ProgramError::Invalid(format!(
                    "link {}->{} channel {}: {} messages lowered, the plan has {}",
                    l.link.from, l.link.to, l.link.channel, sent, l.messages
                )));
            }
        }
        program.validate()?;
        Ok(program)
    }

    /// What the hello words compare: the plan and the layout it was
    /// lowered for (ranks that set up different slots would compute
    /// different slot offsets for the same plan).
    pub fn agreement(&self) -> u64 {
        let l = &self.layout;
        let mut h = self.hash;
        for x in [
            u64::from(l.world_size),
            u64::from(l.max_channels),
            u64::from(l.slots),
            l.slot_bytes,
            l.ll_slot_bytes,
            self.protocol as u64,
        ] {
            h = (h ^ x).wrapping_mul(0x0100_0000_01b3).rotate_left(29);
        }
        h
    }

    /// Every index, peer, piece and length within bounds: what a walk of
    /// the records (the emulation's, the kernel's) relies on. The fields
    /// are public, so a program edited after lowering is checked again
    /// before it runs.
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
        let largest = match self.protocol {
            Protocol::Simple => l.slot_bytes,
            Protocol::Ll => l.ll_message_bytes(),
        };
        for (r, p) in self.ranks.iter().enumerate() {
            if let Err(why) = p.validate(l, &sizes, largest) {
                return bad(format!("rank {r}: {why}"));
            }
        }
        Ok(())
    }
}

impl RankProgram {
    fn validate(&self, l: &Layout, sizes: &[u64; 3], largest: u64) -> Result<(), String> {
        let within = |s: Span, len: usize, what: &str| {
            if u64::from(s.first) + u64::from(s.count) > len as u64 {
                return Err(format!("{what} {}..+{} past {len}", s.first, s.count));
            }
            Ok(())
        };
        if self.channels.len() > l.max_channels as usize {
            return Err(format!(
                "{} channels, the layout has {}",
                self.channels.len(),
                l.max_channels
            ));
        }
        for &c in &self.channels {
            within(c, self.ops.len(), "instructions")?;
        }
        let region = |r: &Local, bytes: u64| -> Result<(), String> {
            let Some(r) = r.get() else { return Ok(()) };
            within(r.pieces, self.pieces.len(), "pieces")?;
            let size = sizes[r.buffer as usize];
            let pieces =
                &self.pieces[r.pieces.first as usize..(r.pieces.first + r.pieces.count) as usize];
            if pieces
                .iter()
                .any(|p| p.offset.checked_add(p.bytes).is_none_or(|end| end > size))
            {
                return Err(format!(
                    "a piece past the {size} bytes of buffer {:?}",
                    r.buffer
                ));
            }
            let total = pieces
                .iter()
                .fold(0u64, |sum, p| sum.saturating_add(p.bytes));
            if total != bytes {
                return Err(format!("a region of {total} bytes for a value of {bytes}"));
            }
            Ok(())
        };
        for op in &self.ops {
            if op.recv.count > MAX_RANKS || op.send.count > MAX_RANKS {
                return Err(format!(
                    "an instruction with {} messages in and {} out; the device holds {MAX_RANKS} each",
                    op.recv.count, op.send.count
                ));
            }
            within(op.recv, self.ends.len(), "message ends")?;
            within(op.send, self.ends.len(), "message ends")?;
            within(op.after, self.afters.len(), "waits")?;
            region(&op.read, op.bytes)?;
            region(&op.write, op.bytes)?;
            let ends = [op.recv, op.send]
                .into_iter()
                .flat_map(|s| self.ends[s.first as usize..(s.first + s.count) as usize].iter());
            if ends.clone().any(|e| e.peer >= l.world_size) {
                return Err("a message to a rank past the world size".into());
            }
            if (op.recv.count + op.send.count > 0) && op.bytes > largest {
                return Err(format!(
                    "a message of {} bytes where a slot carries {largest}",
                    op.bytes
                ));
            }
            if op.recv.count == 0 && op.read.get().is_none() {
                return Err("an instruction with no input".into());
            }
            let afters =
                &self.afters[op.after.first as usize..(op.after.first + op.after.count) as usize];
            if afters
                .iter()
                .any(|a| a.channel as usize >= self.channels.len())
            {
                return Err("a wait on a channel this rank does not run".into());
            }
        }
        if let Some(d) = &self.divide {
            if d.get().is_none() {
                return Err("a division of no region".into());
            }
            within(d.pieces, self.pieces.len(), "pieces")?;
            let bytes = self.pieces[d.pieces.first as usize..][..d.pieces.count as usize]
                .iter()
                .fold(0u64, |sum, p| sum.saturating_add(p.bytes));
            region(d, bytes)?;
        }
        for c in self.sent.iter().chain(&self.received) {
            if c.word >= l.link_words() as u64 {
                return Err(format!(
                    "a link count for word {} of {}",
                    c.word,
                    l.link_words()
                ));
            }
        }
        Ok(())
    }
}

fn check(plan: &ExecutionPlan, layout: &Layout, protocol: Protocol) -> Result<(), ProgramError> {
    layout.check()?;
    if plan.world_size != layout.world_size {
        return Err(ProgramError::WorldSize {
            plan: plan.world_size,
            layout: layout.world_size,
        });
    }
    if plan.channels > layout.max_channels {
        return Err(ProgramError::Channels {
            plan: plan.channels,
            layout: layout.max_channels,
        });
    }
    if plan.slots_per_link > layout.slots {
        return Err(ProgramError::Slots(format!(
            "the plan needs {} slots per link; the device buffers hold {}",
            plan.slots_per_link, layout.slots
        )));
    }
    if protocol == Protocol::Ll
        && let Some(l) = plan
            .links
            .iter()
            .find(|l| l.largest > layout.ll_message_bytes())
    {
        return Err(ProgramError::Slots(format!(
            "a message of {} bytes on link {}->{} channel {} does not fit an LL slot, which carries {}",
            l.largest,
            l.link.from,
            l.link.to,
            l.link.channel,
            layout.ll_message_bytes()
        )));
    }
    if let Some(l) = plan.links.iter().find(|l| l.largest > layout.slot_bytes) {
        return Err(ProgramError::Slots(format!(
            "a message of {} bytes on link {}->{} channel {} does not fit a slot of {} (cut the chunks smaller)",
            l.largest, l.link.from, l.link.to, l.link.channel, layout.slot_bytes
        )));
    }
    Ok(())
}

/// A table's next index, or why the device format cannot hold it.
fn next_index<T>(table: &[T], what: &str) -> Result<u32, ProgramError> {
    u32::try_from(table.len()).map_err(|_| ProgramError::TooLarge(format!("over 2^32 {what}")))
}

fn lower_rank(
    plan: &ferrocoll_core::plan::RankPlan,
    layout: &Layout,
) -> Result<RankProgram, ProgramError> {
    let mut p = RankProgram::default();
    let mut sent = std::collections::BTreeMap::new();
    let mut received = std::collections::BTreeMap::new();
    for (c, instructions) in plan.channels.iter().enumerate() {
        let first = next_index(&p.ops, "instructions")?;
        for ins in instructions {
            let recv = ends(&mut p, &ins.recv)?;
            let send = ends(&mut p, &ins.send)?;
            for m in &ins.recv {
                let n = received
                    .entry(layout.link_word(c as u32, m.peer))
                    .or_insert(0);
                *n = (*n).max(m.index + 1);
            }
            for m in &ins.send {
                let n = sent.entry(layout.link_word(c as u32, m.peer)).or_insert(0);
                *n = (*n).max(m.index + 1);
            }
            let after_first = next_index(&p.afters, "waits")?;
            p.afters.extend(ins.after.iter().map(|w| After {
                channel: w.channel,
                index: w.index,
            }));
            let read = ins
                .read
                .as_ref()
                .map_or(Ok(Local::NONE), |r| local(&mut p, r))?;
            let write = ins
                .write
                .as_ref()
                .map_or(Ok(Local::NONE), |r| local(&mut p, r))?;
            p.ops.push(Op {
                bytes: ins.bytes,
                recv,
                read,
                write,
                send,
                after: Span {
                    first: after_first,
                    count: ins.after.len() as u32,
                },
            });
        }
        p.channels.push(Span {
            first,
            count: instructions.len() as u32,
        });
    }
    p.divide = plan.divide.as_ref().map(|r| local(&mut p, r)).transpose()?;
    let counts = |m: std::collections::BTreeMap<usize, u64>| {
        m.into_iter()
            .map(|(word, count)| Count {
                word: word as u64,
                count,
            })
            .collect()
    };
    p.sent = counts(sent);
    p.received = counts(received);
    Ok(p)
}

fn ends(
    p: &mut RankProgram,
    messages: &[ferrocoll_core::plan::Message],
) -> Result<Span, ProgramError> {
    let first = next_index(&p.ends, "message ends")?;
    p.ends.extend(messages.iter().map(|m| End {
        peer: m.peer,
        reserved: 0,
        index: m.index,
    }));
    Ok(Span {
        first,
        count: messages.len() as u32,
    })
}

fn local(p: &mut RankProgram, r: &Region) -> Result<Local, ProgramError> {
    let first = next_index(&p.pieces, "pieces")?;
    p.pieces.extend(r.pieces.iter().map(|x| Piece {
        offset: x.offset,
        bytes: x.bytes,
    }));
    Ok(Local {
        buffer: r.buffer.into(),
        pieces: Span {
            first,
            count: r.pieces.len() as u32,
        },
    })
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The records are what `cuda/interpret.cu` reads: the same sizes and
    /// field offsets as its `Fc*` structs under the CUDA ABI (naturally
    /// aligned, as `#[repr(C)]` lays them out).
    #[test]
    fn records_match_the_device_structs() {
        assert_eq!(size_of::<Span>(), 8);
        assert_eq!(size_of::<Local>(), 12);
        assert_eq!(size_of::<Piece>(), 16);
        assert_eq!(size_of::<End>(), 16);
        assert_eq!(size_of::<After>(), 8);
        assert_eq!(size_of::<Count>(), 16);
        assert_eq!(size_of::<Op>(), 56);
        assert_eq!(offset_of!(Op, recv), 8);
        assert_eq!(offset_of!(Op, read), 16);
        assert_eq!(offset_of!(Op, write), 28);
        assert_eq!(offset_of!(Op, send), 40);
        assert_eq!(offset_of!(Op, after), 48);
        assert_eq!(offset_of!(End, index), 8);
        let src = crate::kernels::INTERPRETER;
        for decl in [
            "struct FcSpan { u32 first, count; };",
            "struct FcLocal { u32 buffer; FcSpan pieces; };",
            "struct FcPiece { u64 offset, bytes; };",
            "struct FcEnd { u32 peer, reserved; u64 index; };",
            "struct FcAfter { u32 channel, index; };",
            "struct FcOp { u64 bytes; FcSpan recv; FcLocal read; FcLocal write; FcSpan send; FcSpan after; };",
            "struct FcCount { u64 word, count; };",
        ] {
            assert!(src.contains(decl), "{decl}");
        }
        assert!(src.contains(&format!("#define FC_MAX_RANKS {MAX_RANKS}")));
        assert_eq!(BufferId::None as u32, 3);
        assert!(src.contains("#define FC_NONE 3u"));
    }
}
