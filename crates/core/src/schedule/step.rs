use std::fmt;

use serde::{Deserialize, Serialize};

use crate::types::{Buffer, Rank};

/// `chunks` consecutive chunks of a buffer, starting at `chunk`; the length
/// comes from the step that holds the slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slice {
    /// Which buffer.
    pub buffer: Buffer,
    /// The first chunk.
    pub chunk: u32,
}

/// Names a step of the same rank on another channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRef {
    /// The channel.
    pub channel: u32,
    /// The step's index within that channel.
    pub step: u32,
}

/// Where a step stands in a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StepAt {
    /// The rank that runs it.
    pub rank: Rank,
    /// Its channel.
    pub channel: u32,
    /// Its index within the channel.
    pub index: u32,
}

impl fmt::Display for StepAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} channel {} step {}",
            self.rank, self.channel, self.index
        )
    }
}

/// One step: receive, combine, write, send — each part optional.
///
/// The step's value is the elementwise reduction of every message received
/// (from `recv_from`, in order) and the local `read` slice; with a single
/// input it is a plain copy of it. The value is written to `write` and sent
/// to every rank in `send_to`. All slices and messages cover `chunks`
/// chunks. A step fires only when every awaited message has arrived, every
/// outgoing link has a free slot, and every step named in `after` has fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Ranks to receive one message from, on this step's channel.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recv_from: Vec<Rank>,
    /// A local slice combined with the received messages (or copied, alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<Slice>,
    /// Where the result is stored locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<Slice>,
    /// Ranks the result is sent to, on this step's channel.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub send_to: Vec<Rank>,
    /// How many consecutive chunks the slices and messages cover.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub chunks: u32,
    /// Steps of this rank on other channels that must have fired first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<StepRef>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Step {
    /// An empty step over `chunks` chunks; add parts with the builder methods.
    pub fn new(chunks: u32) -> Self {
        Step {
            recv_from: Vec::new(),
            read: None,
            write: None,
            send_to: Vec::new(),
            chunks,
            after: Vec::new(),
        }
    }

    /// Also receive a message from `peer`.
    pub fn recv(mut self, peer: Rank) -> Self {
        self.recv_from.push(peer);
        self
    }

    /// Read (and combine with what is received) `buffer` from `chunk`.
    pub fn read(mut self, buffer: Buffer, chunk: u32) -> Self {
        self.read = Some(Slice { buffer, chunk });
        self
    }

    /// Write the result to `buffer` from `chunk`.
    pub fn write(mut self, buffer: Buffer, chunk: u32) -> Self {
        self.write = Some(Slice { buffer, chunk });
        self
    }

    /// Also send the result to `peer`.
    pub fn send(mut self, peer: Rank) -> Self {
        self.send_to.push(peer);
        self
    }

    /// Fire only after `step` of this rank's `channel`.
    pub fn after(mut self, channel: u32, step: u32) -> Self {
        self.after.push(StepRef { channel, step });
        self
    }

    /// How many values the step combines (messages plus the local read).
    pub fn input_count(&self) -> usize {
        self.recv_from.len() + usize::from(self.read.is_some())
    }

    /// True when the step combines two or more values with the reduce op.
    pub fn reduces(&self) -> bool {
        self.input_count() > 1
    }

    /// The NCCL-style primitive name: `send`, `recv_reduce_copy_send`, ...
    pub fn primitive_name(&self) -> String {
        primitive_name(
            !self.recv_from.is_empty(),
            self.reduces(),
            self.write.is_some(),
            !self.send_to.is_empty(),
        )
    }
}

/// The NCCL-style name of a step (or a plan's instruction) that receives,
/// reduces, copies to a local slice and sends as the flags say.
pub(crate) fn primitive_name(recv: bool, reduce: bool, copy: bool, send: bool) -> String {
    let parts = [
        (recv, "recv"),
        (reduce, "reduce"),
        (copy, "copy"),
        (send, "send"),
    ];
    let name: Vec<&str> = parts.iter().filter(|p| p.0).map(|p| p.1).collect();
    if name.is_empty() {
        "nop".to_owned()
    } else {
        name.join("_")
    }
}
