//! The node structure of a multi-node topology, for the hierarchical
//! all-reduce: which members share a machine (what remains connected once
//! the network's links are cut), each machine's ring, and the rails.
//!
//! Machines are taken to be alike (the presets' clusters, a real
//! cluster's nodes): the ring is searched on the first machine and every
//! other machine's members follow it in device order, so the `k`-th
//! member of every machine sits at the same ring position. Where the
//! allocation takes the same GPUs of every machine, that is the same GPU
//! — the same NIC, rail and, in a rail-optimized network, leaf switch;
//! otherwise (GPUs 4-7 of one machine with 0-3 of another) the rail
//! crosses leaf switches, which is correct and simulated as it is, only
//! slower.

use ferrocoll_core::Rank;
use ferrocoll_core::algorithms::hierarchical::Hierarchy;

use crate::error::TopologyError;
use crate::graph::{LinkKind, NodeId, Topology};
use crate::sim::CostModel;

/// The hierarchy of `devices` (ranks in this order) on `topo`, or `None`
/// where they are not spread over several machines with as many members
/// each.
pub fn hierarchy(
    topo: &Topology,
    devices: &[NodeId],
    cost: &CostModel,
) -> Result<Option<Hierarchy>, TopologyError> {
    let machines = machines(topo, devices);
    let per_machine = machines.first().map_or(0, Vec::len);
    if machines.len() < 2 || machines.iter().any(|m| m.len() != per_machine) {
        return Ok(None);
    }
    let first: Vec<NodeId> = machines[0].iter().map(|&r| devices[r as usize]).collect();
    let order = super::tree_order(topo, &first, cost)?;
    let nodes = machines
        .iter()
        .map(|members| order.iter().map(|&k| members[k as usize]).collect())
        .collect();
    Ok(Some(Hierarchy { nodes }))
}

/// The ranks of `devices` grouped by machine (connected without the
/// network's links), machines in order of their first rank, ranks in
/// order within each.
fn machines(topo: &Topology, devices: &[NodeId]) -> Vec<Vec<Rank>> {
    let mut root: Vec<usize> = (0..topo.nodes.len()).collect();
    fn find(root: &mut [usize], mut v: usize) -> usize {
        while root[v] != v {
            root[v] = root[root[v]];
            v = root[v];
        }
        v
    }
    for l in topo.links.iter().filter(|l| l.kind != LinkKind::Network) {
        let (a, b) = (find(&mut root, l.from), find(&mut root, l.to));
        root[a] = b;
    }
    let mut machines: Vec<(usize, Vec<Rank>)> = Vec::new();
    for (rank, &d) in devices.iter().enumerate() {
        let m = find(&mut root, d);
        match machines.iter_mut().find(|(id, _)| *id == m) {
            Some((_, ranks)) => ranks.push(rank as Rank),
            None => machines.push((m, vec![rank as Rank])),
        }
    }
    machines.into_iter().map(|(_, ranks)| ranks).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    #[test]
    fn clusters_split_into_their_machines_with_rails_aligned() {
        let t = presets::by_name("dgx-a100x4", 0).unwrap();
        let h = hierarchy(&t, &t.devices(), &CostModel::default())
            .unwrap()
            .unwrap();
        assert_eq!(h.nodes.len(), 4);
        for (m, node) in h.nodes.iter().enumerate() {
            assert_eq!(node.len(), 8);
            for (p, &r) in node.iter().enumerate() {
                assert_eq!(r / 8, m as Rank, "rank {r} in machine {m}");
                assert_eq!(r % 8, h.nodes[0][p] % 8, "rail {p}");
            }
        }
    }

    #[test]
    fn one_machine_or_uneven_machines_have_no_hierarchy() {
        let cost = CostModel::default();
        let one = presets::by_name("dgx-h100", 0).unwrap();
        assert_eq!(hierarchy(&one, &one.devices(), &cost).unwrap(), None);
        let two = presets::by_name("dgx-h100x2", 0).unwrap();
        let d = two.devices();
        let uneven: Vec<NodeId> = d[..11].to_vec();
        assert_eq!(hierarchy(&two, &uneven, &cost).unwrap(), None);
        // GPUs 4-7 of one machine with 0-3 of the other: paired in
        // device order (n0-GPU4 with n1-GPU0), across rails.
        let even: Vec<NodeId> = d[4..12].to_vec();
        let h = hierarchy(&two, &even, &cost).unwrap().unwrap();
        assert_eq!(h.nodes.len(), 2);
        assert!(h.nodes[0].iter().all(|&r| r < 4));
    }
}
