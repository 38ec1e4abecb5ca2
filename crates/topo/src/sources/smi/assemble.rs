//! Building the smallest link graph — CPUs, host bridges, PCIe switches,
//! NVLinks, an NVSwitch — that reproduces every cell of a parsed matrix.

use super::matrix::{Cell, Matrix, is_gpu_name, smi_error};
use super::{SmiOptions, join_cpus};
use crate::error::TopologyError;
use crate::graph::{LinkKind, Node, NodeId, NodeKind, Router, Topology};

/// Merge groups while some pair satisfies `join`, first pairs first.
fn merge_while(groups: &mut Vec<Vec<usize>>, join: impl Fn(&[usize], &[usize]) -> bool) {
    'again: loop {
        for p in 0..groups.len() {
            for q in p + 1..groups.len() {
                if join(groups[p].as_slice(), groups[q].as_slice()) {
                    let moved = groups.remove(q);
                    groups[p].extend(moved);
                    continue 'again;
                }
            }
        }
        return;
    }
}

/// Split `members` into the subtrees below one level of the PCIe tree:
/// the devices whose cells are at most `threshold` apart (and the devices
/// those join, since a subtree is closed under that), then groups that a
/// hint puts together and nothing keeps apart, then — with `merge_free` —
/// any groups nothing keeps apart. NVLink cells say nothing about PCIe,
/// so devices seen only through them are placed by hints, or freely.
fn partition(
    m: &Matrix,
    members: &[usize],
    threshold: u8,
    hints: Option<&[Option<String>]>,
    merge_free: bool,
) -> Result<Vec<Vec<usize>>, TopologyError> {
    let mut groups: Vec<Vec<usize>> = members.iter().map(|&i| vec![i]).collect();
    merge_while(&mut groups, |a, b| {
        a.iter().any(|&x| {
            b.iter()
                .any(|&y| m.level(x, y).is_some_and(|l| l <= threshold))
        })
    });
    for g in &groups {
        for (k, &x) in g.iter().enumerate() {
            for &y in &g[k + 1..] {
                if m.level(x, y).is_some_and(|l| l > threshold) {
                    let place = match threshold {
                        0 => "on one PCIe switch",
                        1 => "under one tree of PCIe switches",
                        2 => "under one host bridge",
                        _ => "under one CPU",
                    };
                    let (a, b) = (x.min(y), x.max(y));
                    return Err(smi_error(
                        m.rows[a].line.max(m.rows[b].line),
                        format!(
                            "no PCIe tree fits this matrix: `{}` to `{}` is {}, yet their cells \
                             with other devices put both {place}",
                            m.names[a],
                            m.names[b],
                            m.rows[a].cells[b].class()
                        ),
                    ));
                }
            }
        }
    }
    if let Some(hints) = hints {
        merge_while(&mut groups, |a, b| {
            let shared = a
                .iter()
                .any(|&x| hints[x].is_some() && b.iter().any(|&y| hints[y] == hints[x]));
            shared && !m.apart(a, b, threshold)
        });
    }
    if merge_free {
        merge_while(&mut groups, |a, b| !m.apart(a, b, threshold));
    }
    for g in &mut groups {
        g.sort_unstable();
    }
    groups.sort_unstable_by_key(|g| g[0]);
    Ok(groups)
}

/// Links per GPU of each NVLink generation: P100 4, V100 6, A100 12,
/// H100 and Blackwell 18 (the NVIDIA architecture whitepapers).
fn links_per_gpu(generation: u8) -> u32 {
    match generation {
        1 => 4,
        2 => 6,
        3 => 12,
        _ => 18,
    }
}

/// Adds nodes with unique names from a running count.
struct Namer {
    switches: usize,
    bridges: usize,
}

