//! The half of discovery that needs no GPU: the link graph a snapshot
//! describes.

use super::*;

/// Build the link graph a snapshot describes.
///
/// - GPUs come first, named `GPU0`, `GPU1`, … in snapshot order, so rank
///   `r` is NVML's GPU `r`.
/// - PCIe: GPUs that share a socket (ancestor at most NODE) hang under one
///   `CPU` node; sockets are joined pairwise by a CPU interconnect (the
///   UPI figures of [`crate::presets`]). A socket whose GPUs sit under more
///   than one host bridge gets a `HostBridge` node per bridge. Within a
///   bridge, GPUs at PIX share a `PLX` switch, and groups at PXB hang their
///   switches under a common parent switch. A GPU alone at its level
///   connects straight to the bridge or CPU. The GPU's own link has its
///   reported generation and width; switch and bridge uplinks the highest
///   generation below them at x16.
/// - NVLink: links whose far end is another GPU of the snapshot are
///   bundled per pair; links to anything that is not a GPU (NVSwitch
///   chips) are bundled per GPU to one `NVSwitch` node, as the presets
///   model the fabric; links to a GPU outside the snapshot (hidden from
///   this process) are left out, since no rank can use them.
/// - Peer-to-peer is blocked for each pair where either direction's read
///   status is not OK.
///
/// # Errors
/// [`TopologyError::Invalid`] when the snapshot is malformed: matrices not
/// `n × n`, duplicate bus ids, or PCIe or NVLink numbers out of range.
pub fn build_topology(snapshot: &NvmlSnapshot) -> Result<Topology, TopologyError> {
    check_snapshot(snapshot)?;
    let gpus = &snapshot.gpus;
    let mut t = Topology::new("nvml", describe(snapshot));

    let gpu_ids: Vec<NodeId> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut node = Node::new(format!("GPU{i}"), NodeKind::Gpu)
                .pci_bus_id(normalize_bus_id(&g.pci_bus_id));
            if let Some(numa) = g.numa {
                node = node.numa(numa);
            }
            if let Some(bw) = memory_bandwidth_gbps(g) {
                node = node.memory_bandwidth(bw);
            }
            t.add_node(node)
        })
        .collect();

    build_pcie(&mut t, snapshot, &gpu_ids);
    build_nvlink(&mut t, snapshot, &gpu_ids);

    for i in 0..gpus.len() {
        for j in i + 1..gpus.len() {
            if !(snapshot.p2p_read_ok[i][j] && snapshot.p2p_read_ok[j][i]) {
                t.block_p2p(gpu_ids[i], gpu_ids[j]);
            }
        }
    }
    t.validate()?;
    Ok(t)
}

/// Reject what would make the graph wrong or make [`Topology::connect`]
/// panic (a generation without a nominal rate).
fn check_snapshot(s: &NvmlSnapshot) -> Result<(), TopologyError> {
    let bad = |what: String| Err(TopologyError::Invalid(format!("NVML snapshot: {what}")));
    let n = s.gpus.len();
    if n == 0 {
        return bad("no GPU".into());
    }
    for (name, rows) in [
        ("ancestors", s.ancestors.len()),
        ("p2p_read_ok", s.p2p_read_ok.len()),
    ] {
        if rows != n {
            return bad(format!("{name} has {rows} rows for {n} GPUs"));
        }
    }
    if s.ancestors.iter().any(|r| r.len() != n) || s.p2p_read_ok.iter().any(|r| r.len() != n) {
        return bad(format!("a matrix row is not {n} long"));
    }
    let mut seen = HashMap::new();
    for (i, g) in s.gpus.iter().enumerate() {
        let id = normalize_bus_id(&g.pci_bus_id);
        if id.is_empty() {
            return bad(format!("GPU {i} has no PCI bus id"));
        }
        if let Some(j) = seen.insert(id, i) {
            return bad(format!(
                "GPUs {j} and {i} share the PCI bus id {}",
                g.pci_bus_id
            ));
        }
        if let Some(gen_) = g.pcie_generation
            && !(1..=6).contains(&gen_)
        {
            return bad(format!("GPU {i} has PCIe generation {gen_}"));
        }
        if let Some(w) = g.pcie_width
            && !(1..=16).contains(&w)
        {
            return bad(format!("GPU {i} has PCIe width x{w}"));
        }
        if let Some(l) = g.nvlinks.iter().find(|l| !(1..=5).contains(&l.generation)) {
            return bad(format!(
                "NVLink {} of GPU {i} has generation {}",
                l.link, l.generation
            ));
        }
        if g.nvlinks.len() > usize::from(u8::MAX) {
            return bad(format!("GPU {i} lists {} NVLinks", g.nvlinks.len()));
        }
    }
    Ok(())
}

