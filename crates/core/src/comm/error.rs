//! [`CommError`], and the argument checks every backend shares.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::algorithms::AlgorithmError;
use crate::plan::PlanError;
use crate::types::{Collective, DataType, Rank, ShapeError};
use crate::verify::VerifyError;

/// The error of a backend (CUDA driver, NVRTC, NCCL, a transport), kept
/// typed: downcast it with `source.downcast_ref::<ferrocoll_nccl::NcclError>()`.
pub type BackendError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Why a collective call failed.
///
/// After any error other than [`CommError::BufferSize`],
/// [`CommError::RankOutOfRange`], [`CommError::SelfPeer`],
/// [`CommError::DtypeMismatch`], [`CommError::Disagreement`] and
/// [`CommError::Unsupported`] (which are caught before anything moves)
/// the group is poisoned: every rank's pending and later calls fail too,
/// so no rank waits forever for one that gave up.
#[derive(Debug, Clone, Error)]
pub enum CommError {
    /// A wait outlasted the configured timeout.
    #[error("rank {rank} timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// The rank that gave up.
        rank: Rank,
        /// The configured timeout.
        timeout: Duration,
        /// What it waited for.
        what: String,
    },
    /// Another rank failed (panicked, timed out, or was given bad input).
    #[error("rank {rank} failed: {reason}")]
    PeerFailed {
        /// The rank that failed first.
        rank: Rank,
        /// Its error.
        reason: String,
    },
    /// Ranks disagree on the call (collective, count, type, op, root, plan).
    #[error("call #{call}: rank {rank} called {got}, but rank {other} called {expected}")]
    Mismatch {
        /// The call's sequence number on this communicator.
        call: u64,
        /// The rank that noticed.
        rank: Rank,
        /// The rank it disagrees with.
        other: Rank,
        /// What the other rank called.
        expected: String,
        /// What this rank called.
        got: String,
    },
    /// A buffer has the wrong length for the call.
    #[error("{what} has {got} elements; this call needs {needed}")]
    BufferSize {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length the call needs.
        needed: usize,
    },
    /// The input and output of one call hold different element types.
    #[error("the input holds {input} but the output {output}")]
    DtypeMismatch {
        /// The input's type.
        input: DataType,
        /// The output's type.
        output: DataType,
    },
    /// A root or peer that is not a rank.
    #[error("rank {rank} is out of range for world size {world_size}")]
    RankOutOfRange {
        /// The rank given.
        rank: Rank,
        /// The group's size.
        world_size: u32,
    },
    /// A rank named itself as the peer of a send or receive.
    #[error("rank {rank} cannot send to or receive from itself")]
    SelfPeer {
        /// The rank.
        rank: Rank,
    },
    /// The collective has no in-place form.
    #[error("{collective} has no in-place form")]
    InPlaceUnsupported {
        /// The collective.
        collective: String,
    },
    /// The call needs more than the group was set up for (channels,
    /// message size).
    #[error("{what}")]
    Capacity {
        /// What does not fit, and which setting to raise.
        what: String,
    },
    /// The executor's backend (CUDA driver, NVRTC, NCCL) is missing or
    /// failed; `source` is its own typed error.
    #[error("{backend}: {source}")]
    Backend {
        /// Which backend (`cuda`, `nccl`, ...).
        backend: &'static str,
        /// Its error.
        #[source]
        source: BackendError,
    },
    /// The algorithm cannot run this call.
    #[error(transparent)]
    Algorithm(#[from] AlgorithmError),
    /// The schedule (a user's, or a bug in a built-in) did not verify.
    #[error(transparent)]
    Verify(#[from] Box<VerifyError>),
    /// The call has no plan (too large, too few slots, wrong collective).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A group of no ranks was asked for.
    #[error("a group needs at least one rank (world size 0)")]
    EmptyGroup,
    /// Ranks described a gather, scatter or uneven (`-v`) collective
    /// differently. Every rank sees every description before any data
    /// moves, so each returns this error and the group stays usable.
    #[error("rank {rank} called {mine}, but rank {other} called {theirs}")]
    Disagreement {
        /// This rank.
        rank: Rank,
        /// The first rank whose call differs.
        other: Rank,
        /// This rank's call.
        mine: String,
        /// The other rank's call.
        theirs: String,
    },
    /// The backend cannot do this (for example split a communicator it
    /// has no way to re-form).
    #[error("{what}")]
    Unsupported {
        /// What, and what to use instead.
        what: String,
    },
    /// An out-of-place call's input and output overlap (raw-pointer calls
    /// only; safe slices cannot alias).
    #[error(
        "input [{input:#x}, +{input_bytes}) and output [{output:#x}, +{output_bytes}) overlap; pass no input to run in place"
    )]
    Overlap {
        /// Input address.
        input: u64,
        /// Input bytes.
        input_bytes: usize,
        /// Output address.
        output: u64,
        /// Output bytes.
        output_bytes: usize,
    },
}