pub(super) fn build(m: &Matrix, options: &SmiOptions) -> Result<Topology, TopologyError> {
    let n = m.names.len();
    let gpus: Vec<usize> = (0..n).filter(|&i| is_gpu_name(&m.names[i])).collect();
    let nics: Vec<usize> = (0..n).filter(|&i| !is_gpu_name(&m.names[i])).collect();
    if gpus.is_empty() {
        return Err(smi_error(m.header_line, "the matrix names no GPU"));
    }
    let pcie = LinkKind::Pcie {
        generation: options.pcie_generation,
        width: 16,
    };
    // CPUs: the matrix keeps SYS pairs apart and joins the rest; affinity
    // places the devices the matrix only relates by NVLink.
    let hints: Vec<Option<String>> = m
        .rows
        .iter()
        .map(|r| {
            r.numa
                .map(|x| format!("numa {x}"))
                .or_else(|| r.cpu_affinity.as_ref().map(|c| format!("cpus {c}")))
        })
        .collect();
    let all: Vec<usize> = (0..n).collect();
    let cpu_groups = partition(m, &all, 3, Some(&hints), true)?;
    let numas = numa_nodes(m, &cpu_groups);
    let mut order: Vec<usize> = (0..cpu_groups.len()).collect();
    order.sort_unstable_by_key(|&g| numas[g]);
    let mut numa_of = vec![0u32; n];
    for (g, members) in cpu_groups.iter().enumerate() {
        for &d in members {
            numa_of[d] = m.rows[d].numa.unwrap_or(numas[g]);
        }
    }
    let mut t = Topology::new(
        format!("nvidia-smi-{}gpu", gpus.len()),
        description(m, options, gpus.len(), nics.len(), cpu_groups.len()),
    );
    let mut node_of = vec![0; n];
    for &d in gpus.iter().chain(&nics) {
        let kind = if is_gpu_name(&m.names[d]) {
            NodeKind::Gpu
        } else {
            NodeKind::Nic
        };
        node_of[d] = t.add_node(Node::new(m.names[d].clone(), kind).numa(numa_of[d]));
    }
    let mut cpu_node = vec![0; cpu_groups.len()];
    for &g in &order {
        cpu_node[g] =
            t.add_node(Node::new(format!("CPU{}", numas[g]), NodeKind::Cpu).numa(numas[g]));
    }
    let cpu_nodes: Vec<NodeId> = order.iter().map(|&g| cpu_node[g]).collect();
    join_cpus(&mut t, &cpu_nodes);
    let mut namer = Namer {
        switches: 0,
        bridges: 0,
    };
    for &g in &order {
        let below = Below {
            m,
            node_of: &node_of,
            pcie: &pcie,
            numa: numas[g],
        };
        below.add_bridges(&mut t, &mut namer, &cpu_groups[g], cpu_node[g])?;
    }
    add_nvlinks(m, &mut t, &gpus, &node_of, options.nvlink_generation);
    check_classes(m, &t, &node_of)?;
    t.validate()?;
    Ok(t)
}

/// The NUMA node of each CPU group: the one its devices name, else the
/// lowest not taken.
fn numa_nodes(m: &Matrix, cpu_groups: &[Vec<usize>]) -> Vec<u32> {
    let mut group_numa: Vec<Option<u32>> = Vec::with_capacity(cpu_groups.len());
    for g in cpu_groups {
        let mut numa = None;
        for &d in g {
            if let Some(x) = m.rows[d].numa {
                match numa {
                    None => numa = Some(x),
                    Some(y) if y != x => tracing::debug!(
                        device = m.names[d].as_str(),
                        "nvidia-smi topo -m: devices of one CPU name NUMA nodes {y} and {x}; using {y}"
                    ),
                    _ => {}
                }
            }
        }
        if numa.is_some_and(|x| group_numa.contains(&Some(x))) {
            tracing::debug!("nvidia-smi topo -m: two CPUs claim NUMA node {numa:?}; renumbering");
            numa = None;
        }
        group_numa.push(numa);
    }
    let mut numas: Vec<u32> = Vec::with_capacity(cpu_groups.len());
    for known in &group_numa {
        let numa = match *known {
            Some(x) => x,
            None => (0..)
                .find(|x| !group_numa.contains(&Some(*x)) && !numas.contains(x))
                .unwrap_or(0),
        };
        numas.push(numa);
    }
    numas
}

fn description(m: &Matrix, options: &SmiOptions, gpus: usize, nics: usize, cpus: usize) -> String {
    let legend = if m.nic_legend.is_empty() {
        String::new()
    } else {
        let pairs: Vec<String> = m
            .nic_legend
            .iter()
            .map(|(c, d)| format!("{c} = {d}"))
            .collect();
        format!(" ({})", pairs.join(", "))
    };
    format!(
        "from `nvidia-smi topo -m`: {gpus} GPUs, {nics} NICs{legend}, {cpus} CPUs; NVLink {} and \
         PCIe {}.0 x16 assumed",
        options.nvlink_generation, options.pcie_generation
    )
}

/// What hanging one CPU's devices needs.
struct Below<'a> {
    m: &'a Matrix,
    node_of: &'a [NodeId],
    pcie: &'a LinkKind,
    numa: u32,
}

