//! Packing spanning trees into the link graph (ForestColl-style): every
//! member roots trees that carry shares of its block, weighted so that the
//! busiest resource is as idle as it can be — where no ring can use every
//! link (a partial DGX-1V allocation has no NVLink Hamiltonian ring at
//! all), trees can.
//!
//! The weights come from multiplicative weights: round after round, each
//! root adds its cheapest spanning arborescence ([`arborescence`]) under
//! prices that grow exponentially with each resource's load, so
//! overloaded links are avoided in later rounds; a tree's weight is how
//! often it was chosen. The weights are then rounded to whole chunks of
//! the block (a few trees per root, a few chunks each), and the rounding
//! that loads the busiest resource least is kept — that loss is what the
//! reported bandwidth includes.
//!
//! [`arborescence`]: super::arborescence

use std::collections::HashMap;

use ferrocoll_core::algorithms::forest::{Forest, PackedTree};
use ferrocoll_core::{CollectiveKind, Rank};

use super::arborescence;
use super::costs::Costs;
use crate::error::TopologyError;
use crate::graph::{NodeId, Topology};
use crate::sim::CostModel;

/// Trees one root may keep in the rounding of the many-round weights.
pub const MAX_TREES_PER_ROOT: u32 = 4;
/// Channels the trees of one packing spread over (an all-reduce runs its
/// broadcasts on as many again, within a schedule's channels).
pub const MAX_TREE_CHANNELS: usize = ferrocoll_core::algorithms::MAX_CHANNELS as usize / 2;
/// Chunks one root's share may be cut into at most.
const MAX_CHUNKS_PER_ROOT: u32 = 12;
/// How sharply prices rise with load (per unit of the busiest resource's
/// load): high enough that a loaded link is soon avoided, low enough that
/// equally good trees alternate.
const PRICE_STEEPNESS: f64 = 6.0;

/// A packing of trees for one collective.
#[derive(Debug, Clone, PartialEq)]
pub struct TreePacking {
    /// The trees, their channels and shares, in ranks `0..n` of `devices`.
    pub forest: Forest,
    /// The collective's bus bandwidth by the load model (every resource
    /// busy at once, each carrying its share), GB/s: what the rounded
    /// weights allow.
    pub bandwidth: f64,
    /// The same before rounding: what the weights allow.
    pub fractional: f64,
}

/// Which way the data crosses a tree's edges.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Direction {
    /// Down (all-gather).
    Down,
    /// Up (reduce-scatter).
    Up,
    /// Up, then down (all-reduce).
    Both,
}

/// Trees packed for `kind` (all-gather, reduce-scatter or all-reduce) over
/// `devices` of `topo`: the packing the load model rates best; `None` for
/// other collectives or a single device. Members that cannot reach one
/// another are [`TopologyError::Unreachable`].
pub fn trees(
    topo: &Topology,
    devices: &[NodeId],
    cost: &CostModel,
    kind: CollectiveKind,
) -> Result<Option<TreePacking>, TopologyError> {
    Ok(tree_packings(topo, devices, cost, kind)?.into_iter().next())
}

/// Every packing the search considered, the load model's best first: the
/// rounding of the many-round weights, and the rounding of each few-round
/// packing (k rounds: up to k trees per root). The load model takes
/// every resource as shared in proportion to the data crossing it; links
/// shared fairly run some trees ahead of others, so a caller that can
/// simulate should pick among these by simulation, as `ferrocoll synth`
/// does.
pub fn tree_packings(
    topo: &Topology,
    devices: &[NodeId],
    cost: &CostModel,
    kind: CollectiveKind,
) -> Result<Vec<TreePacking>, TopologyError> {
    let direction = match kind {
        CollectiveKind::AllGather => Direction::Down,
        CollectiveKind::ReduceScatter => Direction::Up,
        CollectiveKind::AllReduce => Direction::Both,
        _ => return Ok(Vec::new()),
    };
    if devices.len() < 2 {
        return Ok(Vec::new());
    }
    let costs = Costs::new(topo, devices, cost)?;
    let Some(weights) = weigh(&costs, direction, rounds(devices.len()))? else {
        return Ok(Vec::new());
    };
    let many = round(&costs, direction, &weights, MAX_TREES_PER_ROOT as usize);
    let fractional = many.as_ref().map_or(0.0, |p| p.fractional);
    let mut all: Vec<TreePacking> = many.into_iter().collect();
    for k in 1..=MAX_CHUNKS_PER_ROOT {
        let few = weigh(&costs, direction, k as usize)?
            .and_then(|w| round(&costs, direction, &w, k as usize));
        if let Some(p) = few
            && !all.iter().any(|q| q.forest == p.forest)
        {
            all.push(TreePacking { fractional, ..p });
        }
    }
    all.sort_by(|a, b| b.bandwidth.total_cmp(&a.bandwidth));
    Ok(all)
}

