use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::Rank;
use crate::error::ParseNameError;

/// A collective operation, with its root where it has one.
///
/// Buffer shapes follow NCCL, with `count` the per-rank element count the
/// caller passes (a *block* is `count` elements):
///
/// | collective     | input blocks | output blocks | in-place means                    |
/// |----------------|--------------|---------------|-----------------------------------|
/// | all-reduce     | 1            | 1             | input = output                    |
/// | reduce-scatter | n            | 1             | output = input block `rank`       |
/// | all-gather     | 1            | n             | input = output block `rank`       |
/// | broadcast      | 1            | 1             | input = output                    |
/// | reduce         | 1            | 1             | input = output                    |
/// | all-to-all     | n            | n             | not supported                     |
/// | send/recv      | 1            | 1             | not supported                     |
///
/// Send/recv is the nccl-tests `sendrecv` pattern: every rank sends its input
/// to rank `r + 1` and receives rank `r - 1`'s input (mod n).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Collective {
    /// Every rank ends with the reduction of all inputs.
    AllReduce,
    /// Rank `r` ends with the reduction of every rank's input block `r`.
    ReduceScatter,
    /// Rank `r` ends with every rank's input, block `k` from rank `k`.
    AllGather,
    /// Every rank ends with the root's input.
    Broadcast {
        /// The rank whose input is broadcast.
        root: Rank,
    },
    /// The root ends with the reduction of all inputs; other outputs are untouched.
    Reduce {
        /// The rank that receives the result.
        root: Rank,
    },
    /// Rank `r`'s output block `k` is rank `k`'s input block `r`.
    AllToAll,
    /// Rank `r`'s output is rank `r - 1`'s input (a ring shift, as nccl-tests' sendrecv).
    SendRecv,
}

/// A [`Collective`] without its root: the name users pick on a command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    /// See [`Collective::AllReduce`].
    AllReduce,
    /// See [`Collective::ReduceScatter`].
    ReduceScatter,
    /// See [`Collective::AllGather`].
    AllGather,
    /// See [`Collective::Broadcast`].
    Broadcast,
    /// See [`Collective::Reduce`].
    Reduce,
    /// See [`Collective::AllToAll`].
    AllToAll,
    /// See [`Collective::SendRecv`].
    SendRecv,
}

/// Who must have contributed to an output chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contributors {
    /// Every rank, exactly once each.
    All,
    /// Exactly this one rank.
    One(Rank),
}

/// What one output chunk must hold when a collective completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    /// The input chunk (index in the contributors' input buffers) it derives from.
    pub input_chunk: u32,
    /// Whose copies of that input chunk it combines.
    pub contributors: Contributors,
}

impl CollectiveKind {
    /// Every collective, in the order the CLI lists them.
    pub const ALL: [CollectiveKind; 7] = [
        CollectiveKind::AllReduce,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllGather,
        CollectiveKind::Broadcast,
        CollectiveKind::Reduce,
        CollectiveKind::AllToAll,
        CollectiveKind::SendRecv,
    ];

    /// The kebab-case name used on the command line (`all-reduce`).
    pub const fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all-reduce",
            CollectiveKind::ReduceScatter => "reduce-scatter",
            CollectiveKind::AllGather => "all-gather",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Reduce => "reduce",
            CollectiveKind::AllToAll => "all-to-all",
            CollectiveKind::SendRecv => "send-recv",
        }
    }

    /// The collective of this kind, rooted at `root` where it has a root.
    pub const fn with_root(self, root: Rank) -> Collective {
        match self {
            CollectiveKind::AllReduce => Collective::AllReduce,
            CollectiveKind::ReduceScatter => Collective::ReduceScatter,
            CollectiveKind::AllGather => Collective::AllGather,
            CollectiveKind::Broadcast => Collective::Broadcast { root },
            CollectiveKind::Reduce => Collective::Reduce { root },
            CollectiveKind::AllToAll => Collective::AllToAll,
            CollectiveKind::SendRecv => Collective::SendRecv,
        }
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for CollectiveKind {
    type Err = ParseNameError;

    /// Accepts `all-reduce`, `all_reduce`, `allreduce` and NCCL's `AllReduce`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let squashed: String = s
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_lowercase())
            .collect();
        CollectiveKind::ALL
            .into_iter()
            .find(|k| k.name().replace('-', "") == squashed)
            .ok_or_else(|| {
                ParseNameError::new(
                    "collective",
                    s,
                    CollectiveKind::ALL.map(CollectiveKind::name),
                )
            })
    }
}

impl Collective {
    /// The kind, without the root.
    pub const fn kind(self) -> CollectiveKind {
        match self {
            Collective::AllReduce => CollectiveKind::AllReduce,
            Collective::ReduceScatter => CollectiveKind::ReduceScatter,
            Collective::AllGather => CollectiveKind::AllGather,
            Collective::Broadcast { .. } => CollectiveKind::Broadcast,
            Collective::Reduce { .. } => CollectiveKind::Reduce,
            Collective::AllToAll => CollectiveKind::AllToAll,
            Collective::SendRecv => CollectiveKind::SendRecv,
        }
    }

    /// The root, for broadcast and reduce.
    pub const fn root(self) -> Option<Rank> {
        match self {
            Collective::Broadcast { root } | Collective::Reduce { root } => Some(root),
            _ => None,
        }
    }

