//! Schedule generators: each algorithm turns (collective, world size,
//! parameters) into a [`Schedule`]. One algorithm per file, each with its
//! picture and its cost line.
//!
//! | algorithm | collectives |
//! |---|---|
//! | [`ring`] | all-reduce, reduce-scatter, all-gather, broadcast and reduce (pipelined chains) |
//! | [`tree`] | all-reduce (double binary tree), broadcast, reduce |
//! | [`direct`] | every collective, including all-to-all and send/recv |
//! | [`halving_doubling`] | all-reduce, reduce-scatter, all-gather, any world size |
//! | [`forest`] | all-gather, reduce-scatter, all-reduce on a packing of spanning trees (synthesized, not an [`Algorithm`]) |
//! | [`hierarchical`] | all-reduce on nodes: reduce-scatter inside each, all-reduce along rails, all-gather (synthesized, not an [`Algorithm`]) |
//!
//! A single rank needs no algorithm: every generator returns one local copy.

pub mod direct;
pub mod forest;
pub mod halving_doubling;
pub mod hierarchical;
pub mod ring;
pub mod tree;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::error::ParseNameError;
use crate::schedule::{Schedule, ScheduleBuilder, Step};
use crate::types::{Buffer, Collective, CollectiveKind, Rank};

/// A built-in schedule generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// Bandwidth-optimal ring (pipelined chains for broadcast and reduce).
    Ring,
    /// Double binary tree: two complementary trees, each with half the data.
    Tree,
    /// Full mesh: every rank talks to every other rank directly.
    Direct,
    /// Rabenseifner's recursive halving and doubling.
    HalvingDoubling,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::Direct,
        Algorithm::HalvingDoubling,
    ];

    /// The name used on the command line and in `FERROCOLL_ALGO`.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Direct => "direct",
            Algorithm::HalvingDoubling => "halving-doubling",
        }
    }

    /// `Ok` when this algorithm can express `kind`; otherwise why not.
    pub fn supports(self, kind: CollectiveKind) -> Result<(), &'static str> {
        use CollectiveKind as C;
        match (self, kind) {
            (Algorithm::Direct, _) => Ok(()),
            (_, C::AllToAll) => {
                Err("all-to-all exchanges a distinct block with every peer; use direct")
            }
            (_, C::SendRecv) => Err("send/recv is a single exchange per rank; use direct"),
            (Algorithm::Ring, _) => Ok(()),
            (Algorithm::Tree, C::AllReduce | C::Broadcast | C::Reduce) => Ok(()),
            (Algorithm::Tree, _) => Err(
                "a tree funnels everything through its root; reduce-scatter and all-gather need ring, direct or halving-doubling",
            ),
            (Algorithm::HalvingDoubling, C::AllReduce | C::ReduceScatter | C::AllGather) => Ok(()),
            (Algorithm::HalvingDoubling, _) => Err(
                "halving-doubling splits data evenly among ranks; broadcast and reduce use ring or tree",
            ),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = ParseNameError;

    /// Accepts the names, `halving_doubling`, `hd` and `rabenseifner`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "ring" => Ok(Algorithm::Ring),
            "tree" => Ok(Algorithm::Tree),
            "direct" => Ok(Algorithm::Direct),
            "halving-doubling" | "hd" | "rabenseifner" => Ok(Algorithm::HalvingDoubling),
            _ => Err(ParseNameError::new(
                "algorithm",
                s,
                Algorithm::ALL.map(Algorithm::name),
            )),
        }
    }
}

/// The largest world size the generators build a schedule for: ring and
/// direct schedules hold O(n²) steps, about 250 MB at this size.
pub const MAX_WORLD_SIZE: u32 = 1024;

/// The most channels a generator accepts (NCCL tops out at 64 too).
pub const MAX_CHANNELS: u32 = 64;

/// Every (algorithm, collective) pair a built-in generator can express.
pub fn applicable() -> impl Iterator<Item = (Algorithm, CollectiveKind)> {
    Algorithm::ALL.into_iter().flat_map(|a| {
        CollectiveKind::ALL
            .into_iter()
            .filter(move |&k| a.supports(k).is_ok())
            .map(move |k| (a, k))
    })
}

/// Knobs for the generators. The default is one channel and rings in rank order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AlgorithmParams {
    /// Independent channels, each carrying `1/channels` of the data on its
    /// own links (ring, tree and direct; halving-doubling takes 1).
    pub channels: u32,
    /// Ring order per channel (ring only): a permutation of `0..n`. Empty
    /// means rank order for every channel; a single order serves all channels.
    pub ring_orders: Vec<Vec<Rank>>,
    /// Tree only: position `p` of the trees is rank `tree_order[p]`, so a
    /// topology search can keep parents and children on nearby devices.
    /// Empty means rank order.
    pub tree_order: Vec<Rank>,
}

impl Default for AlgorithmParams {
    fn default() -> Self {
        AlgorithmParams {
            channels: 1,
            ring_orders: Vec::new(),
            tree_order: Vec::new(),
        }
    }
}

