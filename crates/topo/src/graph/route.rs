//! Routes between devices, and the `nvidia-smi topo -m` class of each path.
//!
//! A route is the widest path (largest bottleneck bandwidth; then fewest
//! hops; then least latency; then the first found in node and link order,
//! so every rank computes the same one) that forwards only through non-device nodes: GPUs do not
//! relay for each other. An all-NVLink path wins over any other, as it does
//! for CUDA peer copies. A pair without peer-to-peer access is staged
//! through the memory of a CPU node instead, as a CUDA copy between
//! devices without peer access is.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;

use super::{LinkId, LinkKind, NodeId, NodeKind, Topology};
use crate::error::TopologyError;

/// How data travels from one device to another.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// The links crossed, in order.
    pub links: Vec<LinkId>,
    /// The CPU node whose memory stages the data when peer access is off.
    pub staged_in: Option<NodeId>,
    /// The narrowest raw link rate on the way, GB/s.
    pub bandwidth: f64,
    /// Sum of the hops' latencies, µs.
    pub latency_us: f64,
}

/// The kind of path between two devices, as `nvidia-smi topo -m` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathClass {
    /// The device itself.
    Same,
    /// NVLink all the way; the narrowest hop bundles this many links.
    NvLink(u8),
    /// At most one PCIe switch, no host bridge.
    Pix,
    /// Several PCIe switches, no host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Across host bridges of one NUMA node.
    Node,
    /// Across NUMA nodes (UPI, QPI, xGMI).
    Sys,
    /// Threads sharing host memory.
    Shm,
    /// Across the network (another machine's device, through NICs).
    Net,
}

impl fmt::Display for PathClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathClass::Same => f.write_str("X"),
            PathClass::NvLink(n) => write!(f, "NV{n}"),
            PathClass::Pix => f.write_str("PIX"),
            PathClass::Pxb => f.write_str("PXB"),
            PathClass::Phb => f.write_str("PHB"),
            PathClass::Node => f.write_str("NODE"),
            PathClass::Sys => f.write_str("SYS"),
            PathClass::Shm => f.write_str("SHM"),
            PathClass::Net => f.write_str("NET"),
        }
    }
}

/// Quality of a partial path; larger is better.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score {
    bandwidth: f64,
    hops: usize,
    latency: f64,
}

impl Score {
    fn better_than(&self, other: &Score) -> bool {
        self.cmp(other) == Ordering::Greater
    }

    fn cmp(&self, other: &Score) -> Ordering {
        self.bandwidth
            .total_cmp(&other.bandwidth)
            .then(other.hops.cmp(&self.hops))
            .then(other.latency.total_cmp(&self.latency))
    }
}

/// A topology with the links leaving each node indexed once, so routing
/// every pair of n devices costs O(n² · E log V) rather than a scan of
/// every link per node visited.
pub(crate) struct Router<'t> {
    topo: &'t Topology,
    /// Links leaving each node, in link order.
    out: Vec<Vec<LinkId>>,
    /// Shortest-path trees already grown: the link each node is reached
    /// by, per (source, NVLink only, bandwidth floor).
    trees: HashMap<TreeKey, Vec<Option<LinkId>>>,
}

/// Which search a tree answers: source, NVLink only, and the bits of the
/// bandwidth floor (`None`: widest-first).
type TreeKey = (NodeId, bool, Option<u64>);

/// A node waiting in the Dijkstra queue: the best score first, ties by
/// lowest id (the order the linear scan it replaces picked in).
struct Queued {
    score: Score,
    node: NodeId,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Queued {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .cmp(&other.score)
            .then(other.node.cmp(&self.node))
    }
}