impl CommError {
    /// A backend's error, kept typed.
    pub fn backend(
        backend: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        CommError::Backend {
            backend,
            source: Arc::new(source),
        }
    }

    /// True for the errors caught before anything moves, which leave the
    /// group usable.
    pub fn is_argument_error(&self) -> bool {
        matches!(
            self,
            CommError::BufferSize { .. }
                | CommError::RankOutOfRange { .. }
                | CommError::SelfPeer { .. }
                | CommError::DtypeMismatch { .. }
                | CommError::Disagreement { .. }
                | CommError::Unsupported { .. }
        )
    }
}

/// `Err(CommError::Overlap)` if an out-of-place call's buffers share any
/// byte: the executors read inputs while they write outputs, so an overlap
/// would corrupt both. Raw-pointer entry points call this; in-place calls
/// pass no input instead.
pub fn check_disjoint(
    input: u64,
    input_bytes: usize,
    output: u64,
    output_bytes: usize,
) -> Result<(), CommError> {
    let (i_end, o_end) = (
        input.saturating_add(input_bytes as u64),
        output.saturating_add(output_bytes as u64),
    );
    if input_bytes == 0 || output_bytes == 0 || i_end <= output || o_end <= input {
        Ok(())
    } else {
        Err(CommError::Overlap {
            input,
            input_bytes,
            output,
            output_bytes,
        })
    }
}

/// `text` from another process (a peer's failure reason), safe to print:
/// control characters — terminal escape sequences, carriage returns,
/// newlines — and the bidirectional overrides that reorder what a reader
/// sees are written as `\u{..}` escapes, so a peer cannot redraw or hide
/// parts of a survivor's terminal.
pub fn printable(text: &str) -> String {
    let hidden =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !text.chars().any(hidden) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if hidden(c) {
                format!("\\u{{{:x}}}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `Err(RankOutOfRange)` unless `rank` (a root or a peer) is a rank of a
/// group of `world_size`.
pub fn check_rank(rank: Rank, world_size: u32) -> Result<(), CommError> {
    if rank < world_size {
        Ok(())
    } else {
        Err(CommError::RankOutOfRange { rank, world_size })
    }
}

/// The root of `collective`, if it has one, checked with [`check_rank`].
pub fn check_root(collective: Collective, world_size: u32) -> Result<(), CommError> {
    collective
        .root()
        .map_or(Ok(()), |root| check_rank(root, world_size))
}

/// A send/recv peer of rank `me`: a rank of the group, and not `me`.
pub fn check_peer(peer: Rank, me: Rank, world_size: u32) -> Result<(), CommError> {
    check_rank(peer, world_size)?;
    if peer == me {
        return Err(CommError::SelfPeer { rank: peer });
    }
    Ok(())
}

impl From<ShapeError> for CommError {
    fn from(e: ShapeError) -> Self {
        match e {
            ShapeError::Length {
                buffer,
                len,
                needed,
            } => CommError::BufferSize {
                what: buffer,
                got: len,
                needed,
            },
            ShapeError::NoInPlace(collective) => CommError::InPlaceUnsupported {
                collective: collective.kind().to_string(),
            },
        }
    }
}

#[cfg(test)]
mod printable_tests {
    use super::printable;

    #[test]
    fn escape_sequences_from_peers_are_shown_not_obeyed() {
        assert_eq!(printable("plain reason: é ✓"), "plain reason: é ✓");
        assert_eq!(
            printable("\u{1b}[2J\u{1b}]0;owned\u{7}gone\r\nnext"),
            "\\u{1b}[2J\\u{1b}]0;owned\\u{7}gone\\u{d}\\u{a}next"
        );
        assert_eq!(printable("a\u{202e}b"), "a\\u{202e}b");
        assert_eq!(printable("\u{9b}31m"), "\\u{9b}31m");
    }
}
