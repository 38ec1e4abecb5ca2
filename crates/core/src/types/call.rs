//! The call's vocabulary, one place for every layer and backend: what a
//! call is ([`CallShape`] and its [`Purpose`]), the buffers a step names
//! ([`Buffer`]), the links messages travel ([`Link`]), and the one rule from
//! buffer lengths to a call's `count` ([`block_count`]), which the host API
//! and the device API both apply.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{Collective, DataType, Rank, ReduceOp};

/// The call a plan is compiled for: what every rank must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CallShape {
    /// The collective, with its root.
    pub collective: Collective,
    /// Elements per block (the per-rank `count`).
    pub count: usize,
    /// The element type.
    pub dtype: DataType,
    /// The reduction op.
    pub op: ReduceOp,
    /// One buffer (the output) instead of two.
    pub in_place: bool,
    /// What the call is for: a library's own exchange never matches a
    /// user's call of the same shape.
    #[serde(default, skip_serializing_if = "Purpose::is_user")]
    pub purpose: Purpose,
}

/// What a collective is for, beyond its shape. The library runs calls of
/// its own — `split`'s exchange of colors and keys, the descriptions a
/// gather, scatter or `-v` call compares before moving data — and a rank
/// making one of those while a peer makes a user's call of the same shape
/// must be a mismatch, not an `Ok` with the other call's data. Part of the
/// plan's signature, so every executor's agreement compares it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Purpose {
    /// A call the program made.
    #[default]
    User,
    /// `split`'s exchange of every rank's color and key.
    Split,
    /// The descriptions a gather, scatter, all-gather-v or all-to-all-v
    /// compares before any data moves.
    Describe,
}

impl Purpose {
    /// Whether this is a program's own call.
    pub fn is_user(&self) -> bool {
        *self == Purpose::User
    }
}

impl std::fmt::Display for Purpose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Purpose::User => "user",
            Purpose::Split => "split",
            Purpose::Describe => "describe",
        })
    }
}

impl CallShape {
    /// nccl-tests' size of the call on `world_size` ranks: the larger of one
    /// rank's buffers, in bytes (saturating).
    pub fn size_bytes(&self, world_size: u32) -> usize {
        let c = self.collective;
        let blocks = c.size_blocks(world_size) as usize;
        self.count
            .saturating_mul(blocks)
            .saturating_mul(self.dtype.size_bytes())
    }
}

/// A rank-local buffer a step reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Buffer {
    /// The caller's send buffer. Read-only: no step may write it.
    Input,
    /// The caller's receive buffer.
    Output,
    /// Executor-owned scratch space, `scratch_chunks` chunks per rank.
    Scratch,
}

impl Buffer {
    /// Short name used in the ASCII grid (`in`, `out`, `tmp`).
    pub const fn short_name(self) -> &'static str {
        match self {
            Buffer::Input => "in",
            Buffer::Output => "out",
            Buffer::Scratch => "tmp",
        }
    }
}

/// Identifies a link: sender, receiver, channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// The sending rank.
    pub from: Rank,
    /// The receiving rank.
    pub to: Rank,
    /// The channel both ends use.
    pub channel: u32,
}

/// Why a call's buffer lengths fit no shape (lengths in elements).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShapeError {
    /// A buffer's length is not what the call needs.
    #[error("{buffer} has {len} elements; this call needs {needed}")]
    Length {
        /// Which buffer: `input`, `output`, or the `in-place buffer`.
        buffer: &'static str,
        /// Its length.
        len: usize,
        /// The length the call needs (for a length that is not whole
        /// blocks, the next one that is).
        needed: usize,
    },
    /// The collective has no in-place form.
    #[error("{0} has no in-place form")]
    NoInPlace(Collective),
}

