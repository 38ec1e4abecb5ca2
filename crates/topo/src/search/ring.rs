//! The ring search.
//!
//! Each ring added to a set is the order whose busiest resource, with the
//! rings already chosen, is least loaded. Up to [`EXHAUSTIVE_MAX_RANKS`]
//! ranks every order is scored, (n−1)! candidates per ring. Above, the
//! search is a heuristic of bounded work: a greedy tour (each next rank
//! the one whose edge loads its resources least), the rank order and the reversed rank order as seeds, then local search (2-opt reversals
//! and swaps of two ranks) while it improves, at
//! most [`HEURISTIC_BUDGET`] candidates per ring; scoring a candidate is
//! O(n) in the ranks (only the resources its edges cross are read), so a
//! ring costs O(n² + budget · n) and a set at most [`MAX_RINGS`] times that.
//!
//! The heuristic ranks candidates by worst load, then by *crowding* (the
//! sum of squared loads over capacity of what the ring crosses), then by
//! latency. Worst load alone is flat: while a second conflict remains,
//! removing one does not change it, and 2-opt would stall; crowding falls
//! with every conflict removed.

use ferrocoll_core::Rank;

use super::costs::{Costs, RingSet};
use crate::error::TopologyError;
use crate::graph::{NodeId, Topology};
use crate::sim::CostModel;

/// Up to this many ranks every ring order is tried (rank 0 fixed first):
/// 8! = 40320 orders at 9 ranks.
pub const EXHAUSTIVE_MAX_RANKS: usize = 9;
/// Rings tried per set at most (a packing's repeated rings included).
pub const MAX_RINGS: usize = 8;
/// Candidates the heuristic scores per ring at most, seeds included:
/// about eight 2-opt sweeps at 128 ranks, a few milliseconds.
pub const HEURISTIC_BUDGET: u64 = 65_536;

/// How good a candidate ring is; lower is better in every field, compared
/// in order.
#[derive(Debug, Clone, Copy)]
struct Score {
    /// The worst load over capacity with the ring added.
    worst: f64,
    /// Σ (load / capacity)² over the resources the ring crosses (heuristic
    /// only; 0 in the exhaustive search, which ranks by worst and latency
    /// alone).
    crowding: f64,
    /// The ring's summed edge latency, µs.
    latency: f64,
}

/// Relative margin within which two loads are equal.
const LOAD_EPSILON: f64 = 1e-9;
/// Absolute margin within which two latencies are equal, µs.
const LATENCY_EPSILON: f64 = 1e-9;

impl Score {
    fn better_than(&self, other: &Score) -> bool {
        let less = |a: f64, b: f64| a < b * (1.0 - LOAD_EPSILON);
        let same = |a: f64, b: f64| a <= b * (1.0 + LOAD_EPSILON);
        less(self.worst, other.worst)
            || (same(self.worst, other.worst)
                && (less(self.crowding, other.crowding)
                    || (same(self.crowding, other.crowding)
                        && self.latency < other.latency - LATENCY_EPSILON)))
    }
}

/// Scores candidate rings against the load of the rings already chosen,
/// reading only the resources a candidate crosses: adding a ring raises
/// loads, so the worst of the rest is the worst before it.
struct Scorer<'c> {
    costs: &'c Costs,
    load: &'c [f64],
    /// The worst load over capacity before the candidate.
    base_worst: f64,
    /// The candidate's own load per resource (zero between calls).
    extra: Vec<f64>,
    touched: Vec<usize>,
    /// Whether to compute crowding (the heuristic's guide).
    crowding: bool,
    /// Candidates scored.
    candidates: u64,
}

impl<'c> Scorer<'c> {
    fn new(costs: &'c Costs, load: &'c [f64], crowding: bool) -> Scorer<'c> {
        Scorer {
            costs,
            load,
            base_worst: costs.worst(load),
            extra: vec![0.0; load.len()],
            touched: Vec::new(),
            crowding,
            candidates: 0,
        }
    }

    fn score(&mut self, order: &[Rank]) -> Score {
        self.candidates += 1;
        for i in 0..order.len() {
            for &(r, w) in self.costs.edge(order[i], order[(i + 1) % order.len()]) {
                if self.extra[r] == 0.0 {
                    self.touched.push(r);
                }
                self.extra[r] += w;
            }
        }
        let (mut worst, mut crowding) = (self.base_worst, 0.0);
        for &r in &self.touched {
            let ratio = (self.load[r] + self.extra[r]) / self.costs.capacity[r];
            worst = worst.max(ratio);
            if self.crowding {
                crowding += ratio * ratio;
            }
            self.extra[r] = 0.0;
        }
        self.touched.clear();
        Score {
            worst,
            crowding,
            latency: self.costs.ring_latency(order),
        }
    }
}

