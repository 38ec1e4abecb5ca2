//! What the selector weighs: one schedule at one grain and protocol.

use std::fmt;

use ferrocoll_core::Algorithm;
use ferrocoll_core::select::{Choice, Protocol};

/// One thing the selector can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// A built-in algorithm with its channels and orders, or a schedule
    /// synthesized for the topology.
    pub choice: Choice,
    /// The pipelining grain.
    pub max_chunk_bytes: usize,
    /// How many copies of its channel layout `params` holds.
    pub multiplier: u32,
    /// How its messages travel, on GPUs (`None` on CPU threads, whose
    /// executor has one way).
    pub protocol: Option<Protocol>,
}

/// Calls up to this size also simulate every GPU candidate with the
/// low-latency protocol: past it, LL's third to quarter of the bandwidth
/// loses to the bulk protocol on every preset.
pub const LL_CANDIDATE_MAX_BYTES: usize = 1 << 20;

/// The most one LL message carries unless [`SelectOptions`] says
/// otherwise: an LL slot of the device interpreter's default layout
/// (`CudaConfig::ll_max_bytes`, 64 KiB).
///
/// [`SelectOptions`]: super::SelectOptions
pub const LL_MESSAGE_BYTES: usize = 64 << 10;

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.family())?;
        let channels = self.channels();
        if channels > 1 {
            write!(f, " x{channels}")?;
        }
        write!(f, " @{}", human_bytes(self.max_chunk_bytes))?;
        if self.protocol == Some(Protocol::LowLatency) {
            write!(f, " LL")?;
        }
        Ok(())
    }
}

impl Candidate {
    /// The built-in algorithm, if that is what it runs.
    pub fn algorithm(&self) -> Option<Algorithm> {
        self.choice.algorithm()
    }

    /// What kind of schedule it is: the algorithm's name, or the
    /// generator of a synthesized schedule (`forest`, `hierarchical`).
    pub fn family(&self) -> &str {
        self.choice.name()
    }

    /// The channels it runs on.
    pub fn channels(&self) -> u32 {
        self.choice.channels()
    }
}

/// `4K`, `512K`, `4M`.
pub fn human_bytes(b: usize) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => format!("{b}"),
    }
}