impl Below<'_> {
    /// A CPU's devices under host bridges where the matrix keeps groups
    /// `NODE` apart (under the CPU itself when there is one group).
    fn add_bridges(
        &self,
        t: &mut Topology,
        namer: &mut Namer,
        members: &[usize],
        cpu: NodeId,
    ) -> Result<(), TopologyError> {
        let bridge_groups = partition(self.m, members, 2, None, true)?;
        for group in &bridge_groups {
            let parent = if bridge_groups.len() > 1 {
                let hb = t.add_node(
                    Node::new(format!("HB{}", namer.bridges), NodeKind::HostBridge).numa(self.numa),
                );
                namer.bridges += 1;
                t.connect(hb, cpu, self.pcie.clone());
                hb
            } else {
                cpu
            };
            add_switches(
                self.m,
                t,
                namer,
                group,
                parent,
                self.numa,
                self.node_of,
                self.pcie,
            )?;
        }
        Ok(())
    }
}

/// The graph gives every pair the class the matrix printed.
fn check_classes(m: &Matrix, t: &Topology, node_of: &[NodeId]) -> Result<(), TopologyError> {
    let n = m.names.len();
    let mut router = Router::new(t);
    for i in 0..n {
        for j in i + 1..n {
            let cell = m.rows[i].cells[j];
            let got = router.path_class(node_of[i], node_of[j])?;
            if got == cell.class() {
                continue;
            }
            return Err(smi_error(
                m.rows[i].line.max(m.rows[j].line),
                format!(
                    "cannot model `{}` to `{}` as {}: the graph built from the matrix gives {got}",
                    m.names[i],
                    m.names[j],
                    cell.class()
                ),
            ));
        }
    }
    Ok(())
}

/// Hang the devices of one host bridge (or CPU) below `parent`: a device
/// alone goes straight to it; devices `PXB` or `PIX` to each other share
/// a switch, and where some of them are `PXB` apart, each `PIX` group
/// gets a switch of its own below that one, so a path between groups
/// crosses several switches and a path inside one crosses one.
#[allow(clippy::too_many_arguments)]
fn add_switches(
    m: &Matrix,
    t: &mut Topology,
    namer: &mut Namer,
    members: &[usize],
    parent: NodeId,
    numa: u32,
    node_of: &[NodeId],
    pcie: &LinkKind,
) -> Result<(), TopologyError> {
    let mut new_switch = |t: &mut Topology, up: NodeId| {
        let sw = t
            .add_node(Node::new(format!("PLX{}", namer.switches), NodeKind::PcieSwitch).numa(numa));
        namer.switches += 1;
        t.connect(sw, up, pcie.clone());
        sw
    };
    for tree in partition(m, members, 1, None, false)? {
        if let [alone] = tree.as_slice() {
            t.connect(node_of[*alone], parent, pcie.clone());
            continue;
        }
        let top = new_switch(t, parent);
        let leaves = partition(m, &tree, 0, None, false)?;
        if leaves.len() == 1 {
            for &d in &tree {
                t.connect(node_of[d], top, pcie.clone());
            }
            continue;
        }
        for leaf in leaves {
            let sw = new_switch(t, top);
            for d in leaf {
                t.connect(node_of[d], sw, pcie.clone());
            }
        }
    }
    Ok(())
}

/// NVLink bundles: one NVSwitch when every GPU pair shows the same `NV#`
/// and a direct mesh of such bundles would need more links per GPU than
/// the generation has (8 A100s at NV12, 8 H100s at NV18); a direct link
/// per `NV#` pair otherwise (DGX-1, NVLink bridges, the 4-GPU HGX A100's
/// real mesh of NV4).
fn add_nvlinks(m: &Matrix, t: &mut Topology, gpus: &[usize], node_of: &[NodeId], generation: u8) {
    let mut pairs = Vec::new();
    for (k, &a) in gpus.iter().enumerate() {
        for &b in &gpus[k + 1..] {
            if let Cell::Nv(count) = m.rows[a].cells[b] {
                pairs.push((a, b, count));
            }
        }
    }
    let every_pair = gpus.len() * (gpus.len() - 1) / 2;
    let uniform =
        pairs.len() == every_pair && pairs.windows(2).all(|w| w[0].2 == w[1].2) && gpus.len() >= 3;
    if let (true, Some(&(_, _, count))) = (uniform, pairs.first()) {
        let needed = u32::from(count) * (gpus.len() as u32 - 1);
        if needed > links_per_gpu(generation) {
            let fabric = t.add_node(Node::new("NVSwitch", NodeKind::NvSwitch));
            for &g in gpus {
                t.connect(node_of[g], fabric, LinkKind::Nvlink { generation, count });
            }
            return;
        }
    }
    for (a, b, count) in pairs {
        t.connect(
            node_of[a],
            node_of[b],
            LinkKind::Nvlink { generation, count },
        );
    }
}