/// "8 x NVIDIA H100 80GB HBM3" and the driver, for the description.
fn describe(s: &NvmlSnapshot) -> String {
    let mut runs: Vec<(usize, &str)> = Vec::new();
    for g in &s.gpus {
        match runs.last_mut() {
            Some((count, name)) if *name == g.name => *count += 1,
            _ => runs.push((1, &g.name)),
        }
    }
    let gpus = runs
        .iter()
        .map(|(count, name)| format!("{count} x {name}"))
        .collect::<Vec<_>>()
        .join(", ");
    match &s.driver_version {
        Some(v) => format!("discovered through NVML (driver {v}): {gpus}"),
        None => format!("discovered through NVML: {gpus}"),
    }
}

/// Peak memory bandwidth in GB/s from bus width and memory clock. NVML's
/// memory clock is half the data rate for HBM and GDDR alike (H100 SXM:
/// 2619 MHz × 2 × 5120 bit / 8 = 3.35 TB/s, its datasheet figure; RTX 4090:
/// 10501 MHz × 2 × 384 bit / 8 = 1008 GB/s, likewise).
fn memory_bandwidth_gbps(g: &GpuFacts) -> Option<f64> {
    let bits = f64::from(g.memory_bus_width_bits.filter(|&b| b > 0)?);
    let mhz = f64::from(g.max_memory_clock_mhz.filter(|&c| c > 0)?);
    Some(mhz * 1e6 * 2.0 * bits / 8.0 / 1e9)
}

/// The relation NVML reports for a pair, taking the farther of the two
/// directions in case a driver answers asymmetrically.
fn ancestor(s: &NvmlSnapshot, a: usize, b: usize) -> CommonAncestor {
    s.ancestors[a][b].max(s.ancestors[b][a])
}

