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
//! `S`); an all-reduce run as a reduce-scatter then an all-gather (rings,
//! ForestColl's packings) is bound by the harmonic mean of the two, which
//! is the same figure wherever links are symmetric. An all-reduce that
//! reduces on the way (trees) can beat that on lopsided graphs; any
//! all-reduce must still move one reduced value into and out of every
//! set that splits the members, so its bus bandwidth is at most
//! `2(N − 1)/N` times the smallest capacity between two members.
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

/// The bounds of a member set, per collective, in bus bandwidth (GB/s).
#[derive(Debug, Clone, PartialEq)]
pub struct Bounds {
    /// All-gather: links entering each cut.
    pub all_gather: Bound,
    /// Reduce-scatter: links leaving each cut.
    pub reduce_scatter: Bound,
    /// All-reduce as a reduce-scatter then an all-gather (rings, and the
    /// tree packings of ForestColl): the harmonic mean of the two.
    pub all_reduce: f64,
    /// Any all-reduce, reductions on the way included (trees):
    /// `2(N − 1)/N` × the smallest capacity between two members.
    pub all_reduce_any: f64,
}

/// One collective's bound, and the cut that sets it.
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

/// The throughput bounds of `members` (devices of `t`) on `t`'s links at
/// `cost`'s effective rates (see the module docs). Fewer than two members
/// need no communication: unlimited bounds. Members that cannot reach
/// each other on the chosen fabric: 0.
pub fn throughput_bounds(
    t: &Topology,
    members: &[NodeId],
    cost: &CostModel,
    fabric: Fabric,
    relays: Relays,
) -> Result<Bounds, TopologyError> {
    check_members(t, members)?;
    let usable = Usable::new(t, members, cost, fabric, relays);
    let all_gather = cut_bound(&usable, members, false);
    let reduce_scatter = cut_bound(&usable, members, true);
    let (ag, rs) = (all_gather.busbw, reduce_scatter.busbw);
    let all_reduce = if ag.is_infinite() || rs.is_infinite() {
        ag.min(rs)
    } else if ag <= 0.0 || rs <= 0.0 {
        0.0
    } else {
        2.0 / (1.0 / ag + 1.0 / rs)
    };
    Ok(Bounds {
        all_gather,
        reduce_scatter,
        all_reduce,
        all_reduce_any: any_all_reduce(&usable, members),
    })
}

/// The links that may carry the members' traffic, at their rates.
struct Usable {
    /// `(from, to, GB/s)`.
    links: Vec<(NodeId, NodeId, f64)>,
    nodes: usize,
}

impl Usable {
    fn new(
        t: &Topology,
        members: &[NodeId],
        cost: &CostModel,
        fabric: Fabric,
        relays: Relays,
    ) -> Usable {
        let mut member = vec![false; t.nodes.len()];
        for &m in members {
            member[m] = true;
        }
        let kept = |v: NodeId| relays == Relays::Any || !t.nodes[v].kind.is_device() || member[v];
        let links = t
            .links
            .iter()
            .filter(|l| kept(l.from) && kept(l.to))
            .filter(|l| fabric == Fabric::Every || l.kind.is_nvlink())
            .map(|l| (l.from, l.to, cost.effective_bandwidth(&l.kind, l.bandwidth)))
            .collect();
        Usable {
            links,
            nodes: t.nodes.len(),
        }
    }

    /// As a flow network (reversed: every link turned around), one node
    /// spare for a source.
    fn network(&self, reversed: bool) -> FlowNet {
        let mut net = FlowNet::new(self.nodes + 1);
        for &(a, b, c) in &self.links {
            let (from, to) = if reversed { (b, a) } else { (a, b) };
            net.add_edge(from, to, c);
        }
        net
    }
}

/// ForestColl's cut bound on `usable` (links turned around when
/// `reversed`: reduce-scatter's cuts are all-gather's on the reversed
/// graph), by Dinkelbach's method over maximum flows.
fn cut_bound(usable: &Usable, members: &[NodeId], reversed: bool) -> Bound {
    let n = members.len();
    if n < 2 {
        return Bound {
            busbw: f64::INFINITY,
            cut: Vec::new(),
            outside: 0,
        };
    }
    let base = usable.network(reversed);
    let source = usable.nodes;
    let incoming = |side: &[bool]| -> f64 {
        usable
            .links
            .iter()
            .map(|&(a, b, c)| if reversed { (b, a, c) } else { (a, b, c) })
            .filter(|&(a, b, _)| side[b] && !side[a])
            .map(|(_, _, c)| c)
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
        let mut worst: Option<(f64, usize, Vec<bool>)> = None;
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
                worst = Some((found, out, side));
            }
        }
        match worst {
            Some((found, out, side)) if found < x * (1.0 - TOLERANCE) => {
                (x, outside) = (found, out);
                cut = named_cut(usable, members, &side);
            }
            _ => break,
        }
    }
    Bound {
        busbw: (n - 1) as f64 * x.max(0.0),
        cut,
        outside,
    }
}

/// The nodes of a cut's side worth naming: members, and nodes a usable
/// link touches (a CPU off the fabric is on the side only nominally).
fn named_cut(usable: &Usable, members: &[NodeId], side: &[bool]) -> Vec<NodeId> {
    (0..usable.nodes)
        .filter(|&v| side[v])
        .filter(|&v| members.contains(&v) || usable.links.iter().any(|&(a, b, _)| a == v || b == v))
        .collect()
}

/// `2(N − 1)/N` × the smallest capacity between two members, the bound of
/// any all-reduce: every set holding some members but not all must take in
/// a reduced value of the call's size, and send one out. The smallest such
/// capacity is a maximum flow between the first member and another, one
/// way or the other.
fn any_all_reduce(usable: &Usable, members: &[NodeId]) -> f64 {
    let n = members.len();
    if n < 2 {
        return f64::INFINITY;
    }
    let base = usable.network(false);
    let m0 = members[0];
    let least = members[1..]
        .iter()
        .flat_map(|&v| [(m0, v), (v, m0)])
        .map(|(a, b)| base.clone().max_flow(a, b))
        .fold(f64::INFINITY, f64::min);
    2.0 * (n - 1) as f64 / n as f64 * least
}

/// Rounds of the cut search; each lowers the rate to a different cut's,
/// and in practice two or three suffice (should it ever stop here, the
/// figure is still a cut's ratio: an upper bound, maybe not the least).
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

#[cfg(test)]
mod tests;