    /// True when outputs combine several ranks' inputs with a [`ReduceOp`](super::ReduceOp).
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce { .. }
        )
    }

    /// Blocks (of `count` elements) in each rank's input buffer.
    pub const fn input_blocks(self, world_size: u32) -> u32 {
        match self {
            Collective::ReduceScatter | Collective::AllToAll => world_size,
            _ => 1,
        }
    }

    /// Blocks (of `count` elements) in each rank's output buffer.
    pub const fn output_blocks(self, world_size: u32) -> u32 {
        match self {
            Collective::AllGather | Collective::AllToAll => world_size,
            _ => 1,
        }
    }

    /// Blocks in the larger of one rank's buffers: nccl-tests' size of a
    /// call is this many blocks (and the in-place buffer holds as many).
    pub const fn size_blocks(self, world_size: u32) -> u32 {
        let (i, o) = (
            self.input_blocks(world_size),
            self.output_blocks(world_size),
        );
        if i > o { i } else { o }
    }

    /// Where the input lies inside the output (or the output inside the
    /// input) when the call is in place, in blocks; `None` when in-place
    /// calls are not supported.
    pub const fn in_place_alias(self, rank: Rank) -> Option<InPlaceAlias> {
        match self {
            Collective::AllReduce | Collective::Broadcast { .. } | Collective::Reduce { .. } => {
                Some(InPlaceAlias::InputIsOutputBlock(0))
            }
            Collective::AllGather => Some(InPlaceAlias::InputIsOutputBlock(rank)),
            Collective::ReduceScatter => Some(InPlaceAlias::OutputIsInputBlock(rank)),
            Collective::AllToAll | Collective::SendRecv => None,
        }
    }

    /// The nccl-tests bus-bandwidth factor: busbw = algbw × factor.
    ///
    /// All-reduce 2(n−1)/n; reduce-scatter, all-gather and all-to-all
    /// (n−1)/n; broadcast, reduce and send/recv 1. A single rank moves
    /// nothing over a bus, so every factor but send/recv's is 0 there, as in
    /// nccl-tests.
    pub fn bus_bandwidth_factor(self, world_size: u32) -> f64 {
        let n = f64::from(world_size.max(1));
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::ReduceScatter | Collective::AllGather | Collective::AllToAll => {
                (n - 1.0) / n
            }
            Collective::Broadcast { .. } | Collective::Reduce { .. } | Collective::SendRecv => 1.0,
        }
    }

    /// What output chunk `chunk` of `rank` must hold at the end, with
    /// `chunks_per_block` chunks per block; `None` where the collective
    /// leaves it unspecified (non-root outputs of reduce).
    pub fn expected(
        self,
        world_size: u32,
        chunks_per_block: u32,
        rank: Rank,
        chunk: u32,
    ) -> Option<Expected> {
        let cpb = chunks_per_block;
        let (block, within) = (chunk / cpb, chunk % cpb);
        let all = |input_chunk| Expected {
            input_chunk,
            contributors: Contributors::All,
        };
        let one = |input_chunk, r| Expected {
            input_chunk,
            contributors: Contributors::One(r),
        };
        match self {
            Collective::AllReduce => Some(all(chunk)),
            Collective::ReduceScatter => Some(all(rank * cpb + within)),
            Collective::AllGather => Some(one(within, block)),
            Collective::Broadcast { root } => Some(one(chunk, root)),
            Collective::Reduce { root } => (rank == root).then(|| all(chunk)),
            Collective::AllToAll => Some(one(rank * cpb + within, block)),
            Collective::SendRecv => Some(one(chunk, (rank + world_size - 1) % world_size)),
        }
    }
}

/// How the input and output views overlap in an in-place call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InPlaceAlias {
    /// The input is block `k` of the output (all-gather; `k = 0` for one-block outputs).
    InputIsOutputBlock(u32),
    /// The output is block `k` of the input (reduce-scatter).
    OutputIsInputBlock(u32),
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.root() {
            Some(root) => write!(f, "{}(root={root})", self.kind()),
            None => write!(f, "{}", self.kind()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_in_every_spelling() {
        for k in CollectiveKind::ALL {
            assert_eq!(k.name().parse::<CollectiveKind>().unwrap(), k);
        }
        assert_eq!(
            "AllReduce".parse::<CollectiveKind>().unwrap(),
            CollectiveKind::AllReduce
        );
        assert_eq!(
            "all_to_all".parse::<CollectiveKind>().unwrap(),
            CollectiveKind::AllToAll
        );
        assert!("allreduced".parse::<CollectiveKind>().is_err());
    }

    #[test]
    fn bus_bandwidth_factors_match_nccl_tests() {
        assert_eq!(Collective::AllReduce.bus_bandwidth_factor(4), 1.5);
        assert_eq!(Collective::AllGather.bus_bandwidth_factor(8), 0.875);
        assert_eq!(Collective::ReduceScatter.bus_bandwidth_factor(2), 0.5);
        assert_eq!(
            Collective::Broadcast { root: 0 }.bus_bandwidth_factor(8),
            1.0
        );
        assert_eq!(Collective::AllReduce.bus_bandwidth_factor(1), 0.0);
    }

    #[test]
    fn expectations_follow_the_buffer_shapes() {
        // 3 ranks, 2 chunks per block.
        let e = Collective::AllToAll.expected(3, 2, 1, 5).unwrap();
        assert_eq!(e.input_chunk, 3); // rank 1's slot in the sender's input, second half
        assert_eq!(e.contributors, Contributors::One(2));
        let e = Collective::ReduceScatter.expected(3, 2, 2, 1).unwrap();
        assert_eq!((e.input_chunk, e.contributors), (5, Contributors::All));
        assert!(
            Collective::Reduce { root: 1 }
                .expected(3, 2, 0, 0)
                .is_none()
        );
        let e = Collective::SendRecv.expected(3, 1, 0, 0).unwrap();
        assert_eq!(e.contributors, Contributors::One(2));
    }
}
