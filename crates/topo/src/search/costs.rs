//! What a ring search scores with, shared by the greedy search
//! (`ring.rs`) and the widest-ring packing (`packing.rs`): each pair's
//! route over the simulator's network, and the set both return.

use ferrocoll_core::Rank;

use crate::error::TopologyError;
use crate::graph::{NodeId, Topology};
use crate::sim::CostModel;
use crate::sim::network::Network;

/// Rings that run side by side, one channel each.
#[derive(Debug, Clone, PartialEq)]
pub struct RingSet {
    /// One order per ring.
    pub orders: Vec<Vec<Rank>>,
    /// What the set moves per second when every ring carries an equal
    /// share, GB/s: the capacity of the busiest resource over its load.
    /// Infinite when no edge crosses a modelled link (threads).
    pub bandwidth: f64,
    /// Whole ring orders scored to find the set, plus the packing's
    /// dynamic-programming steps where it ran: the search's work.
    pub candidates: u64,
}

/// Per-pair resource use and latency, from the simulator's own network model so
/// search and simulation agree on what a route costs.
pub(super) struct Costs {
    pub(super) n: usize,
    uses: Vec<Vec<(usize, f64)>>,
    pub(super) latency: Vec<f64>,
    pub(super) capacity: Vec<f64>,
}

impl Costs {
    pub(super) fn new(
        topo: &Topology,
        devices: &[NodeId],
        cost: &CostModel,
    ) -> Result<Costs, TopologyError> {
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

    /// The resources edge `a → b` crosses, with their weights.
    pub(super) fn edge(&self, a: Rank, b: Rank) -> &[(usize, f64)] {
        &self.uses[a as usize * self.n + b as usize]
    }

    /// Adds the ring `order`'s traffic to `load`.
    pub(super) fn add(&self, load: &mut [f64], order: &[Rank]) {
        for i in 0..order.len() {
            for &(r, w) in self.edge(order[i], order[(i + 1) % order.len()]) {
                load[r] += w;
            }
        }
    }

    /// The worst load per capacity; lower is better.
    pub(super) fn worst(&self, load: &[f64]) -> f64 {
        load.iter()
            .zip(&self.capacity)
            .map(|(l, c)| l / c)
            .fold(0.0, f64::max)
    }

    pub(super) fn ring_latency(&self, order: &[Rank]) -> f64 {
        (0..order.len())
            .map(|i| {
                self.latency[order[i] as usize * self.n + order[(i + 1) % order.len()] as usize]
            })
            .sum()
    }
}