/// Why a schedule could not be generated.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AlgorithmError {
    /// The algorithm cannot express the collective.
    #[error("{algorithm} cannot run {collective}: {reason}")]
    NotApplicable {
        /// The algorithm.
        algorithm: Algorithm,
        /// The collective.
        collective: CollectiveKind,
        /// Why, and what to use instead.
        reason: &'static str,
    },
    /// World size 0.
    #[error("world size must be at least 1")]
    WorldSizeZero,
    /// The root is not a rank.
    #[error("root {root} is out of range for world size {world_size}")]
    RootOutOfRange {
        /// The root.
        root: Rank,
        /// The world size.
        world_size: u32,
    },
    /// More ranks than [`MAX_WORLD_SIZE`].
    #[error(
        "world size {world_size} is above the {MAX_WORLD_SIZE} ranks a schedule is generated for"
    )]
    WorldSizeTooLarge {
        /// The world size asked for.
        world_size: u32,
    },
    /// The tree order is not a permutation of the ranks.
    #[error("tree order is not a permutation of 0..{world_size}: {order:?}")]
    BadTreeOrder {
        /// The world size.
        world_size: u32,
        /// The order given.
        order: Vec<Rank>,
    },
    /// Zero channels requested.
    #[error("at least one channel is needed")]
    ZeroChannels,
    /// More channels than [`MAX_CHANNELS`].
    #[error("{channels} channels requested; at most {MAX_CHANNELS} are supported")]
    TooManyChannels {
        /// Channels asked for.
        channels: u32,
    },
    /// The algorithm runs on one channel only.
    #[error("{algorithm} runs on a single channel (asked for {channels})")]
    SingleChannelOnly {
        /// The algorithm.
        algorithm: Algorithm,
        /// Channels asked for.
        channels: u32,
    },
    /// A ring order is not a permutation of the ranks.
    #[error("ring order {index} is not a permutation of 0..{world_size}: {order:?}")]
    BadRingOrder {
        /// Which order in the list.
        index: usize,
        /// The world size.
        world_size: u32,
        /// The order given.
        order: Vec<Rank>,
    },
}

/// Generate the schedule of `algorithm` for `collective` on `world_size` ranks.
pub fn generate(
    algorithm: Algorithm,
    collective: Collective,
    world_size: u32,
    params: &AlgorithmParams,
) -> Result<Schedule, AlgorithmError> {
    if world_size == 0 {
        return Err(AlgorithmError::WorldSizeZero);
    }
    if world_size > MAX_WORLD_SIZE {
        return Err(AlgorithmError::WorldSizeTooLarge { world_size });
    }
    if let Some(root) = collective.root()
        && root >= world_size
    {
        return Err(AlgorithmError::RootOutOfRange { root, world_size });
    }
    if params.channels == 0 {
        return Err(AlgorithmError::ZeroChannels);
    }
    if params.channels > MAX_CHANNELS {
        return Err(AlgorithmError::TooManyChannels {
            channels: params.channels,
        });
    }
    algorithm
        .supports(collective.kind())
        .map_err(|reason| AlgorithmError::NotApplicable {
            algorithm,
            collective: collective.kind(),
            reason,
        })?;
    if world_size == 1 {
        return Ok(local_copy(algorithm, collective));
    }
    match algorithm {
        Algorithm::Ring => ring::generate(collective, world_size, params),
        Algorithm::Tree if params.tree_order.is_empty() => {
            Ok(tree::generate(collective, world_size, params.channels))
        }
        Algorithm::Tree => tree::generate_in_order(collective, world_size, params),
        Algorithm::Direct => Ok(direct::generate(collective, world_size, params.channels)),
        Algorithm::HalvingDoubling => {
            if params.channels != 1 {
                return Err(AlgorithmError::SingleChannelOnly {
                    algorithm,
                    channels: params.channels,
                });
            }
            Ok(halving_doubling::generate(collective, world_size))
        }
    }
}

/// The cost line of `algorithm` for `kind` on `world_size` ranks as a
/// number: bytes over all links of one call, in blocks of `count` elements
/// (the execution plan's link table, the executors' counters and the
/// simulator must all agree with it); `None` where the algorithm cannot run
/// the collective.
pub fn traffic_blocks(algorithm: Algorithm, kind: CollectiveKind, world_size: u32) -> Option<u64> {
    algorithm.supports(kind).ok()?;
    if world_size <= 1 {
        return Some(0);
    }
    Some(match algorithm {
        Algorithm::Ring => ring::traffic_blocks(kind, world_size),
        Algorithm::Tree => tree::traffic_blocks(kind, world_size),
        Algorithm::Direct => direct::traffic_blocks(kind, world_size),
        Algorithm::HalvingDoubling => halving_doubling::traffic_blocks(kind, world_size),
    })
}

/// With one rank, every collective copies the input to the output.
fn local_copy(algorithm: Algorithm, collective: Collective) -> Schedule {
    let mut b = ScheduleBuilder::new(algorithm.name(), collective, 1, 1, 1);
    b.push(
        0,
        0,
        Step::new(1).read(Buffer::Input, 0).write(Buffer::Output, 0),
    );
    b.build()
}

/// `i mod n` for a possibly negative `i`.
fn wrap(i: i64, n: u32) -> u32 {
    i.rem_euclid(i64::from(n)) as u32
}

/// The peers of `rank`, starting with the next one: `r+1, r+2, ..., r-1`.
fn peers(rank: Rank, n: u32) -> impl Iterator<Item = Rank> {
    (1..n).map(move |k| (rank + k) % n)
}

#[cfg(test)]
mod tests;
