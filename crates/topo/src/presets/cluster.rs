//! Several DGX nodes joined by a rail-optimized network: node `k`'s NIC
//! `r` plugs into rail switch `r`, so GPU `i` of every node reaches GPU
//! `i` of every other through one leaf switch. Each node is the one-node
//! preset (its GPUs, NVSwitch, PCIe switches and CPUs, names prefixed
//! `n{k}-`); its NICs hang off the PCIe switches, spread evenly, so the
//! GPU–NIC affinity comes from the PCIe tree (a GPU's route to the network
//! leaves through the NIC behind its own switch). Network links carry the
//! NIC's line rate; the simulator's `network_efficiency` states what
//! payload gets of it.
//!
//! Sources: DGX A100 — eight ConnectX-6 HDR InfiniBand compute ports of
//! 200 Gb/s (25 GB/s per direction), two per PCIe switch (NVIDIA DGX A100
//! user guide, 2020); DGX H100 — eight ConnectX-7 NDR ports of 400 Gb/s
//! (50 GB/s per direction) behind the PCIe 5.0 switches (NVIDIA DGX H100
//! user guide, 2022); a leaf switch hop about 1 µs (NVIDIA Quantum
//! InfiniBand switch datasheets: 130 ns port to port, taken generously
//! with the NIC's own latency).

use crate::error::TopologyError;
use crate::graph::{LinkKind, Node, NodeId, NodeKind, Topology};

/// One hop of NIC to leaf switch, µs.
const NETWORK_HOP_US: f64 = 1.0;

/// What a cluster preset is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// The one-node preset each node is (`dgx-a100`, `dgx-h100`).
    pub node: &'static str,
    /// How many nodes.
    pub nodes: usize,
    /// NICs per node (one rail each).
    pub nics: usize,
    /// Line rate of each NIC per direction, GB/s.
    pub nic_gbps: f64,
}

/// The most nodes a cluster preset takes: 8 GPUs each, the library's
/// largest world (1,024 ranks).
pub const MAX_NODES: usize = 128;

/// The cluster presets: `dgx-a100xN` and `dgx-h100xN` for any N from 2 to
/// [`MAX_NODES`] (`dgx-h100x8` is 64 GPUs, `dgx-h100x128` 1,024), each
/// optionally with `:nics=N,gbps=R` (NICs per node, GB/s per NIC and
/// direction).
pub fn parse(name: &str) -> Option<Result<Cluster, TopologyError>> {
    let (base, params) = name.split_once(':').unwrap_or((name, ""));
    let (node, nic_gbps, count) = if let Some(n) = base.strip_prefix("dgx-a100x") {
        ("dgx-a100", 25.0, n)
    } else if let Some(n) = base.strip_prefix("dgx-h100x") {
        ("dgx-h100", 50.0, n)
    } else {
        return None;
    };
    let nodes = match count.parse::<usize>() {
        Ok(n) if (2..=MAX_NODES).contains(&n) => n,
        _ => {
            return Some(Err(TopologyError::Invalid(format!(
                "`{base}`: a cluster preset takes 2 to {MAX_NODES} nodes (`{node}x2` … `{node}x{MAX_NODES}`)"
            ))));
        }
    };
    let mut c = Cluster {
        node,
        nodes,
        nics: 8,
        nic_gbps,
    };
    for part in params.split(',').filter(|p| !p.is_empty()) {
        let bad = || {
            TopologyError::Invalid(format!(
                "`{part}` in `{name}`: parameters are nics=1..=64 and gbps=(0, 10000]"
            ))
        };
        let (key, value) = match part.split_once('=') {
            Some(kv) => kv,
            None => return Some(Err(bad())),
        };
        match key.trim() {
            "nics" => match value.trim().parse::<usize>() {
                Ok(n) if (1..=64).contains(&n) => c.nics = n,
                _ => return Some(Err(bad())),
            },
            "gbps" => match value.trim().parse::<f64>() {
                Ok(r) if r > 0.0 && r <= 10_000.0 => c.nic_gbps = r,
                _ => return Some(Err(bad())),
            },
            _ => return Some(Err(bad())),
        }
    }
    Some(Ok(c))
}