/// The best ring to add to rings already carrying `load`: least worst
/// load, then least latency, then the first found (so the result is
/// deterministic). Returns the ring and the candidates scored.
fn best_ring(costs: &Costs, load: &[f64]) -> (Vec<Rank>, u64) {
    if costs.n <= EXHAUSTIVE_MAX_RANKS {
        let mut scorer = Scorer::new(costs, load, false);
        (exhaustive(&mut scorer), scorer.candidates)
    } else {
        let mut scorer = Scorer::new(costs, load, true);
        (heuristic(&mut scorer), scorer.candidates)
    }
}

/// Every order with rank 0 first (Heap's algorithm over positions 1..).
fn exhaustive(scorer: &mut Scorer) -> Vec<Rank> {
    let n = scorer.costs.n;
    let mut order: Vec<Rank> = (0..n as Rank).collect();
    let mut best = order.clone();
    let mut best_score = scorer.score(&best);
    let mut c = vec![0usize; n];
    let mut i = 1;
    while i < n.saturating_sub(1) {
        if c[i] < i {
            let (x, y) = if i % 2 == 0 {
                (1, i + 1)
            } else {
                (c[i] + 1, i + 1)
            };
            order.swap(x, y);
            let s = scorer.score(&order);
            if s.better_than(&best_score) {
                best_score = s;
                best = order.clone();
            }
            c[i] += 1;
            i = 1;
        } else {
            c[i] = 0;
            i += 1;
        }
    }
    best
}

/// The best of three seeds (the rank order, its reverse, the greedy tour),
/// improved by local search within [`HEURISTIC_BUDGET`].
fn heuristic(scorer: &mut Scorer) -> Vec<Rank> {
    let n = scorer.costs.n as Rank;
    let identity: Vec<Rank> = (0..n).collect();
    let reversed: Vec<Rank> = std::iter::once(0).chain((1..n).rev()).collect();
    let greedy = greedy(scorer.costs, scorer.load);
    let mut best = identity;
    let mut best_score = scorer.score(&best);
    for seed in [reversed, greedy] {
        let s = scorer.score(&seed);
        if s.better_than(&best_score) {
            (best, best_score) = (seed, s);
        }
    }
    local_search(scorer, best, best_score)
}

/// Sweeps of 2-opt (reverse a stretch) and swaps (exchange two ranks; on
/// directed links a swap keeps the other edges' direction, which a
/// reversal does not), rank 0 staying first, until a sweep improves
/// nothing or the budget is spent.
fn local_search(scorer: &mut Scorer, mut best: Vec<Rank>, mut best_score: Score) -> Vec<Rank> {
    let n = scorer.costs.n;
    let mut cand = best.clone();
    let mut improved = true;
    while improved {
        improved = false;
        for i in 1..n - 1 {
            for j in i + 1..n {
                for reverse in [true, false] {
                    if scorer.candidates >= HEURISTIC_BUDGET {
                        return best;
                    }
                    cand.copy_from_slice(&best);
                    if reverse {
                        cand[i..=j].reverse();
                    } else {
                        cand.swap(i, j);
                    }
                    let s = scorer.score(&cand);
                    if s.better_than(&best_score) {
                        best.copy_from_slice(&cand);
                        best_score = s;
                        improved = true;
                    }
                }
            }
        }
    }
    best
}

/// A tour from rank 0 that always steps to the unvisited rank whose edge
/// leaves the resources it crosses least loaded (then the lowest
/// latency, then the lowest rank): O(n²) edge looks.
fn greedy(costs: &Costs, load: &[f64]) -> Vec<Rank> {
    let n = costs.n;
    let mut load = load.to_vec();
    let mut visited = vec![false; n];
    let mut order: Vec<Rank> = vec![0];
    visited[0] = true;
    while order.len() < n {
        let at = *order.last().expect("starts with rank 0");
        let next = (0..n as Rank)
            .filter(|&v| !visited[v as usize])
            .map(|v| (v, edge_peak(costs, &load, at, v)))
            .fold(
                None,
                |best: Option<(Rank, (f64, f64))>, (v, key)| match best {
                    Some((_, b)) if !lexically_less(key, b) => best,
                    _ => Some((v, key)),
                },
            )
            .map(|(v, _)| v)
            .expect("an unvisited rank is left");
        for &(r, w) in costs.edge(at, next) {
            load[r] += w;
        }
        visited[next as usize] = true;
        order.push(next);
    }
    order
}

/// The worst load over capacity edge `a → b` leaves on what it crosses,
/// and its latency.
fn edge_peak(costs: &Costs, load: &[f64], a: Rank, b: Rank) -> (f64, f64) {
    let peak = costs
        .edge(a, b)
        .iter()
        .map(|&(r, w)| (load[r] + w) / costs.capacity[r])
        .fold(0.0, f64::max);
    (peak, costs.latency[a as usize * costs.n + b as usize])
}

