use std::fmt;

use thiserror::Error;

use crate::flow::Wait;
use crate::schedule::StepAt;
use crate::types::{Buffer, Rank};

/// Which buffer arrangement a violation was found under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Found without running the schedule.
    Structure,
    /// Input and output are separate buffers.
    OutOfPlace,
    /// Input and output overlap as the collective's in-place call defines.
    InPlace,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Structure => "structure",
            Mode::OutOfPlace => "out-of-place",
            Mode::InPlace => "in-place",
        })
    }
}

/// What is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ViolationKind {
    /// The schedule declares no ranks.
    #[error("world size is 0")]
    WorldSizeZero,
    /// The number of rank programs differs from the world size.
    #[error("{programs} rank programs for world size {world_size}")]
    RankCountMismatch {
        /// Programs in the file.
        programs: usize,
        /// Declared world size.
        world_size: u32,
    },
    /// `chunks_per_block` is 0.
    #[error("chunks_per_block is 0")]
    NoChunks,
    /// The collective's root is not a rank.
    #[error("root {root} is out of range for world size {world_size}")]
    RootOutOfRange {
        /// The root.
        root: Rank,
        /// The world size.
        world_size: u32,
    },
    /// The schedule is too large to verify in memory.
    #[error("{what} would need {value} words; the verifier's limit is {limit}")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// How much it would need.
        value: u64,
        /// The limit.
        limit: u64,
    },
    /// A step's read and write overlap without coinciding.
    #[error(
        "reads chunks {read}.. and writes chunks {write}.. of the same memory, overlapping but shifted"
    )]
    OverlappingSlices {
        /// First physical chunk read.
        read: u32,
        /// First physical chunk written.
        write: u32,
    },
    /// A peer is not a rank.
    #[error("peer {peer} is out of range")]
    PeerOutOfRange {
        /// The peer.
        peer: Rank,
    },
    /// A rank sends to or receives from itself (use a local read/write).
    #[error("rank messages itself; use a local read and write instead")]
    SelfMessage,
    /// A peer is listed twice in one step.
    #[error("peer {peer} listed twice in one step")]
    DuplicatePeer {
        /// The peer.
        peer: Rank,
    },
    /// A step has nothing to read or receive.
    #[error("step has no input (no receive and no read)")]
    NoInput,
    /// A step neither writes nor sends.
    #[error("step has no effect (no write and no send)")]
    NoEffect,
    /// A step covers zero chunks.
    #[error("step covers 0 chunks")]
    ZeroChunks,
    /// A slice runs past the end of its buffer.
    #[error("{buffer:?} chunks {first}..{end} out of bounds ({available} chunks)", end = first + chunks)]
    SliceOutOfBounds {
        /// The buffer.
        buffer: Buffer,
        /// First chunk.
        first: u32,
        /// Chunks covered.
        chunks: u32,
        /// Chunks the buffer has.
        available: u32,
    },
    /// A step writes the input buffer, which belongs to the caller.
    #[error("step writes the input buffer, which is read-only")]
    WritesInput,
    /// An `after` reference names no step of another channel of this rank.
    #[error("`after` names channel {channel} step {step}, which does not exist on another channel")]
    BadAfter {
        /// The named channel.
        channel: u32,
        /// The named step.
        step: u32,
    },
    /// The step can never fire.
    #[error("deadlock: {}", describe_waits(waits))]
    Deadlock {
        /// What it waits for.
        waits: Vec<Wait>,
    },
    /// A receive that no rank ever sends.
    #[error("receives from rank {from}, which never sends the message")]
    UnmatchedRecv {
        /// The expected sender.
        from: Rank,
    },
    /// Messages sent that no step receives.
    #[error("{messages} message(s) to rank {to} on channel {channel} are never received")]
    UnmatchedSend {
        /// The receiver.
        to: Rank,
        /// The channel.
        channel: u32,
        /// How many.
        messages: usize,
    },
    /// A message's length differs from the receiving step's.
    #[error("message from rank {from} carries {got} chunk(s), the step expects {expected}")]
    MessageSizeMismatch {
        /// The sender.
        from: Rank,
        /// The receiving step's chunk count.
        expected: u32,
        /// The message's chunk count.
        got: u32,
    },
    /// A step reads data that no step wrote.
    #[error("reads {buffer:?} chunk {chunk}, which holds no data yet")]
    ReadsUnwritten {
        /// The buffer.
        buffer: Buffer,
        /// The chunk.
        chunk: u32,
    },
    /// A reduction combines different chunks of the input.
    #[error("reduces input chunk {first} with input chunk {second}")]
    MixedChunks {
        /// One operand's input chunk.
        first: u32,
        /// The other's.
        second: u32,
    },
    /// A reduction counts some rank's contribution twice.
    #[error("double-counts the contribution of rank(s) {}", list(ranks))]
    DoubleCounted {
        /// The ranks counted twice.
        ranks: Vec<Rank>,
    },
    /// A collective without a reduction op combines values.
    #[error("combines values, but {collective} has no reduction")]
    ReductionWithoutOp {
        /// The collective's name.
        collective: String,
    },
    /// A value is written where chunks have another size.
    #[error(
        "writes input chunk {value_chunk}'s data into a slot shaped like chunk {slot_chunk} (sizes differ for some counts)"
    )]
    ShapeMismatch {
        /// The value's input chunk.
        value_chunk: u32,
        /// The slot it lands in, as a chunk index of its buffer.
        slot_chunk: u32,
    },
    /// An output chunk ends with the wrong content.
    #[error("output holds {found}, expected {expected}")]
    WrongResult {
        /// What it should hold.
        expected: String,
        /// What it holds.
        found: String,
    },
    /// A reduce writes the output of a rank that is not the root.
    #[error("writes the output of a non-root rank, which reduce must leave untouched")]
    WritesNonRootOutput,
    /// Two steps on different channels touch the same data, unordered, one writing.
    #[error("races with {other} on {buffer:?} (no ordering between the two steps)")]
    Race {
        /// The other step.
        other: StepAt,
        /// The buffer (as the step names it).
        buffer: Buffer,
    },
    /// Scratch chunks used by more than one channel of a rank (segments reuse scratch).
    #[error(
        "scratch chunks also used by channel {other_channel}; each scratch chunk must belong to one channel"
    )]
    ScratchSharedAcrossChannels {
        /// The other channel.
        other_channel: u32,
    },
}