/// The elements per block (`count`) of `collective` on `n` ranks, from its
/// buffers' lengths (`input` is `None` in place), or which buffer is off.
///
/// In place the one buffer holds [`Collective::size_blocks`] blocks. Out of
/// place the buffer of fewer blocks sets the count — the input, when both
/// hold as many (an all-reduce's, an all-to-all's) — and the other must
/// hold its own number of blocks of that count.
pub fn block_count(
    collective: Collective,
    n: u32,
    input: Option<usize>,
    output: usize,
) -> Result<usize, ShapeError> {
    let Some(input) = input else {
        if collective.in_place_alias(0).is_none() {
            return Err(ShapeError::NoInPlace(collective));
        }
        return whole("in-place buffer", output, collective.size_blocks(n));
    };
    let (in_blocks, out_blocks) = (collective.input_blocks(n), collective.output_blocks(n));
    let (count, other, len, blocks) = if in_blocks <= out_blocks {
        (
            whole("input", input, in_blocks)?,
            "output",
            output,
            out_blocks,
        )
    } else {
        (
            whole("output", output, out_blocks)?,
            "input",
            input,
            in_blocks,
        )
    };
    let needed = count.saturating_mul(blocks as usize);
    if len != needed {
        return Err(ShapeError::Length {
            buffer: other,
            len,
            needed,
        });
    }
    Ok(count)
}

/// `len / blocks`, or the error naming the next whole length.
fn whole(buffer: &'static str, len: usize, blocks: u32) -> Result<usize, ShapeError> {
    let blocks = blocks.max(1) as usize;
    if len % blocks != 0 {
        return Err(ShapeError::Length {
            buffer,
            len,
            needed: len.div_ceil(blocks).saturating_mul(blocks),
        });
    }
    Ok(len / blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_each_collectives_blocks() {
        let n = 4;
        let root = Collective::Broadcast { root: 1 };
        assert_eq!(block_count(Collective::AllReduce, n, Some(10), 10), Ok(10));
        assert_eq!(block_count(Collective::AllReduce, n, None, 7), Ok(7));
        assert_eq!(block_count(Collective::AllGather, n, Some(3), 12), Ok(3));
        assert_eq!(block_count(Collective::AllGather, n, None, 12), Ok(3));
        assert_eq!(
            block_count(Collective::ReduceScatter, n, Some(12), 3),
            Ok(3)
        );
        assert_eq!(block_count(Collective::ReduceScatter, n, None, 12), Ok(3));
        assert_eq!(block_count(Collective::AllToAll, n, Some(8), 8), Ok(2));
        assert_eq!(block_count(root, n, Some(5), 5), Ok(5));
        assert_eq!(block_count(Collective::AllReduce, n, Some(0), 0), Ok(0));
    }

    #[test]
    fn the_error_names_the_buffer_that_is_off_and_the_length_it_needs() {
        let n = 4;
        let length = |buffer, len, needed| {
            Err(ShapeError::Length {
                buffer,
                len,
                needed,
            })
        };
        assert_eq!(
            block_count(Collective::AllReduce, n, Some(9), 10),
            length("output", 10, 9)
        );
        assert_eq!(
            block_count(Collective::AllGather, n, Some(3), 13),
            length("output", 13, 12)
        );
        assert_eq!(
            block_count(Collective::ReduceScatter, n, Some(13), 3),
            length("input", 13, 12)
        );
        assert_eq!(
            block_count(Collective::ReduceScatter, n, Some(12), 4),
            length("input", 12, 16)
        );
        assert_eq!(
            block_count(Collective::AllToAll, n, Some(9), 9),
            length("input", 9, 12)
        );
        assert_eq!(
            block_count(Collective::AllToAll, n, Some(8), 12),
            length("output", 12, 8)
        );
        assert_eq!(
            block_count(Collective::ReduceScatter, n, None, 10),
            length("in-place buffer", 10, 12)
        );
        assert_eq!(
            block_count(Collective::AllToAll, n, None, 8),
            Err(ShapeError::NoInPlace(Collective::AllToAll))
        );
        let e = block_count(Collective::AllGather, n, Some(4), 3).unwrap_err();
        assert_eq!(e.to_string(), "output has 3 elements; this call needs 16");
    }
}