/// Split `members` into groups closed under "`joined` holds for some pair
/// within the group" (union-find). Groups come out ordered by their lowest
/// member, members ascending, so the graph is the same every time.
fn groups(members: &[usize], joined: impl Fn(usize, usize) -> bool) -> Vec<Vec<usize>> {
    let mut parent: Vec<usize> = (0..members.len()).collect();
    fn root(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    for a in 0..members.len() {
        for b in a + 1..members.len() {
            if joined(members[a], members[b]) {
                let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
                parent[ra.max(rb)] = ra.min(rb);
            }
        }
    }
    let mut by_root: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (a, &member) in members.iter().enumerate() {
        let r = root(&mut parent, a);
        by_root.entry(r).or_default().push(member);
    }
    let mut out: Vec<Vec<usize>> = by_root.into_values().collect();
    for g in &mut out {
        g.sort_unstable();
    }
    out.sort_by_key(|g| g[0]);
    out
}

/// The PCIe link GPU `g` reports, or the fallback.
fn gpu_pcie(s: &NvmlSnapshot, g: usize) -> LinkKind {
    let facts = &s.gpus[g];
    LinkKind::Pcie {
        generation: facts.pcie_generation.unwrap_or(FALLBACK_PCIE.0),
        width: facts.pcie_width.unwrap_or(FALLBACK_PCIE.1),
    }
}

/// The uplink of a switch or bridge above `gpus`: their highest generation
/// at x16. NVML does not describe links between switches, and x16 is what
/// GPU servers build them with.
fn uplink(s: &NvmlSnapshot, gpus: &[usize]) -> LinkKind {
    let generation = gpus
        .iter()
        .map(|&g| s.gpus[g].pcie_generation.unwrap_or(FALLBACK_PCIE.0))
        .max()
        .unwrap_or(FALLBACK_PCIE.0);
    LinkKind::Pcie {
        generation,
        width: 16,
    }
}

/// Lay out sockets, host bridges and switches as the ancestors say.
fn build_pcie(t: &mut Topology, s: &NvmlSnapshot, gpu_ids: &[NodeId]) {
    let level = |a: usize, b: usize| ancestor(s, a, b);
    let all: Vec<usize> = (0..s.gpus.len()).collect();
    let mut switches = 0usize;
    let mut bridges = 0usize;
    let mut cpus = Vec::new();
    let mut add_switch = |t: &mut Topology, numa: Option<u32>| {
        let mut node = Node::new(format!("PLX{switches}"), NodeKind::PcieSwitch);
        if let Some(numa) = numa {
            node = node.numa(numa);
        }
        switches += 1;
        t.add_node(node)
    };

    for (c, socket) in groups(&all, |a, b| level(a, b) <= CommonAncestor::Node)
        .iter()
        .enumerate()
    {
        let numa = socket.iter().find_map(|&g| s.gpus[g].numa);
        let mut cpu_node = Node::new(format!("CPU{c}"), NodeKind::Cpu);
        if let Some(numa) = numa {
            cpu_node = cpu_node.numa(numa);
        }
        let cpu = t.add_node(cpu_node);
        cpus.push(cpu);

        let bridge_groups = groups(socket, |a, b| level(a, b) <= CommonAncestor::HostBridge);
        for bridge in &bridge_groups {
            // A lone bridge is the CPU as far as path classes go; a node
            // for it would only add a hop.
            let root = if bridge_groups.len() > 1 {
                let mut node = Node::new(format!("HostBridge{bridges}"), NodeKind::HostBridge);
                if let Some(numa) = numa {
                    node = node.numa(numa);
                }
                bridges += 1;
                let hb = t.add_node(node);
                t.connect(hb, cpu, uplink(s, bridge));
                hb
            } else {
                cpu
            };
            for tree in groups(bridge, |a, b| level(a, b) <= CommonAncestor::Multiple) {
                let leaves = groups(&tree, |a, b| level(a, b) <= CommonAncestor::Single);
                // Several leaf groups under one tree: they meet in a parent
                // switch, and every leaf, even a lone GPU, gets a switch of
                // its own so that two of them are PXB apart, not PIX.
                let parent = if leaves.len() > 1 {
                    let p = add_switch(t, numa);
                    t.connect(p, root, uplink(s, &tree));
                    p
                } else {
                    root
                };
                for leaf in &leaves {
                    if leaf.len() == 1 && leaves.len() == 1 {
                        t.connect(gpu_ids[leaf[0]], root, gpu_pcie(s, leaf[0]));
                        continue;
                    }
                    let sw = add_switch(t, numa);
                    t.connect(sw, parent, uplink(s, leaf));
                    for &g in leaf {
                        t.connect(gpu_ids[g], sw, gpu_pcie(s, g));
                    }
                }
            }
        }
    }

    // Two- and four-socket servers join every socket to every other.
    for (i, &a) in cpus.iter().enumerate() {
        for &b in &cpus[i + 1..] {
            t.connect_with(a, b, LinkKind::CpuInterconnect, UPI_GBPS, UPI_LATENCY_US);
        }
    }
}

/// Bundle NVLinks per GPU pair and per GPU to the NVSwitch fabric.
fn build_nvlink(t: &mut Topology, s: &NvmlSnapshot, gpu_ids: &[NodeId]) {
    let n = s.gpus.len();
    let by_bus: HashMap<String, usize> = s
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| (normalize_bus_id(&g.pci_bus_id), i))
        .collect();
    // links[i][j]: links GPU i sees ending at GPU j, with their lowest
    // generation; to_switch[i] likewise for the fabric.
    let mut links = vec![vec![(0u8, u8::MAX); n]; n];
    let mut to_switch = vec![(0u8, u8::MAX); n];
    let add = |slot: &mut (u8, u8), generation: u8| {
        slot.0 += 1;
        slot.1 = slot.1.min(generation);
    };
    for (i, g) in s.gpus.iter().enumerate() {
        for l in &g.nvlinks {
            let peer = l
                .remote_pci_bus_id
                .as_deref()
                .and_then(|id| by_bus.get(&normalize_bus_id(id)).copied());
            match peer {
                Some(j) if j == i => warn!(
                    "NVML snapshot: NVLink {} of GPU {i} loops back to itself; left out",
                    l.link
                ),
                Some(j) => add(&mut links[i][j], l.generation),
                None if l.remote_pci_class.is_some_and(is_display_class) => warn!(
                    "NVML snapshot: NVLink {} of GPU {i} ends at a GPU this process cannot see; left out",
                    l.link
                ),
                None => add(&mut to_switch[i], l.generation),
            }
        }
    }
    for i in 0..n {
        for j in i + 1..n {
            // Both ends should report the same bundle; if one end could not
            // name its far side, the other end's count still stands.
            let (a, b) = (links[i][j], links[j][i]);
            let count = a.0.max(b.0);
            if count > 0 {
                let generation = a.1.min(b.1);
                t.connect(
                    gpu_ids[i],
                    gpu_ids[j],
                    LinkKind::Nvlink { generation, count },
                );
            }
        }
    }
    if to_switch.iter().any(|&(count, _)| count > 0) {
        let fabric = t.add_node(Node::new("NVSwitch", NodeKind::NvSwitch));
        for (i, &(count, generation)) in to_switch.iter().enumerate() {
            if count > 0 {
                t.connect(gpu_ids[i], fabric, LinkKind::Nvlink { generation, count });
            }
        }
    }
}

/// Whether a PCI class code is a display controller (base class 0x03),
/// which is what every NVIDIA GPU enumerates as.
fn is_display_class(class: u32) -> bool {
    class >> 16 == 0x03
}