impl Cluster {
    /// The topology: every node, its NICs, and one switch per rail.
    pub fn build(&self) -> Result<Topology, TopologyError> {
        let mut t = Topology::new(
            format!("{}x{}", self.node, self.nodes),
            format!(
                "{} nodes of {}, {} NICs of {} GB/s each per node on a rail-optimized network (NIC r of every node on leaf switch r)",
                self.nodes, self.node, self.nics, self.nic_gbps
            ),
        );
        let rails: Vec<NodeId> = (0..self.nics)
            .map(|r| t.add_node(Node::new(format!("RAIL{r}"), NodeKind::NetworkSwitch)))
            .collect();
        for k in 0..self.nodes {
            let one = super::by_name(self.node, 0)?;
            let ids = append(&mut t, &one, &format!("n{k}-"));
            let switches: Vec<NodeId> = (0..one.nodes.len())
                .filter(|&v| one.nodes[v].kind == NodeKind::PcieSwitch)
                .map(|v| ids[v])
                .collect();
            let pcie = one
                .links
                .iter()
                .find(|l| l.kind.is_pcie())
                .map(|l| l.kind.clone())
                .ok_or_else(|| TopologyError::Invalid(format!("`{}` has no PCIe", self.node)))?;
            for (r, &rail) in rails.iter().enumerate() {
                let nic = t.add_node(Node::new(format!("n{k}-NIC{r}"), NodeKind::Nic));
                let sw = switches[r * switches.len() / self.nics];
                t.connect(nic, sw, pcie.clone());
                t.connect_with(nic, rail, LinkKind::Network, self.nic_gbps, NETWORK_HOP_US);
            }
        }
        t.validate()?;
        Ok(t)
    }
}

/// Copy `part`'s nodes (names prefixed), links and peer-to-peer blocks
/// into `t`; returns where each of `part`'s nodes went.
pub(super) fn append(t: &mut Topology, part: &Topology, prefix: &str) -> Vec<NodeId> {
    let ids: Vec<NodeId> = part
        .nodes
        .iter()
        .map(|n| {
            let mut n = n.clone();
            n.name = format!("{prefix}{}", n.name);
            t.add_node(n)
        })
        .collect();
    for l in &part.links {
        let mut l = l.clone();
        l.from = ids[l.from];
        l.to = ids[l.to];
        t.links.push(l);
    }
    for &(a, b) in &part.p2p_blocked {
        t.block_p2p(ids[a], ids[b]);
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PathClass;

    #[test]
    fn any_node_count_from_2_to_128_builds_and_others_are_refused() {
        for (name, gpus) in [
            ("dgx-a100x3", 24),
            ("dgx-h100x16", 128),
            ("dgx-h100x128", 1024),
        ] {
            let t = parse(name).unwrap().unwrap().build().unwrap();
            assert_eq!(t.devices().len(), gpus, "{name}");
        }
        for bad in [
            "dgx-h100x1",
            "dgx-h100x129",
            "dgx-h100x",
            "dgx-h100x-2",
            "dgx-a100x2x",
        ] {
            let e = parse(bad).unwrap().unwrap_err().to_string();
            assert!(e.contains("2 to 128 nodes"), "{bad}: {e}");
        }
        assert!(parse("dgx-b200x2").is_none());
    }

    #[test]
    fn two_dgx_h100_nodes_meet_over_their_rails() {
        let t = parse("dgx-h100x2").unwrap().unwrap().build().unwrap();
        assert_eq!(t.devices().len(), 16);
        let d = t.devices();
        // GPU0 of node 0 and GPU0 of node 1: through the network, via the
        // NIC behind GPU0's own PCIe switch.
        assert_eq!(t.path_class(d[0], d[8]).unwrap(), PathClass::Net);
        assert!(matches!(
            t.path_class(d[0], d[1]).unwrap(),
            PathClass::NvLink(_)
        ));
        let r = t.route(d[0], d[8]).unwrap();
        let names: Vec<&str> = r
            .links
            .iter()
            .map(|&l| t.nodes[t.links[l].to].name.as_str())
            .collect();
        assert!(
            names.contains(&"n0-NIC0") && names.contains(&"RAIL0"),
            "{names:?}"
        );
    }

    #[test]
    fn parameters_are_checked() {
        let c = parse("dgx-a100x4:nics=4,gbps=12.5").unwrap().unwrap();
        assert_eq!((c.nodes, c.nics, c.nic_gbps), (4, 4, 12.5));
        let t = c.build().unwrap();
        assert_eq!(t.devices().len(), 32);
        for bad in [
            "dgx-a100x2:nics=0",
            "dgx-a100x2:gbps=-1",
            "dgx-h100x2:x=1",
            "dgx-h100x2:nics",
        ] {
            assert!(parse(bad).unwrap().is_err(), "{bad}");
        }
        assert!(parse("dgx-a100x3").unwrap().is_ok(), "any node count");
    }
}