/// `(load, latency)` pairs compared with the search's margins.
fn lexically_less(a: (f64, f64), b: (f64, f64)) -> bool {
    a.0 < b.0 * (1.0 - LOAD_EPSILON)
        || (a.0 <= b.0 * (1.0 + LOAD_EPSILON) && a.1 < b.1 - LATENCY_EPSILON)
}

/// The ring set for the devices `devices` (rank `r` on `devices[r]`):
/// the best single ring, then more rings while the set's bandwidth grows
/// by more than 1 %, up to `max_rings`.
pub fn rings(
    topo: &Topology,
    devices: &[NodeId],
    cost: &CostModel,
    max_rings: usize,
) -> Result<RingSet, TopologyError> {
    let costs = Costs::new(topo, devices, cost)?;
    let mut load = vec![0.0; costs.capacity.len()];
    let mut orders: Vec<Vec<Rank>> = Vec::new();
    let mut bandwidth = 0.0;
    let mut candidates = 0;
    // bytes/µs → GB/s, with one unit of data spread over the rings.
    let set_bandwidth = |load: &[f64], k: usize| {
        let worst = costs.worst(load);
        if worst == 0.0 {
            f64::INFINITY
        } else {
            k as f64 / worst / 1e3
        }
    };
    while orders.len() < max_rings.max(1) {
        let (ring, scored) = best_ring(&costs, &load);
        candidates += scored;
        costs.add(&mut load, &ring);
        let bw = set_bandwidth(&load, orders.len() + 1);
        let gains = bw > bandwidth * 1.01;
        if !orders.is_empty() && !gains {
            break;
        }
        orders.push(ring);
        bandwidth = bw;
        if bw.is_infinite() {
            break;
        }
    }
    let greedy = RingSet {
        orders,
        bandwidth,
        candidates,
    };
    // A packing of rings can beat the greedy set, whose every added ring
    // must pay off at once (on a DGX-1 the third ring alone slows the set;
    // six together reach the graph's bound).
    match super::packing::pack(&costs, max_rings) {
        Some(packed) if packed.bandwidth > greedy.bandwidth * 1.01 => Ok(RingSet {
            candidates: packed.candidates + greedy.candidates,
            ..packed
        }),
        _ => Ok(greedy),
    }
}

/// The order to lay trees over: the best single ring, whose neighbours are
/// joined by the fastest paths.
pub fn tree_order(
    topo: &Topology,
    devices: &[NodeId],
    cost: &CostModel,
) -> Result<Vec<Rank>, TopologyError> {
    Ok(rings(topo, devices, cost, 1)?.orders.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    fn set(name: &str, max: usize) -> RingSet {
        let t = presets::by_name(name, 4).unwrap();
        rings(&t, &t.devices(), &CostModel::default(), max).unwrap()
    }

    #[test]
    fn the_dgx1_ring_stays_on_nvlink_and_adds_disjoint_rings() {
        let s = set("dgx1-v100", MAX_RINGS);
        let t = presets::by_name("dgx1-v100", 1).unwrap();
        for order in &s.orders {
            for i in 0..8 {
                let (a, b) = (order[i] as usize, order[(i + 1) % 8] as usize);
                assert!(
                    t.path_class(a, b).unwrap().to_string().starts_with("NV"),
                    "{order:?}: {a}->{b}"
                );
            }
        }
        // One NVLink 2 link is 25 GB/s raw, 20 effective: a single ring over
        // the mesh is held to its 1-link edges; more rings use the rest.
        assert!(s.orders.len() > 1, "{s:?}");
        assert!(s.bandwidth > 20.0 * 1.5, "{s:?}");
    }

    #[test]
    fn pcie_rings_cross_each_switch_uplink_once_per_direction() {
        // GPUs 0,1 share a switch, as do 2,3: 0-1-3-2 crosses each uplink
        // once each way; 0-2-1-3 would cross each twice.
        let s = set("pcie4-4gpu", 1);
        let o = &s.orders[0];
        let pos = |r: u32| o.iter().position(|&x| x == r).unwrap() as i32;
        assert_eq!((pos(0) - pos(1)).rem_euclid(4) % 2, 1, "{o:?}");
        let full = 24.0;
        assert!((s.bandwidth - full).abs() < 0.5, "{s:?}");
    }

    #[test]
    fn threads_need_no_search() {
        let s = set("host", MAX_RINGS);
        assert_eq!(s.orders, vec![vec![0, 1, 2, 3]]);
        assert!(s.bandwidth.is_infinite());
    }
}
