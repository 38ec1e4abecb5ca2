//! The steady-state estimate: the detailed engine's walk at fixed shares.
//!
//! The detailed engine recomputes max-min fair shares every time a flow
//! starts or ends, which costs a pass over every flow in flight: at a
//! thousand GPUs with dozens of channels that is millions of passes over
//! thousands of flows. In a pipeline's steady state the shares hardly
//! move: every stream (a link of the plan, or a channel's local work)
//! that crosses a resource keeps about one flow on it. So here each flow
//! gets, for its whole life, the share it would have if every stream that
//! ever crosses each of its resources were active at once:
//! `capacity / Σ weights` on the tightest of them. A link's messages then
//! leave one after another, and an instruction costs a few heap
//! operations.
//!
//! What it is exact for, and what not: a resource whose streams are all
//! busy together (a ring's links, an all-to-all's switch ports) is shared
//! as the fair engine shares it. A resource whose streams take turns (a
//! tree's phases, a hierarchy's inner and outer rings on one memory) is
//! charged as if they overlapped, so the estimate is slower than the
//! detailed run there; `sim`'s tests cross-check the two on every preset
//! that both can run, and docs/topology.md lists the differences.

use ferrocoll_core::plan::ExecutionPlan;

use super::fairshare::Uses;
use super::network::Network;
use crate::error::TopologyError;

/// Work units charged per instruction weighed here (a route lookup and a
/// few additions).
const COUNT_WORK: u64 = 4;

/// Each resource's weight at its busiest step, and what a run at those
/// shares saw.
#[derive(Debug, Clone)]
pub(crate) struct Shares {
    weight: Vec<f64>,
    /// Per resource: weight × time of its flows, when its last flow ends,
    /// and the time it had any flow.
    seen: Vec<(f64, f64, f64)>,
}

impl Shares {
    /// Weigh `plan`'s first segment on `net`'s resources (blocks added):
    /// the instructions of one step index of their channels run about
    /// together (a ring's every link at once, a halving-doubling's one
    /// partner at a time), so a resource's weight is the largest sum, over
    /// step indices, of the weights that step's flows put on it.
    pub(crate) fn of(net: &mut Network, plan: &ExecutionPlan) -> Result<Shares, TopologyError> {
        // The first segment the plan has (a plan from a file need not
        // start at 0).
        let instructions = || {
            plan.ranks
                .iter()
                .flat_map(|rp| rp.channels.iter().flatten())
        };
        let first = instructions().map(|ins| ins.segment).min().unwrap_or(0);
        let mut order: Vec<(u32, u32, u32, u32)> = Vec::new();
        for rp in &plan.ranks {
            for (c, list) in rp.channels.iter().enumerate() {
                crate::work::charge(COUNT_WORK * list.len() as u64)?;
                for (i, ins) in list.iter().enumerate() {
                    if ins.segment == first {
                        order.push((ins.step, rp.rank, c as u32, i as u32));
                    }
                }
            }
        }
        order.sort_unstable();
        let mut weight = vec![0.0; net.resources.len()];
        let mut now = vec![0.0; net.resources.len()];
        let mut touched: Vec<usize> = Vec::new();
        let add = |uses: &Uses, now: &mut Vec<f64>, touched: &mut Vec<usize>| {
            for &(r, w) in uses {
                if now[r] == 0.0 {
                    touched.push(r);
                }
                now[r] += w;
            }
        };
        for (k, &(step, rank, channel, i)) in order.iter().enumerate() {
            let ins = &plan.ranks[rank as usize].channels[channel as usize][i as usize];
            if let Some((_, uses)) = net.work_flow(rank, channel, ins, plan.in_place, false) {
                add(&uses, &mut now, &mut touched);
            }
            for m in &ins.send {
                let (uses, _) = net.transfer_flow(rank, channel, ins, m.peer)?;
                add(&uses, &mut now, &mut touched);
            }
            if order.get(k + 1).is_none_or(|next| next.0 != step) {
                for r in touched.drain(..) {
                    weight[r] = f64::max(weight[r], now[r]);
                    now[r] = 0.0;
                }
            }
        }
        let seen = vec![(0.0, 0.0, 0.0); weight.len()];
        Ok(Shares { weight, seen })
    }

    /// A flow over `uses` runs from `start` to `end`.
    pub(crate) fn note(&mut self, uses: &Uses, start: f64, end: f64) {
        for &(r, w) in uses {
            let (load, covered, busy) = &mut self.seen[r];
            *load += w * (end - start);
            *busy += (end - start.max(*covered)).max(0.0);
            *covered = covered.max(end);
        }
    }

    /// The shares for a second run: each resource weighted by how many
    /// flows it held on average while it held any in this one. Streams
    /// of one step index that drift apart (trees of many channels) never
    /// all hold a resource at once, and the first weighing charged them
    /// as if they did.
    pub(crate) fn refined(&self) -> Shares {
        let weight = self
            .weight
            .iter()
            .zip(&self.seen)
            .map(|(&w, &(load, _, busy))| if busy > 0.0 { (load / busy).min(w) } else { w })
            .collect();
        let seen = vec![(0.0, 0.0, 0.0); self.weight.len()];
        Shares { weight, seen }
    }

    /// Bytes per µs a flow over `uses` gets: its share of the tightest
    /// resource it crosses (infinite when it crosses none).
    pub(crate) fn rate(&self, capacity: &[f64], uses: &Uses) -> f64 {
        uses.iter()
            .map(|&(r, w)| capacity[r] / self.weight[r].max(w))
            .fold(f64::INFINITY, f64::min)
    }
}
