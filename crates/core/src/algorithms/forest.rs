//! Tree packings ("forests") as schedules: every member roots spanning
//! trees, each carrying its own share of the member's block, so on an
//! irregular link graph the data spreads over every link where a ring has
//! to cross the slowest — ForestColl's construction (Zhao et al., 2024).
//!
//! ```text
//! all-gather, root 0's share:      reduce-scatter, root 0's share:
//!        0                                0   (reduce: children first)
//!       / \                              / \
//!      1   2   (broadcast down)         1   2
//!          |                                |
//!          3                                3
//! ```
//!
//! - **all-gather**: each tree broadcasts its chunks of the root's block
//!   from the root down (receive from the parent, write, forward to the
//!   children);
//! - **reduce-scatter**: each tree reduces its chunks of the root's block
//!   up to the root (receive from every child, add the local input, send
//!   to the parent; the root writes the result);
//! - **all-reduce**: the block is split among the roots; each tree
//!   reduces its chunks to its root, then broadcasts them back down —
//!   reduce-scatter then all-gather on the same trees, the broadcast on a
//!   channel of its own so both directions of the links are busy at once.
//!
//! A tree's share is a run of consecutive chunks of the block, so the
//! shares need not be equal: a packing's weights become chunk counts
//! (rounded; the loss is what the packer weighs). Each chunk is a step of
//! its own, so a tree moves one chunk at a time and its levels pipeline,
//! as a ring's do. Trees that run side by
//! side go on separate channels; each channel runs its trees in the given
//! order on every rank, which cannot deadlock — a rank waits only on its
//! parent's (or children's) step of the same tree and on its own steps of
//! earlier trees.

use thiserror::Error;

use crate::schedule::{Schedule, ScheduleBuilder, Step, StepRef};
use crate::types::{Buffer, Collective, Rank};

/// One spanning tree of a packing, directed away from its root (a
/// reduce-scatter runs it toward the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedTree {
    /// The rank the tree's data starts from (all-gather) or ends at
    /// (reduce-scatter).
    pub root: Rank,
    /// Every rank's parent; `None` for the root only.
    pub parent: Vec<Option<Rank>>,
    /// The channel the tree runs on.
    pub channel: u32,
    /// The first chunk of the block the tree carries.
    pub first_chunk: u32,
    /// How many consecutive chunks it carries.
    pub chunks: u32,
}

/// A packing of spanning trees over `world_size` ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forest {
    /// Chunks each block is cut into (the trees' shares are counted in them).
    pub chunks_per_block: u32,
    /// The trees, in the order every channel runs them.
    pub trees: Vec<PackedTree>,
}

/// Why a forest is not a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ForestError {
    /// Trees express all-gather, reduce-scatter and all-reduce.
    #[error("a tree packing runs all-gather, reduce-scatter or all-reduce, not {0}")]
    Collective(Collective),
    /// A tree is not a spanning tree of the ranks rooted where it says.
    #[error("tree {tree}: {why}")]
    NotATree {
        /// The tree's index.
        tree: usize,
        /// What is wrong.
        why: String,
    },
    /// A channel past what a schedule may have.
    #[error("tree {tree} is on channel {channel}; a forest for {collective} has at most {max}")]
    Channel {
        /// The tree's index.
        tree: usize,
        /// Its channel.
        channel: u32,
        /// The collective (all-reduce doubles the channels).
        collective: Collective,
        /// The limit.
        max: u32,
    },
    /// No trees, or more steps or chunks than a schedule may hold.
    #[error("{0}")]
    Size(String),
    /// A tree's chunks run past the block.
    #[error("tree {tree} carries chunks {first}..{end} of a block of {chunks_per_block}")]
    Chunks {
        /// The tree's index.
        tree: usize,
        /// Its first chunk.
        first: u32,
        /// One past its last.
        end: u64,
        /// The block's chunks.
        chunks_per_block: u32,
    },
}

