//! The ring search.

use ferrocoll_core::Rank;

use crate::error::TopologyError;
use crate::graph::{NodeId, Topology};
use crate::sim::CostModel;
use crate::sim::engine::Network;

/// Up to this many ranks every ring order is tried (rank 0 fixed first):
/// 8! = 40320 orders at 9 ranks.
pub const EXHAUSTIVE_MAX_RANKS: usize = 9;
/// Rings tried per set at most.
pub const MAX_RINGS: usize = 4;

/// Rings that run side by side, one channel each.
#[derive(Debug, Clone, PartialEq)]
pub struct RingSet {
    /// One order per ring.
    pub orders: Vec<Vec<Rank>>,
    /// What the set moves per second when every ring carries an equal
    /// share, GB/s: the capacity of the busiest resource over its load.
    /// Infinite when no edge crosses a modelled link (threads).
    pub bandwidth: f64,
}

/// Per-pair resource use and latency, from the simulator's own network model so
/// search and simulation agree on what a route costs.
struct Costs {
    n: usize,
    uses: Vec<Vec<(usize, f64)>>,
    latency: Vec<f64>,
    capacity: Vec<f64>,
}

impl Costs {
    fn new(topo: &Topology, devices: &[NodeId], cost: &CostModel) -> Result<Costs, TopologyError> {
        let n = devices.len();
        let mut network = Network::new(topo, devices.to_vec(), cost);
        let mut uses = vec![Vec::new(); n * n];
        let mut latency = vec![0.0; n * n];
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    let (u, l) = network.route(a as u32, b as u32)?;
                    uses[a * n + b] = u;
                    latency[a * n + b] = l;
                }
            }
        }
        let capacity = network.resources.iter().map(|r| r.capacity).collect();
        Ok(Costs {
            n,
            uses,
            latency,
            capacity,
        })
    }

    fn add(&self, load: &mut [f64], order: &[Rank], sign: f64) {
        for i in 0..order.len() {
            let (a, b) = (order[i] as usize, order[(i + 1) % order.len()] as usize);
            for &(r, w) in &self.uses[a * self.n + b] {
                load[r] += sign * w;
            }
        }
    }

    /// The worst load per capacity; lower is better.
    fn worst(&self, load: &[f64]) -> f64 {
        load.iter()
            .zip(&self.capacity)
            .map(|(l, c)| l / c)
            .fold(0.0, f64::max)
    }

    fn latency(&self, order: &[Rank]) -> f64 {
        (0..order.len())
            .map(|i| {
                self.latency[order[i] as usize * self.n + order[(i + 1) % order.len()] as usize]
            })
            .sum()
    }
}

/// The best ring to add to rings already carrying `load`: least worst
/// load, then least latency, then the first found (so the result is
/// deterministic).
fn best_ring(costs: &Costs, load: &mut [f64]) -> Vec<Rank> {
    let n = costs.n as Rank;
    let score = |order: &[Rank], load: &mut [f64]| {
        costs.add(load, order, 1.0);
        let s = (costs.worst(load), costs.latency(order));
        costs.add(load, order, -1.0);
        s
    };
    let better = |a: (f64, f64), b: (f64, f64)| {
        a.0 < b.0 * (1.0 - 1e-9) || (a.0 <= b.0 * (1.0 + 1e-9) && a.1 < b.1 - 1e-9)
    };
    let mut best: Vec<Rank> = (0..n).collect();
    let mut best_score = score(&best, load);
    if costs.n <= EXHAUSTIVE_MAX_RANKS {
        let mut order: Vec<Rank> = (0..n).collect();
        // Heap's algorithm over positions 1.., keeping rank 0 first.
        let mut c = vec![0usize; costs.n];
        let mut i = 1;
        while i < costs.n.saturating_sub(1) {
            if c[i] < i {
                let (x, y) = if i % 2 == 0 {
                    (1, i + 1)
                } else {
                    (c[i] + 1, i + 1)
                };
                order.swap(x, y);
                let s = score(&order, load);
                if better(s, best_score) {
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
    } else {
        // 2-opt from rank order: reverse any stretch that lowers the score.
        let mut improved = true;
        let mut rounds = 0;
        while improved && rounds < 50 {
            improved = false;
            rounds += 1;
            for i in 1..costs.n - 1 {
                for j in i + 1..costs.n {
                    let mut cand = best.clone();
                    cand[i..=j].reverse();
                    let s = score(&cand, load);
                    if better(s, best_score) {
                        best = cand;
                        best_score = s;
                        improved = true;
                    }
                }
            }
        }
    }
    best
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
        let ring = best_ring(&costs, &mut load);
        costs.add(&mut load, &ring, 1.0);
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
    Ok(RingSet { orders, bandwidth })
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
