//! Hierarchical all-reduce for machines made of nodes: reduce-scatter
//! inside each node, all-reduce across the nodes on rails, all-gather
//! inside each node — the schedule multi-node systems run so that each
//! byte crosses the (slow) network once per direction, and each GPU's
//! share crosses on its own NIC.
//!
//! ```text
//! 2 nodes of 3 ranks; position p of every node forms rail p
//!
//!  node 0:  a0 ─▶ a1 ─▶ a2 ─▶ (a0)   1. reduce-scatter around each node's
//!            │     │     │             ring: position p holds part p+1
//!          rail0 rail1 rail2           summed over its node
//!            │     │     │          2. all-reduce of that part around its
//!  node 1:  b0 ─▶ b1 ─▶ b2 ─▶ (b0)      rail (ring over the nodes)
//!                                    3. all-gather around each node's ring
//! ```
//!
//! With L ranks per node and M nodes the block is cut into L parts of M
//! chunks (times the channels). Each phase runs on a schedule channel of
//! its own and starts, on each rank, after the phase before has left its
//! part in the output; since the plan cuts chunks into segments, the
//! phases of consecutive segments overlap — the node's links reduce one
//! segment while the network carries the one before, as a pipeline. Cost (all-reduce of S bytes):
//! intra-node `2(L−1)·α + 2(L−1)/L · S/B_node`, and across the nodes each
//! rank sends `2(M−1)/(M·L) · S` on its rail: `2(M−1)·α + 2(M−1)/(ML) ·
//! S/B_rail`. A flat ring puts `2(n−1)/n · S` on every rank's link, the
//! network's included.
//!
//! Traffic over all links, in blocks: `2M(L−1) + 2(M−1)` — each node's
//! two rings move `2(L−1)/L` of a block per rank, each rail's ring
//! `2(M−1)/M` of a part. Not an [`super::Algorithm`]: the node grouping
//! and the rails come from a topology (`ferrocoll_topo::search::hierarchy`).

use thiserror::Error;

use super::wrap;
use crate::schedule::{Schedule, ScheduleBuilder, Step, StepRef};
use crate::types::{Buffer, Collective, Rank};

/// Ranks grouped into nodes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hierarchy {
    /// Each node's ranks in the order of its ring; every node holds as
    /// many ranks, and the ranks at position `p` of every node form rail
    /// `p` (they exchange across the network).
    pub nodes: Vec<Vec<Rank>>,
}

/// Why a hierarchy is not a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HierarchyError {
    /// Only all-reduce is built hierarchically.
    #[error("the hierarchical schedule runs all-reduce, not {0}")]
    Collective(Collective),
    /// The nodes do not partition the ranks into equal groups.
    #[error("hierarchy over {world_size} ranks: {why}")]
    Shape {
        /// The world size.
        world_size: u32,
        /// What is wrong.
        why: String,
    },
    /// Channels out of range.
    #[error("{0} channels asked for; 1..={max} are supported (three schedule channels each)", max = super::MAX_CHANNELS / PHASES)]
    Channels(u32),
}

/// The hierarchical all-reduce on `world_size` ranks grouped as
/// `hierarchy` says, each channel carrying its own share of the block.
pub fn schedule(
    collective: Collective,
    world_size: u32,
    hierarchy: &Hierarchy,
    channels: u32,
) -> Result<Schedule, HierarchyError> {
    if collective != Collective::AllReduce {
        return Err(HierarchyError::Collective(collective));
    }
    if channels == 0 || channels > super::MAX_CHANNELS {
        return Err(HierarchyError::Channels(channels));
    }
    let (per_node, nodes) = check(world_size, hierarchy)?;
    if channels > super::MAX_CHANNELS / PHASES {
        return Err(HierarchyError::Channels(channels));
    }
    let parts = per_node * nodes;
    let mut b = ScheduleBuilder::new(
        "hierarchical",
        collective,
        world_size,
        channels * parts,
        channels * PHASES,
    );
    for ch in 0..channels {
        for (m, node) in hierarchy.nodes.iter().enumerate() {
            for (p, &rank) in node.iter().enumerate() {
                let at = Place {
                    hierarchy,
                    node: m,
                    position: p,
                    base: ch * parts,
                };
                let phases = [
                    at.reduce_scatter_in_node(),
                    at.all_reduce_on_rail(),
                    at.all_gather_in_node(),
                ];
                // Each phase starts once the one before has left its part
                // in the output; on channels of their own, the phases of
                // consecutive segments overlap (the node's links work on
                // one segment while the network carries the one before).
                let mut last: Option<StepRef> = None;
                for (k, phase) in (0u32..).zip(phases) {
                    let channel = ch * PHASES + k;
                    for (i, mut step) in phase.into_iter().enumerate() {
                        if let (0, Some(at)) = (i, last) {
                            step = step.after(at.channel, at.step);
                        }
                        let here = b.push(rank, channel, step);
                        last = Some(here);
                    }
                }
            }
        }
    }
    Ok(b.build())
}

/// Schedule channels per channel of the call: one per phase.
const PHASES: u32 = 3;