fn list(ranks: &[Rank]) -> String {
    ranks
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_waits(waits: &[Wait]) -> String {
    let parts: Vec<String> = waits
        .iter()
        .map(|w| match w {
            Wait::Message { from } => format!("waits for a message from rank {from}"),
            Wait::Slot { to } => format!("waits for a free slot on the link to rank {to}"),
            Wait::Step(r) => format!("waits for channel {} step {}", r.channel, r.step),
        })
        .collect();
    parts.join(", ")
}

/// One thing wrong with a schedule, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Under which buffer arrangement it was found.
    pub mode: Mode,
    /// The rank concerned, if any.
    pub rank: Option<Rank>,
    /// The channel, if it concerns one step.
    pub channel: Option<u32>,
    /// The step index within its channel, if it concerns one step.
    pub step: Option<u32>,
    /// The chunk concerned, if any.
    pub chunk: Option<u32>,
    /// What is wrong.
    pub kind: ViolationKind,
}

impl Violation {
    pub(crate) fn at(mode: Mode, at: StepAt, kind: ViolationKind) -> Self {
        Violation {
            mode,
            rank: Some(at.rank),
            channel: Some(at.channel),
            step: Some(at.index),
            chunk: None,
            kind,
        }
    }

    pub(crate) fn global(mode: Mode, kind: ViolationKind) -> Self {
        Violation {
            mode,
            rank: None,
            channel: None,
            step: None,
            chunk: None,
            kind,
        }
    }

    pub(crate) fn with_chunk(mut self, chunk: u32) -> Self {
        self.chunk = Some(chunk);
        self
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}]", self.mode)?;
        if let Some(r) = self.rank {
            write!(f, " rank {r}")?;
        }
        if let Some(c) = self.channel {
            write!(f, " channel {c}")?;
        }
        if let Some(s) = self.step {
            write!(f, " step {s}")?;
        }
        if let Some(c) = self.chunk {
            write!(f, " chunk {c}")?;
        }
        write!(f, ": {}", self.kind)
    }
}

/// Collects violations, keeping at most a fixed number and counting the rest.
#[derive(Debug, Default)]
pub(crate) struct Violations {
    pub list: Vec<Violation>,
    pub omitted: usize,
}

/// More than this many violations are counted, not stored.
pub(crate) const MAX_STORED_VIOLATIONS: usize = 1000;

impl Violations {
    pub(crate) fn push(&mut self, v: Violation) {
        if self.list.len() < MAX_STORED_VIOLATIONS {
            self.list.push(v);
        } else {
            self.omitted += 1;
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub(crate) fn extend(&mut self, other: Violations) {
        for v in other.list {
            self.push(v);
        }
        self.omitted += other.omitted;
    }
}