/// A tree as every rank's parent (`None` for the root).
type Parents = Vec<Option<Rank>>;

/// Per root, (index of a kept tree, its chunks).
type Split = Vec<Vec<(usize, u32)>>;

/// Per root, how often each tree was the cheapest.
type Weights = Vec<HashMap<Parents, u32>>;

/// Rounds of multiplicative weights: a few hundred on small graphs, fewer
/// on large ones (each round is `n` arborescences of `O(n³)`).
fn rounds(n: usize) -> usize {
    (4000 / n.max(1)).clamp(24, 400)
}

/// `Ok(None)` where some rank cannot be reached; `Err` once the work
/// budget is spent.
fn weigh(
    costs: &Costs,
    direction: Direction,
    rounds: usize,
) -> Result<Option<Weights>, TopologyError> {
    let n = costs.n;
    let mut load = vec![0.0; costs.capacity.len()];
    let mut weights: Weights = vec![HashMap::new(); n];
    let mut edge_cost = vec![f64::INFINITY; n * n];
    for _ in 0..rounds {
        for (root, chosen) in weights.iter_mut().enumerate() {
            let price = prices(costs, &load);
            for a in 0..n {
                for b in 0..n {
                    if a != b {
                        edge_cost[a * n + b] = tree_edge_price(costs, &price, direction, a, b);
                    }
                }
            }
            // Pricing every edge along its path and the arborescence:
            // measured, about as much as 2n³ simulated steps.
            crate::work::charge(2 * (n * n * n) as u64)?;
            let Some(parent) = arborescence::cheapest(n, &edge_cost, root) else {
                return Ok(None);
            };
            let parent: Vec<Option<Rank>> = parent.iter().map(|p| p.map(|p| p as Rank)).collect();
            add_tree(costs, direction, &parent, 1.0, &mut load);
            *chosen.entry(parent).or_insert(0) += 1;
        }
    }
    Ok(Some(weights))
}

/// Each resource's price per unit of traffic: exponential in its load
/// relative to the busiest one's, over its capacity (so an idle slow link
/// still costs more than an idle fast one).
fn prices(costs: &Costs, load: &[f64]) -> Vec<f64> {
    let worst = costs.worst(load);
    load.iter()
        .zip(&costs.capacity)
        .map(|(l, c)| {
            let relative = if worst > 0.0 { l / c / worst } else { 0.0 };
            (PRICE_STEEPNESS * relative).exp() / c
        })
        .collect()
}

/// What tree edge parent `a` → child `b` costs under `price`.
fn tree_edge_price(costs: &Costs, price: &[f64], direction: Direction, a: usize, b: usize) -> f64 {
    let one = |x: usize, y: usize| -> f64 {
        costs
            .edge(x as Rank, y as Rank)
            .iter()
            .map(|&(r, w)| w * price[r])
            .sum()
    };
    match direction {
        Direction::Down => one(a, b),
        Direction::Up => one(b, a),
        Direction::Both => one(a, b) + one(b, a),
    }
}

/// Adds `share` of a tree's traffic to `load`.
fn add_tree(
    costs: &Costs,
    direction: Direction,
    parent: &[Option<Rank>],
    share: f64,
    load: &mut [f64],
) {
    for (child, p) in parent.iter().enumerate() {
        let Some(p) = *p else { continue };
        let c = child as Rank;
        let mut add = |x: Rank, y: Rank| {
            for &(r, w) in costs.edge(x, y) {
                load[r] += share * w;
            }
        };
        match direction {
            Direction::Down => add(p, c),
            Direction::Up => add(c, p),
            Direction::Both => {
                add(p, c);
                add(c, p);
            }
        }
    }
}