/// The schedule of `collective` on `world_size` ranks that runs `forest`.
/// Whether the trees cover every chunk exactly once is the verifier's to
/// prove; this checks each tree's shape.
pub fn schedule(
    collective: Collective,
    world_size: u32,
    forest: &Forest,
) -> Result<Schedule, ForestError> {
    if !matches!(
        collective,
        Collective::AllGather | Collective::ReduceScatter | Collective::AllReduce
    ) {
        return Err(ForestError::Collective(collective));
    }
    check_size(collective, world_size, forest)?;
    for (i, t) in forest.trees.iter().enumerate() {
        check_tree(i, t, world_size, forest.chunks_per_block)?;
    }
    let channels = forest
        .trees
        .iter()
        .map(|t| t.channel + 1)
        .max()
        .unwrap_or(1);
    let cpb = forest.chunks_per_block;
    // All-reduce: each tree's broadcast on a channel of its own, so it
    // runs while the tree still reduces later chunks.
    let total = if collective == Collective::AllReduce {
        2 * channels
    } else {
        channels
    };
    let mut b = ScheduleBuilder::new("forest", collective, world_size, cpb, total);
    let children: Vec<Vec<Vec<Rank>>> = forest
        .trees
        .iter()
        .map(|t| children_of(t, world_size))
        .collect();
    let trees = || forest.trees.iter().zip(&children);
    match collective {
        Collective::AllGather => {
            for (t, kids) in trees() {
                let output = t.root * cpb + t.first_chunk;
                broadcast(&mut b, t, kids, output, Some(t.first_chunk), None);
            }
        }
        Collective::ReduceScatter => {
            for (t, kids) in trees() {
                reduce(&mut b, t, kids, t.root * cpb + t.first_chunk, t.first_chunk);
            }
        }
        _ => {
            for (t, kids) in trees() {
                let reduced = reduce(&mut b, t, kids, t.first_chunk, t.first_chunk);
                let down = PackedTree {
                    channel: channels + t.channel,
                    ..t.clone()
                };
                broadcast(&mut b, &down, kids, t.first_chunk, None, Some(&reduced));
            }
        }
    }
    Ok(b.build())
}

/// Down the tree: the root reads `root_input` of its input (or, `None`,
/// already holds the value in its output) and every rank writes chunk
/// `output` of its output and forwards to its children. After a reduce on
/// another channel, each rank's step of a chunk waits for its reduce step
/// of that chunk (`reduced[rank][k]`), which read what it now overwrites.
fn broadcast(
    b: &mut ScheduleBuilder,
    t: &PackedTree,
    kids: &[Vec<Rank>],
    output: u32,
    root_input: Option<u32>,
    reduced: Option<&Vec<Vec<StepRef>>>,
) {
    for r in 0..t.parent.len() as Rank {
        for k in 0..t.chunks {
            let (output, input) = (output + k, root_input.map(|i| i + k));
            let mut step = Step::new(1);
            if let Some(done) = reduced {
                let at = done[r as usize][k as usize];
                step = step.after(at.channel, at.step);
            }
            match (t.parent[r as usize], input) {
                (Some(p), _) => step = step.recv(p).write(Buffer::Output, output),
                (None, Some(i)) => step = step.read(Buffer::Input, i).write(Buffer::Output, output),
                (None, None) if kids[r as usize].is_empty() => continue,
                (None, None) => step = step.read(Buffer::Output, output),
            }
            for &c in &kids[r as usize] {
                step = step.send(c);
            }
            b.push(r, t.channel, step);
        }
    }
}