impl<'t> Router<'t> {
    /// Index `topo`'s links by the node they leave.
    pub(crate) fn new(topo: &'t Topology) -> Router<'t> {
        let mut out = vec![Vec::new(); topo.nodes.len()];
        for (id, l) in topo.links.iter().enumerate() {
            if let Some(list) = out.get_mut(l.from) {
                list.push(id);
            }
        }
        Router {
            topo,
            out,
            trees: HashMap::new(),
        }
    }

    /// The hardware path between two devices, ignoring peer-to-peer
    /// settings: all-NVLink when there is one (CUDA and NCCL send peer
    /// traffic over NVLink whenever the GPUs are NVLink-connected, even a
    /// single link slower than their PCIe), else the widest.
    pub(crate) fn best_path(&mut self, from: NodeId, to: NodeId) -> Option<Vec<LinkId>> {
        self.widest_path(from, to, true)
            .or_else(|| self.widest_path(from, to, false))
    }

    /// The widest path from `from` to `to` that forwards only through
    /// non-device nodes (over NVLink only, if asked); among the widest, the
    /// fewest hops, then the least latency. Two passes, because a single
    /// Dijkstra on (width, hops) is not exact: a node settled through a
    /// wide detour can hide a shorter path that is just as wide at the end.
    fn widest_path(&mut self, from: NodeId, to: NodeId, nvlink_only: bool) -> Option<Vec<LinkId>> {
        let first = self.search(from, to, nvlink_only, None)?;
        let width = first
            .iter()
            .map(|&l| self.topo.links[l].bandwidth)
            .fold(f64::INFINITY, f64::min);
        self.search(from, to, nvlink_only, Some(width))
    }

    /// One Dijkstra pass: widest-first when `min_bandwidth` is `None`,
    /// else fewest hops then least latency over links at least that wide.
    /// The tree from `from` is grown to every node once and kept: nodes
    /// settle in the same order whatever the target, so the path it gives
    /// to `to` is the one a search stopped at `to` finds.
    fn search(
        &mut self,
        from: NodeId,
        to: NodeId,
        nvlink_only: bool,
        min_bandwidth: Option<f64>,
    ) -> Option<Vec<LinkId>> {
        let key = (from, nvlink_only, min_bandwidth.map(f64::to_bits));
        if !self.trees.contains_key(&key) {
            let tree = self.grow(from, nvlink_only, min_bandwidth);
            self.trees.insert(key, tree);
        }
        let via = &self.trees[&key];
        let mut links = Vec::new();
        let mut at = to;
        while at != from {
            let id = via[at]?;
            links.push(id);
            at = self.topo.links[id].from;
        }
        links.reverse();
        Some(links)
    }

    /// The link each node is reached by from `from` (see [`Self::search`]).
    fn grow(
        &self,
        from: NodeId,
        nvlink_only: bool,
        min_bandwidth: Option<f64>,
    ) -> Vec<Option<LinkId>> {
        let n = self.topo.nodes.len();
        let mut best: Vec<Option<Score>> = vec![None; n];
        let mut via: Vec<Option<LinkId>> = vec![None; n];
        let mut done = vec![false; n];
        let start = Score {
            bandwidth: f64::INFINITY,
            hops: 0,
            latency: 0.0,
        };
        best[from] = Some(start);
        let mut queue = BinaryHeap::from([Queued {
            score: start,
            node: from,
        }]);
        // The unsettled node with the best score first; ties by lowest id.
        while let Some(Queued { score, node: u }) = queue.pop() {
            if done[u] || best[u].is_none_or(|b| b.cmp(&score) != Ordering::Equal) {
                continue;
            }
            done[u] = true;
            if u != from && self.topo.nodes[u].kind.is_device() {
                continue;
            }
            let su = best[u].unwrap();
            for &id in &self.out[u] {
                let link = &self.topo.links[id];
                if nvlink_only && !link.kind.is_nvlink() {
                    continue;
                }
                if min_bandwidth.is_some_and(|w| link.bandwidth < w) {
                    continue;
                }
                let s = Score {
                    bandwidth: match min_bandwidth {
                        Some(_) => f64::INFINITY,
                        None => su.bandwidth.min(link.bandwidth),
                    },
                    hops: su.hops + 1,
                    latency: su.latency + link.latency_us,
                };
                let v = link.to;
                if !done[v] && best[v].is_none_or(|b| s.better_than(&b)) {
                    best[v] = Some(s);
                    via[v] = Some(id);
                    queue.push(Queued { score: s, node: v });
                }
            }
        }
        via
    }

    fn route_of(&self, links: Vec<LinkId>, staged_in: Option<NodeId>) -> Route {
        Route {
            bandwidth: links
                .iter()
                .map(|&l| self.topo.links[l].bandwidth)
                .fold(f64::INFINITY, f64::min),
            latency_us: links.iter().map(|&l| self.topo.links[l].latency_us).sum(),
            links,
            staged_in,
        }
    }

    /// How device `from` reaches device `to`: directly when peer-to-peer is
    /// possible, else staged through the best-placed CPU node's memory.
    pub(crate) fn route(&mut self, from: NodeId, to: NodeId) -> Result<Route, TopologyError> {
        let unreachable = || TopologyError::Unreachable {
            from: self.topo.nodes[from].name.clone(),
            to: self.topo.nodes[to].name.clone(),
        };
        if from == to {
            return Ok(self.route_of(Vec::new(), None));
        }
        if self.topo.p2p(from, to)
            && let Some(links) = self.best_path(from, to)
        {
            return Ok(self.route_of(links, None));
        }
        let mut best: Option<Route> = None;
        for cpu in (0..self.topo.nodes.len()).filter(|&c| self.topo.nodes[c].kind == NodeKind::Cpu)
        {
            let (Some(mut up), Some(down)) = (
                self.widest_path(from, cpu, false),
                self.widest_path(cpu, to, false),
            ) else {
                continue;
            };
            up.extend(down);
            let r = self.route_of(up, Some(cpu));
            let better = best.as_ref().is_none_or(|b| {
                r.bandwidth > b.bandwidth
                    || (r.bandwidth == b.bandwidth && r.links.len() < b.links.len())
            });
            if better {
                best = Some(r);
            }
        }
        best.ok_or_else(unreachable)
    }

    /// The `nvidia-smi topo -m` class of the hardware path between two
    /// devices (peer-to-peer settings do not change it).
    pub(crate) fn path_class(&mut self, a: NodeId, b: NodeId) -> Result<PathClass, TopologyError> {
        if a == b {
            return Ok(PathClass::Same);
        }
        let topo = self.topo;
        let links = self
            .best_path(a, b)
            .ok_or_else(|| TopologyError::Unreachable {
                from: topo.nodes[a].name.clone(),
                to: topo.nodes[b].name.clone(),
            })?;
        let kinds: Vec<&LinkKind> = links.iter().map(|&l| &topo.links[l].kind).collect();
        if kinds.iter().all(|k| k.is_nvlink()) {
            let narrowest = kinds
                .iter()
                .filter_map(|k| match k {
                    LinkKind::Nvlink { count, .. } => Some(*count),
                    _ => None,
                })
                .min()
                .unwrap_or(0);
            return Ok(PathClass::NvLink(narrowest));
        }
        if kinds.iter().all(|k| matches!(k, LinkKind::SharedMemory)) {
            return Ok(PathClass::Shm);
        }
        if kinds.iter().any(|k| matches!(k, LinkKind::Network)) {
            return Ok(PathClass::Net);
        }
        if kinds.iter().any(|k| matches!(k, LinkKind::CpuInterconnect)) {
            return Ok(PathClass::Sys);
        }
        let passed = |kind: NodeKind| {
            links[..links.len() - 1]
                .iter()
                .filter(|&&l| topo.nodes[topo.links[l].to].kind == kind)
                .count()
        };
        let cpus = passed(NodeKind::Cpu);
        let bridges = passed(NodeKind::HostBridge);
        Ok(if cpus > 1 {
            PathClass::Sys
        } else if bridges > 1 {
            PathClass::Node
        } else if cpus + bridges > 0 {
            PathClass::Phb
        } else if passed(NodeKind::PcieSwitch) > 1 {
            PathClass::Pxb
        } else {
            PathClass::Pix
        })
    }
}

impl Topology {
    /// How device `from` reaches device `to`: directly when peer-to-peer is
    /// possible, else staged through the best-placed CPU node's memory.
    pub fn route(&self, from: NodeId, to: NodeId) -> Result<Route, TopologyError> {
        Router::new(self).route(from, to)
    }

    /// The `nvidia-smi topo -m` class of the hardware path between two
    /// devices (peer-to-peer settings do not change it).
    pub fn path_class(&self, a: NodeId, b: NodeId) -> Result<PathClass, TopologyError> {
        Router::new(self).path_class(a, b)
    }
}