/// The bus bandwidth (GB/s) a set of trees with these shares of one
/// unit of data per root reaches by the load model.
fn bandwidth(costs: &Costs, direction: Direction, trees: &[(&[Option<Rank>], f64)]) -> f64 {
    let n = costs.n as f64;
    let mut load = vec![0.0; costs.capacity.len()];
    for (parent, share) in trees {
        add_tree(costs, direction, parent, *share, &mut load);
    }
    let worst = costs.worst(&load);
    if worst == 0.0 {
        return f64::INFINITY;
    }
    // Per root one block (all-gather, reduce-scatter): busbw (n−1)·b/T. All-
    // reduce: the block is split among the n roots, busbw 2(n−1)/n·b/T.
    let (factor, per_root) = match direction {
        Direction::Both => (2.0 * (n - 1.0) / n, 1.0 / n),
        _ => (n - 1.0, 1.0),
    };
    factor / (worst * per_root) / 1e3
}

/// The best rounding of `weights` to whole chunks, as a forest.
fn round(
    costs: &Costs,
    direction: Direction,
    weights: &Weights,
    max_trees: usize,
) -> Option<TreePacking> {
    let n = costs.n;
    let ranked: Vec<Vec<(&Parents, u32)>> = weights
        .iter()
        .map(|w| {
            let mut v: Vec<_> = w.iter().map(|(t, c)| (t, *c)).collect();
            v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            v
        })
        .collect();
    let fractional = {
        let all: Vec<(&[Option<Rank>], f64)> = ranked
            .iter()
            .flat_map(|v| {
                let total: u32 = v.iter().map(|x| x.1).sum();
                v.iter()
                    .map(move |(t, c)| (t.as_slice(), f64::from(*c) / f64::from(total)))
            })
            .collect();
        bandwidth(costs, direction, &all)
    };
    let mut best: Option<(f64, u32, Split)> = None;
    for keep in 1..=max_trees as u32 {
        for chunks in keep..=MAX_CHUNKS_PER_ROOT {
            let split: Vec<Vec<(usize, u32)>> = ranked
                .iter()
                .map(|v| apportion(v, keep as usize, chunks))
                .collect();
            let trees: Vec<(&[Option<Rank>], f64)> = split
                .iter()
                .zip(&ranked)
                .flat_map(|(s, v)| {
                    s.iter()
                        .map(move |&(i, c)| (v[i].0.as_slice(), f64::from(c) / f64::from(chunks)))
                })
                .collect();
            let bw = bandwidth(costs, direction, &trees);
            // Better by more than 0.5 %, else the fewer chunks.
            if best.as_ref().is_none_or(|b| bw > b.0 * 1.005) {
                best = Some((bw, chunks, split));
            }
        }
    }
    let (bw, chunks, split) = best?;
    let mut trees = Vec::new();
    for (root, (s, v)) in split.iter().zip(&ranked).enumerate() {
        let base = if direction == Direction::Both {
            root as u32 * chunks
        } else {
            0
        };
        let mut first = 0;
        for &(i, c) in s {
            // A channel per tree while they last; past that, trees share
            // channels and run one after another on them.
            let channel = trees.len() % MAX_TREE_CHANNELS;
            trees.push(PackedTree {
                root: root as Rank,
                parent: v[i].0.clone(),
                channel: channel as u32,
                first_chunk: base + first,
                chunks: c,
            });
            first += c;
        }
    }
    let chunks_per_block = if direction == Direction::Both {
        chunks * n as u32
    } else {
        chunks
    };
    Some(TreePacking {
        forest: Forest {
            chunks_per_block,
            trees,
        },
        bandwidth: bw,
        fractional,
    })
}

/// `chunks` chunks over the first `keep` trees of `ranked` in proportion
/// to their counts (largest remainder); trees left with none are dropped.
fn apportion(ranked: &[(&Parents, u32)], keep: usize, chunks: u32) -> Vec<(usize, u32)> {
    let top = &ranked[..keep.min(ranked.len())];
    let total: u32 = top.iter().map(|x| x.1).sum();
    let exact: Vec<f64> = top
        .iter()
        .map(|x| f64::from(x.1) * f64::from(chunks) / f64::from(total))
        .collect();
    let mut given: Vec<u32> = exact.iter().map(|e| e.floor() as u32).collect();
    let mut left = chunks - given.iter().sum::<u32>();
    let mut order: Vec<usize> = (0..top.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        given[i] += 1;
        left -= 1;
    }
    given
        .into_iter()
        .enumerate()
        .filter(|&(_, c)| c > 0)
        .collect()
}

#[cfg(test)]
mod tests;