/// Ranks per node and nodes, once the nodes are known to partition
/// `0..world_size` into equal groups.
fn check(world_size: u32, h: &Hierarchy) -> Result<(u32, u32), HierarchyError> {
    let bad = |why: String| HierarchyError::Shape { world_size, why };
    let per_node = h.nodes.first().map_or(0, Vec::len);
    if per_node == 0 {
        return Err(bad("no nodes, or an empty one".into()));
    }
    if let Some((m, node)) = h
        .nodes
        .iter()
        .enumerate()
        .find(|(_, n)| n.len() != per_node)
    {
        return Err(bad(format!(
            "node {m} holds {} ranks, node 0 {per_node}: nodes must be equal",
            node.len()
        )));
    }
    let mut seen = vec![false; world_size as usize];
    for &r in h.nodes.iter().flatten() {
        match seen.get_mut(r as usize) {
            None => return Err(bad(format!("rank {r} is out of range"))),
            Some(true) => return Err(bad(format!("rank {r} is in two places"))),
            Some(s) => *s = true,
        }
    }
    if let Some(r) = seen.iter().position(|s| !s) {
        return Err(bad(format!("rank {r} is in no node")));
    }
    Ok((per_node as u32, h.nodes.len() as u32))
}

/// One rank's place: its node, its position in the node's ring (its rail),
/// and the first chunk of the channel.
struct Place<'a> {
    hierarchy: &'a Hierarchy,
    node: usize,
    position: usize,
    base: u32,
}

impl Place<'_> {
    fn per_node(&self) -> u32 {
        self.hierarchy.nodes[0].len() as u32
    }

    fn nodes(&self) -> u32 {
        self.hierarchy.nodes.len() as u32
    }

    /// The rank `offset` places along this node's ring.
    fn in_node(&self, offset: i64) -> Rank {
        let node = &self.hierarchy.nodes[self.node];
        node[wrap(self.position as i64 + offset, self.per_node()) as usize]
    }

    /// The rank `offset` nodes along this rank's rail.
    fn on_rail(&self, offset: i64) -> Rank {
        let m = wrap(self.node as i64 + offset, self.nodes()) as usize;
        self.hierarchy.nodes[m][self.position]
    }

    /// The first chunk of part `k` (relative to this rank's position): a
    /// part is `nodes` consecutive chunks.
    fn part(&self, k: i64) -> u32 {
        self.base + wrap(self.position as i64 + k, self.per_node()) * self.nodes()
    }

    /// Leaves part +1 summed over the node in the output, as a ring's
    /// reduce-scatter does (each step moves a whole part).
    fn reduce_scatter_in_node(&self) -> Vec<Step> {
        let (l, width) = (i64::from(self.per_node()), self.nodes());
        let (next, prev) = (self.in_node(1), self.in_node(-1));
        let done = Step::new(width)
            .read(Buffer::Input, self.part(1))
            .write(Buffer::Output, self.part(1));
        if l == 1 {
            return vec![done];
        }
        let mut steps = vec![
            Step::new(width)
                .read(Buffer::Input, self.part(0))
                .send(next),
        ];
        for s in 1..l - 1 {
            steps.push(
                Step::new(width)
                    .recv(prev)
                    .read(Buffer::Input, self.part(-s))
                    .send(next),
            );
        }
        steps.push(done.recv(prev));
        steps
    }

    /// A ring all-reduce of part +1's chunks among the ranks of this rail,
    /// reading the node's sums from the output and leaving the total there.
    fn all_reduce_on_rail(&self) -> Vec<Step> {
        let m = i64::from(self.nodes());
        if m == 1 {
            return Vec::new();
        }
        let (next, prev) = (self.on_rail(1), self.on_rail(-1));
        let first = self.part(1);
        let q = self.node as i64;
        let c = |k: i64| first + wrap(k, self.nodes());
        let out = Buffer::Output;
        let mut steps = vec![Step::new(1).read(out, c(q)).send(next)];
        for s in 1..m - 1 {
            steps.push(Step::new(1).recv(prev).read(out, c(q - s)).send(next));
        }
        steps.push(
            Step::new(1)
                .recv(prev)
                .read(out, c(q + 1))
                .write(out, c(q + 1))
                .send(next),
        );
        for t in 1..m - 1 {
            steps.push(Step::new(1).recv(prev).write(out, c(q - t + 1)).send(next));
        }
        steps.push(Step::new(1).recv(prev).write(out, c(q + 2)));
        steps
    }

    /// Passes each finished part around the node's ring.
    fn all_gather_in_node(&self) -> Vec<Step> {
        let (l, width) = (i64::from(self.per_node()), self.nodes());
        if l == 1 {
            return Vec::new();
        }
        let (next, prev) = (self.in_node(1), self.in_node(-1));
        let mut steps = vec![
            Step::new(width)
                .read(Buffer::Output, self.part(1))
                .send(next),
        ];
        for t in 1..l {
            let step = Step::new(width)
                .recv(prev)
                .write(Buffer::Output, self.part(1 - t));
            steps.push(if t < l - 1 { step.send(next) } else { step });
        }
        steps
    }
}

/// Bytes over all links of one all-reduce, in blocks: each node's two
/// rings move `2(L−1)/L` of a block per rank, each rail's ring `2(M−1)/M`
/// of a part (`1/L` of a block) per rank.
pub fn traffic_blocks(per_node: u32, nodes: u32) -> u64 {
    let (l, m) = (u64::from(per_node), u64::from(nodes));
    2 * m * l.saturating_sub(1) + 2 * m.saturating_sub(1)
}

#[cfg(test)]
mod tests;
