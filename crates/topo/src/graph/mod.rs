//! The link graph: devices, switches and processors joined by directed links.
//!
//! Ranks run on **devices** — GPUs, or threads for the CPU executor — and
//! rank `r` is the `r`-th device in node order. Everything else (CPUs,
//! PCIe switches and host bridges, NVSwitches, NICs) only forwards data.
//! Links are directed, because every interconnect here is full duplex and
//! the two directions are separate resources; [`Topology::connect`] adds
//! both. Bandwidth is per direction in GB/s (1e9 B/s), latency in µs.

mod file;
mod link;
mod order;
mod route;
mod subset;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use file::{FORMAT_NAME, FORMAT_VERSION};
pub use link::LinkKind;
pub(crate) use route::Router;
pub use route::{PathClass, Route};

use crate::error::TopologyError;

/// Index of a node in [`Topology::nodes`].
pub type NodeId = usize;
/// Index of a link in [`Topology::links`].
pub type LinkId = usize;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    /// A GPU: runs a rank.
    Gpu,
    /// A thread of the CPU executor: runs a rank.
    Thread,
    /// A CPU socket / NUMA node with its memory and PCIe root complex.
    Cpu,
    /// A PCIe host bridge (root port) of a CPU, when modelled apart from it.
    HostBridge,
    /// A PCIe switch (PLX, Broadcom).
    PcieSwitch,
    /// An NVSwitch (or several modelled as one fabric).
    NvSwitch,
    /// A network interface.
    Nic,
    /// A network switch (an InfiniBand or Ethernet leaf, one per rail).
    NetworkSwitch,
}

impl NodeKind {
    /// Whether ranks run on nodes of this kind.
    pub const fn is_device(self) -> bool {
        matches!(self, NodeKind::Gpu | NodeKind::Thread)
    }

    /// The lowercase name used in files and listings.
    pub const fn name(self) -> &'static str {
        match self {
            NodeKind::Gpu => "gpu",
            NodeKind::Thread => "thread",
            NodeKind::Cpu => "cpu",
            NodeKind::HostBridge => "host_bridge",
            NodeKind::PcieSwitch => "pcie_switch",
            NodeKind::NvSwitch => "nv_switch",
            NodeKind::Nic => "nic",
            NodeKind::NetworkSwitch => "network_switch",
        }
    }
}

impl fmt::Display for NodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One node of the graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Unique name (`GPU0`, `CPU1`, `PLX0`, `NVSwitch`).
    pub name: String,
    /// What it is.
    pub kind: NodeKind,
    /// The NUMA node it belongs to, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// PCI bus id (`0000:07:00.0`), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// Bandwidth of the node's own memory in GB/s (GPU HBM, CPU DRAM), where
    /// modelled: reductions on a device and copies staged in host memory
    /// share it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bandwidth: Option<f64>,
    /// Cores a CPU node has to run threads on, where modelled; threads
    /// beyond it take turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
}

impl Node {
    /// A node with only a name and a kind.
    pub fn new(name: impl Into<String>, kind: NodeKind) -> Self {
        Node {
            name: name.into(),
            kind,
            numa: None,
            pci_bus_id: None,
            memory_bandwidth: None,
            cores: None,
        }
    }

    /// With a NUMA node.
    pub fn numa(mut self, numa: u32) -> Self {
        self.numa = Some(numa);
        self
    }

    /// With a memory bandwidth in GB/s.
    pub fn memory_bandwidth(mut self, gbps: f64) -> Self {
        self.memory_bandwidth = Some(gbps);
        self
    }

    /// With a core count.
    pub fn cores(mut self, cores: u32) -> Self {
        self.cores = Some(cores);
        self
    }

    /// With a PCI bus id.
    pub fn pci_bus_id(mut self, id: impl Into<String>) -> Self {
        self.pci_bus_id = Some(id.into());
        self
    }
}

/// One direction of a physical connection between two nodes. (A
/// schedule's *link* — sender, receiver, channel — is
/// `ferrocoll_core::types::Link`; many of those may share one physical link.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhysicalLink {
    /// Source node.
    pub from: NodeId,
    /// Destination node.
    pub to: NodeId,
    /// What the link is made of.
    pub kind: LinkKind,
    /// Raw rate in this direction, GB/s.
    pub bandwidth: f64,
    /// One-way latency of the hop, µs.
    pub latency_us: f64,
}

/// A machine's link graph. Build one with [`Topology::new`],
/// [`Topology::add_node`] and [`Topology::connect`], take a preset from
/// [`crate::presets`], or load one ([`Topology::from_json`], the parsers in
/// [`crate::sources`]).
///
/// Invariants (checked by [`Topology::validate`], which every loader and
/// preset runs): node names are unique; links join two different existing
/// nodes with a finite positive bandwidth and a finite non-negative
/// latency; `p2p_blocked` names pairs of devices.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// A short name (`dgx-h100`, `host`).
    pub name: String,
    /// Where it came from and what it models.
    pub description: String,
    /// The nodes; ranks map to the devices among them in this order.
    pub nodes: Vec<Node>,
    /// The directed links.
    pub links: Vec<PhysicalLink>,
    /// Device pairs that cannot reach each other's memory (peer-to-peer
    /// off); their traffic is staged through host memory.
    pub p2p_blocked: Vec<(NodeId, NodeId)>,
}

