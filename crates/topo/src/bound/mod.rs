//! The throughput bound of a member set on a link graph: no schedule of
//! all-gather, reduce-scatter or all-reduce among the members can reach a
//! higher bus bandwidth on these links at the simulator's rates.
//!
//! All-gather: every set `S` of nodes that holds some members but not all
//! must take in the blocks of the members outside it, `|M ∖ S| · b` bytes,
//! through the links entering it, of capacity `B_in(S)`; so a call of
//! block `b` takes at least `|M ∖ S| · b / B_in(S)`, and its bus bandwidth
//! `(N − 1) · b / T` is at most
//!
//! ```text
//! (N − 1) · min over S of B_in(S) / |M ∖ S|
//! ```
//!
//! — the cut formula of ForestColl (Zhao et al., 2024), also reached by its
//! spanning-tree packings. Reduce-scatter is the mirror (links leaving
//! `S`), and all-reduce, as a reduce-scatter then an all-gather, has the
//! same bound in bus bandwidth.
//!
//! The minimum is found with maximum flows rather than by listing cuts: a
//! rate `x` per member is feasible exactly when every member `r` can take
//! in `x` from every member at once — a flow of `x · N` from a source
//! joined to each member by an edge of capacity `x` — and a member that
//! cannot names a cut whose ratio is below `x`. Starting from an upper
//! bound and moving to each violated cut's ratio (Dinkelbach's method)
//! ends at the exact minimum after a few rounds.

mod flow;

use crate::graph::NodeId;
use crate::sim::CostModel;
use crate::{Topology, TopologyError};
use flow::FlowNet;

/// Which links may carry the collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fabric {
    /// Every link of the graph: PCIe, the CPUs' interconnect, NICs too.
    Every,
    /// NVLink (and the NVSwitches it reaches) only — the fabric NCCL's
    /// rings and trees use where there is one.
    Nvlink,
}

/// Whether devices outside the member set may forward data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relays {
    /// Any node may forward (switches, CPUs, other GPUs).
    Any,
    /// Only members and the non-device nodes (switches, CPUs, NICs).
    MembersOnly,
}

/// The bound, and the cut that sets it.
#[derive(Debug, Clone, PartialEq)]
pub struct Bound {
    /// The highest bus bandwidth any schedule can reach, GB/s.
    pub busbw: f64,
    /// The bottleneck: a node set `S` whose incoming links give the
    /// minimum (empty when the bound is unlimited).
    pub cut: Vec<NodeId>,
    /// Members outside that set.
    pub outside: usize,
}

/// The throughput bound of `members` (devices of `t`) on `t`'s links at
/// `cost`'s effective rates (see the module docs). Fewer than two members
/// need no communication: an unlimited bound. Members that cannot reach
/// each other on the chosen fabric: 0.
pub fn throughput_bound(
    t: &Topology,
    members: &[NodeId],
    cost: &CostModel,
    fabric: Fabric,
    relays: Relays,
) -> Result<Bound, TopologyError> {
    check_members(t, members)?;
    let n = members.len();
    if n < 2 {
        return Ok(Bound {
            busbw: f64::INFINITY,
            cut: Vec::new(),
            outside: 0,
        });
    }
    let base = network(t, members, cost, fabric, relays);
    let source = t.nodes.len();
    let incoming = |side: &[bool]| -> f64 {
        t.links
            .iter()
            .filter(|l| carries(t, members, l, fabric, relays))
            .filter(|l| side[l.to] && !side[l.from])
            .map(|l| cost.effective_bandwidth(&l.kind, l.bandwidth))
            .sum()
    };
    let ratio = |side: &[bool]| {
        let outside = members.iter().filter(|&&m| !side[m]).count();
        (incoming(side) / outside as f64, outside)
    };
    // An upper bound to start from: the first member alone.
    let mut first = vec![false; source + 1];
    first[members[0]] = true;
    let (mut x, mut outside) = ratio(&first);
    let mut cut = vec![members[0]];
    for _ in 0..MAX_ROUNDS {
        if x <= 0.0 {
            break;
        }
        let mut worst: Option<(f64, usize, Vec<NodeId>)> = None;
        for &r in members {
            let mut net = base.clone();
            for &m in members {
                net.add_edge(source, m, x);
            }
            if net.max_flow(source, r) >= x * n as f64 * (1.0 - TOLERANCE) {
                continue;
            }
            // The sink's side of the minimum cut takes in less than it needs.
            let side: Vec<bool> = net.reachable(source).iter().map(|&s| !s).collect();
            let (found, out) = ratio(&side);
            if found < worst.as_ref().map_or(x, |w| w.0) {
                let nodes = (0..source).filter(|&v| side[v]).collect();
                worst = Some((found, out, nodes));
            }
        }
        match worst {
            Some((found, out, nodes)) if found < x * (1.0 - TOLERANCE) => {
                (x, outside, cut) = (found, out, nodes);
            }
            _ => break,
        }
    }
    Ok(Bound {
        busbw: (n - 1) as f64 * x.max(0.0),
        cut,
        outside,
    })
}

/// Rounds of the cut search; each lowers the rate to a different cut's,
/// and in practice two or three suffice.
const MAX_ROUNDS: usize = 64;

/// Relative slack for flows and rates computed in floating point.
const TOLERANCE: f64 = 1e-9;

fn check_members(t: &Topology, members: &[NodeId]) -> Result<(), TopologyError> {
    for (i, &m) in members.iter().enumerate() {
        let ok = t.nodes.get(m).is_some_and(|n| n.kind.is_device());
        if !ok || members[..i].contains(&m) {
            return Err(TopologyError::Invalid(format!(
                "member {m} is not a device of `{}` or is listed twice",
                t.name
            )));
        }
    }
    Ok(())
}

/// Whether link `l` may carry the members' traffic.
fn carries(
    t: &Topology,
    members: &[NodeId],
    l: &crate::PhysicalLink,
    fabric: Fabric,
    relays: Relays,
) -> bool {
    let kept =
        |v: NodeId| relays == Relays::Any || !t.nodes[v].kind.is_device() || members.contains(&v);
    kept(l.from) && kept(l.to) && (fabric == Fabric::Every || l.kind.is_nvlink())
}

/// The topology's usable links as a flow network, one node spare for the
/// source.
fn network(
    t: &Topology,
    members: &[NodeId],
    cost: &CostModel,
    fabric: Fabric,
    relays: Relays,
) -> FlowNet {
    let mut net = FlowNet::new(t.nodes.len() + 1);
    for l in &t.links {
        if carries(t, members, l, fabric, relays) {
            net.add_edge(l.from, l.to, cost.effective_bandwidth(&l.kind, l.bandwidth));
        }
    }
    net
}

#[cfg(test)]
mod tests;