/// Up the tree: every rank adds what its children sent to chunk `input`
/// of its input and sends the sum to its parent; the root writes it to
/// chunk `output` of its output. Returns each rank's step of each chunk.
fn reduce(
    b: &mut ScheduleBuilder,
    t: &PackedTree,
    kids: &[Vec<Rank>],
    input: u32,
    output: u32,
) -> Vec<Vec<StepRef>> {
    let mut placed = Vec::with_capacity(t.parent.len());
    for r in 0..t.parent.len() as Rank {
        let mut mine = Vec::with_capacity(t.chunks as usize);
        for k in 0..t.chunks {
            let mut step = Step::new(1);
            for &c in &kids[r as usize] {
                step = step.recv(c);
            }
            step = step.read(Buffer::Input, input + k);
            step = match t.parent[r as usize] {
                Some(p) => step.send(p),
                None => step.write(Buffer::Output, output + k),
            };
            mine.push(b.push(r, t.channel, step));
        }
        placed.push(mine);
    }
    placed
}

fn children_of(t: &PackedTree, n: u32) -> Vec<Vec<Rank>> {
    let mut kids = vec![Vec::new(); n as usize];
    for (r, p) in t.parent.iter().enumerate() {
        if let Some(p) = p {
            kids[*p as usize].push(r as Rank);
        }
    }
    kids
}

/// Steps the schedule of a forest may hold (the verifier's own bound on a
/// schedule is far above what a useful packing needs).
const MAX_FOREST_STEPS: u64 = 1 << 24;

/// Trees, channels, chunk indices and the step count within bounds, so
/// building the schedule neither overflows nor exhausts memory.
fn check_size(collective: Collective, n: u32, forest: &Forest) -> Result<(), ForestError> {
    if forest.trees.is_empty() {
        return Err(ForestError::Size("a forest needs at least one tree".into()));
    }
    let phases: u32 = if collective == Collective::AllReduce {
        2
    } else {
        1
    };
    let max = super::MAX_CHANNELS / phases;
    for (i, t) in forest.trees.iter().enumerate() {
        if t.channel >= max {
            return Err(ForestError::Channel {
                tree: i,
                channel: t.channel,
                collective,
                max,
            });
        }
    }
    if n.checked_mul(forest.chunks_per_block).is_none() {
        return Err(ForestError::Size(format!(
            "{n} blocks of {} chunks do not fit a schedule's chunk indices",
            forest.chunks_per_block
        )));
    }
    let steps: u64 = forest
        .trees
        .iter()
        .map(|t| u64::from(t.chunks) * u64::from(n) * u64::from(phases))
        .sum();
    if steps > MAX_FOREST_STEPS {
        return Err(ForestError::Size(format!(
            "the forest makes {steps} steps, above the {MAX_FOREST_STEPS} a forest may"
        )));
    }
    Ok(())
}

/// A spanning tree of `n` ranks rooted at `t.root` whose chunks fit.
fn check_tree(i: usize, t: &PackedTree, n: u32, chunks_per_block: u32) -> Result<(), ForestError> {
    let bad = |why: String| ForestError::NotATree { tree: i, why };
    if t.parent.len() != n as usize {
        return Err(bad(format!("{} parents for {n} ranks", t.parent.len())));
    }
    if t.root >= n || t.parent[t.root as usize].is_some() {
        return Err(bad(format!("root {} is not a parentless rank", t.root)));
    }
    // Every parent first, so following them below stays in bounds.
    for (r, p) in t.parent.iter().enumerate() {
        match p {
            None if r as Rank != t.root => return Err(bad(format!("rank {r} has no parent"))),
            Some(p) if *p >= n || *p as usize == r => {
                return Err(bad(format!("rank {r}'s parent {p} is not another rank")));
            }
            _ => {}
        }
    }
    for r in 0..t.parent.len() {
        // Following parents must reach the root within n hops.
        let mut at = r as Rank;
        for _ in 0..n {
            match t.parent[at as usize] {
                Some(p) => at = p,
                None => break,
            }
        }
        if at != t.root {
            return Err(bad(format!("rank {r} does not reach the root (a cycle)")));
        }
    }
    let end = u64::from(t.first_chunk) + u64::from(t.chunks);
    if t.chunks == 0 || end > u64::from(chunks_per_block) {
        return Err(ForestError::Chunks {
            tree: i,
            first: t.first_chunk,
            end,
            chunks_per_block,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