impl Topology {
    /// An empty topology.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Topology {
            name: name.into(),
            description: description.into(),
            nodes: Vec::new(),
            links: Vec::new(),
            p2p_blocked: Vec::new(),
        }
    }

    /// Add a node; returns its id.
    pub fn add_node(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Join `a` and `b` in both directions with the kind's nominal rate and
    /// latency (see [`LinkKind::nominal_bandwidth`]).
    ///
    /// # Panics
    /// If the kind has no nominal rate; use [`Topology::connect_with`].
    pub fn connect(&mut self, a: NodeId, b: NodeId, kind: LinkKind) {
        let bw = kind
            .nominal_bandwidth()
            .expect("this link kind has no nominal rate: use connect_with");
        let lat = kind.nominal_latency_us().unwrap_or(1.0);
        self.connect_with(a, b, kind, bw, lat);
    }

    /// Join `a` and `b` in both directions with an explicit rate and latency.
    pub fn connect_with(
        &mut self,
        a: NodeId,
        b: NodeId,
        kind: LinkKind,
        bandwidth: f64,
        latency_us: f64,
    ) {
        for (from, to) in [(a, b), (b, a)] {
            self.links.push(PhysicalLink {
                from,
                to,
                kind: kind.clone(),
                bandwidth,
                latency_us,
            });
        }
    }

    /// Mark the devices `a` and `b` as unable to do peer-to-peer.
    pub fn block_p2p(&mut self, a: NodeId, b: NodeId) {
        let pair = (a.min(b), a.max(b));
        if !self.p2p_blocked.contains(&pair) {
            self.p2p_blocked.push(pair);
        }
    }

    /// Whether `a` and `b` can access each other's memory directly.
    pub fn p2p(&self, a: NodeId, b: NodeId) -> bool {
        !self.p2p_blocked.contains(&(a.min(b), a.max(b)))
    }

    /// The devices, in rank order.
    pub fn devices(&self) -> Vec<NodeId> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].kind.is_device())
            .collect()
    }

    /// The node called `name`.
    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Links leaving `node`, in link order.
    pub fn links_from(&self, node: NodeId) -> impl Iterator<Item = (LinkId, &PhysicalLink)> + '_ {
        self.links
            .iter()
            .enumerate()
            .filter(move |(_, l)| l.from == node)
    }

    /// Check the invariants listed on [`Topology`].
    pub fn validate(&self) -> Result<(), TopologyError> {
        let invalid = |what: String| Err(TopologyError::Invalid(what));
        for (i, n) in self.nodes.iter().enumerate() {
            if n.name.is_empty() {
                return invalid(format!("node {i} has an empty name"));
            }
            if self.nodes[..i].iter().any(|m| m.name == n.name) {
                return invalid(format!("node name `{}` is used twice", n.name));
            }
            if let Some(bw) = n.memory_bandwidth
                && !(bw.is_finite() && bw > 0.0)
            {
                return invalid(format!("node `{}` has memory bandwidth {bw}", n.name));
            }
            if n.cores == Some(0) {
                return invalid(format!("node `{}` has zero cores", n.name));
            }
        }
        for (i, l) in self.links.iter().enumerate() {
            let n = self.nodes.len();
            if l.from >= n || l.to >= n {
                return invalid(format!("link {i} joins a node that does not exist"));
            }
            if l.from == l.to {
                return invalid(format!(
                    "link {i} joins `{}` to itself",
                    self.nodes[l.from].name
                ));
            }
            if !(l.bandwidth.is_finite() && l.bandwidth > 0.0) {
                return invalid(format!(
                    "link {} -> {} has bandwidth {}",
                    self.nodes[l.from].name, self.nodes[l.to].name, l.bandwidth
                ));
            }
            if !(l.latency_us.is_finite() && l.latency_us >= 0.0) {
                return invalid(format!(
                    "link {} -> {} has latency {}",
                    self.nodes[l.from].name, self.nodes[l.to].name, l.latency_us
                ));
            }
            if let LinkKind::Nvlink { count: 0, .. } | LinkKind::Pcie { width: 0, .. } = l.kind {
                return invalid(format!(
                    "link {} -> {} has zero lanes",
                    self.nodes[l.from].name, self.nodes[l.to].name
                ));
            }
        }
        for &(a, b) in &self.p2p_blocked {
            let ok = |x: NodeId| x < self.nodes.len() && self.nodes[x].kind.is_device();
            if !ok(a) || !ok(b) || a == b {
                return invalid("p2p_blocked names a pair that is not two devices".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
