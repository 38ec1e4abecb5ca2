//! A topology from NCCL's topology dump (the file `NCCL_TOPO_DUMP_FILE`
//! names, the format `NCCL_TOPO_FILE` reads).
//!
//! The dump is a small XML tree: `<system>` holds one `<cpu>` per NUMA
//! node; below a CPU, nested `<pci>` elements follow the PCIe hierarchy
//! (bridges and switches, class `0x060400`) down to GPUs (class `0x03….`,
//! with a `<gpu>` child listing its `<nvlink>`s) and NICs (class `0x02….`,
//! with a `<nic>` child listing its `<net>` ports). [`parse_nccl_xml`]
//! turns CPUs, bridges, GPUs and NIC ports into nodes, the nesting into
//! PCIe links at each element's `link_speed` and `link_width`, and the
//! NVLinks into direct GPU links, links to one NVSwitch fabric node, or
//! links to the local CPU, the way NCCL itself reads them.
//!
//! The XML is read by a small tokenizer made for what NCCL writes:
//! elements with attributes, self-closing tags, comments, an optional
//! `<?xml …?>` declaration, quotes of either kind and the five predefined
//! entities (plus numeric ones). Tolerated: unknown elements (`c2c`,
//! `pcilink` and whatever newer NCCL adds) and unknown attributes, which
//! are skipped with a debug log; a missing or unreadable `link_speed`
//! (PCIe 3.0, as NCCL assumes) or `link_width` (x16); text between
//! elements. Refused, as [`TopologyError::NcclXml`] with the line and the
//! element: malformed XML (unclosed or mismatched tags, bad attribute
//! syntax, unknown entities, a second root), a root that is not
//! `<system>`, and GPUs or NIC ports that cannot be told apart.

use std::collections::BTreeMap;

use ferrocoll_core::XmlError;
use ferrocoll_core::xml::{Element, parse_document};

use super::smi::join_cpus;
use crate::error::TopologyError;
use crate::graph::{LinkKind, Node, NodeId, NodeKind, Topology};

/// Parse an NCCL topology dump into a [`Topology`].
///
/// GPUs are named `GPU{dev}` and come first, in `dev` order, so rank `r`
/// runs on CUDA device `r`; they carry their PCI bus id. CPUs are named
/// `CPU{numaid}`, NIC ports by their `net` name, PCIe bridges `PLX0`,
/// `PLX1`, … in document order (with their bus id). The NVLink generation
/// of a GPU follows its `sm`: 6x → 1, 7x → 2, 8x → 3, 9x → 4, 10x and
/// later → 5; a link between two GPUs takes the older one's.
pub fn parse_nccl_xml(text: &str) -> Result<Topology, TopologyError> {
    let root = parse_document(text).map_err(from_xml)?;
    let plan = Plan::from_system(&root)?;
    plan.build()
}

fn from_xml(e: XmlError) -> TopologyError {
    xml_error(e.line, &e.element, e.message)
}

fn xml_error(line: usize, element: &str, message: impl Into<String>) -> TopologyError {
    TopologyError::NcclXml {
        line,
        element: element.to_string(),
        message: message.into(),
    }
}

/// The PCIe generation of a `link_speed` as Linux prints it: `8 GT/s`
/// (kernels up to 5.6) or `8.0 GT/s PCIe` (later).
fn pcie_generation(speed: &str) -> Option<u8> {
    let mut words = speed.split_whitespace();
    let rate: f64 = words.next()?.parse().ok()?;
    if words.next() != Some("GT/s") {
        return None;
    }
    [
        (2.5, 1),
        (5.0, 2),
        (8.0, 3),
        (16.0, 4),
        (32.0, 5),
        (64.0, 6),
    ]
    .iter()
    .find(|(r, _)| (rate - r).abs() < 0.01)
    .map(|&(_, g)| g)
}

/// The PCIe link between an element and its parent. Speeds and widths
/// that are missing or unreadable (`Unknown`, `0`, as sysfs reports for
/// some slots) fall back to what NCCL assumes: PCIe 3.0, x16.
fn pcie_link(el: &Element) -> LinkKind {
    let speed = el.attr("link_speed");
    let generation = speed.and_then(pcie_generation).unwrap_or_else(|| {
        tracing::debug!(
            line = el.line,
            speed,
            "NCCL XML: PCIe link speed missing or unknown; assuming PCIe 3.0 like NCCL"
        );
        3
    });
    let width_attr = el.attr("link_width");
    let width = width_attr
        .and_then(|w| w.trim().parse::<u8>().ok())
        .filter(|w| (1..=16).contains(w))
        .unwrap_or_else(|| {
            tracing::debug!(
                line = el.line,
                width = width_attr,
                "NCCL XML: PCIe link width missing or unusable; assuming x16 like NCCL"
            );
            16
        });
    LinkKind::Pcie { generation, width }
}

/// NVLink generation from the compute capability NCCL stores as `sm`.
fn nvlink_generation(sm: u32) -> u8 {
    match sm {
        0..=69 => 1,
        70..=79 => 2,
        80..=89 => 3,
        90..=99 => 4,
        _ => 5,
    }
}

/// A PCI bus id as a number, read the way NCCL reads it (hex digits, `:`
/// and `.` skipped), so `0000:07:00.0` and NVML's `00000000:07:00.0`
/// agree.
fn bus_id_key(id: &str) -> Option<u64> {
    let mut key: u64 = 0;
    let mut digits = 0;
    for c in id.trim().chars() {
        if c == ':' || c == '.' {
            continue;
        }
        let d = c.to_digit(16)?;
        key = key.checked_mul(16)?.checked_add(u64::from(d))?;
        digits += 1;
    }
    (digits > 0).then_some(key)
}

/// Where a device or bridge hangs.
#[derive(Debug, Clone, Copy)]
enum Parent {
    Cpu(usize),
    Switch(usize),
}

#[derive(Debug)]
struct CpuPlan {
    numa: u32,
}

#[derive(Debug)]
struct SwitchPlan {
    bus_id: Option<String>,
    parent: Parent,
    link: LinkKind,
    cpu: usize,
}

#[derive(Debug)]
struct NvlinkPlan {
    target: Option<String>,
    class: String,
    count: u32,
    line: usize,
}

#[derive(Debug)]
struct GpuPlan {
    dev: u32,
    bus_id: Option<String>,
    generation: u8,
    parent: Parent,
    link: LinkKind,
    cpu: usize,
    nvlinks: Vec<NvlinkPlan>,
    line: usize,
}

#[derive(Debug)]
struct NicPlan {
    name: String,
    parent: Parent,
    link: LinkKind,
    cpu: usize,
}

/// What the tree describes, gathered before any node is made, so GPUs can
/// be added first and in `dev` order wherever the dump lists them.
#[derive(Debug, Default)]
struct Plan {
    cpus: Vec<CpuPlan>,
    switches: Vec<SwitchPlan>,
    gpus: Vec<GpuPlan>,
    nics: Vec<NicPlan>,
}

fn ignored(el: &Element, inside: &str) {
    tracing::debug!(
        line = el.line,
        element = el.name.as_str(),
        inside,
        "NCCL XML: element not modelled; ignored"
    );
}

impl Plan {
    fn from_system(root: &Element) -> Result<Plan, TopologyError> {
        if root.name != "system" {
            return Err(xml_error(
                root.line,
                &root.name,
                "the root element must be `<system>`",
            ));
        }
        let mut plan = Plan::default();
        for child in &root.children {
            if child.name == "cpu" {
                plan.cpu(child)?;
            } else {
                ignored(child, "system");
            }
        }
        Ok(plan)
    }

    fn cpu(&mut self, el: &Element) -> Result<(), TopologyError> {
        let index = self.cpus.len();
        let numa = match el.attr("numaid").map(|v| v.trim().parse::<u32>()) {
            Some(Ok(numa)) => numa,
            _ => {
                let free = (0..)
                    .find(|n| !self.cpus.iter().any(|c| c.numa == *n))
                    .unwrap_or(0);
                tracing::debug!(
                    line = el.line,
                    numaid = el.attr("numaid"),
                    "NCCL XML: cpu without a usable numaid; numbering it {free}"
                );
                free
            }
        };
        self.cpus.push(CpuPlan { numa });
        for child in &el.children {
            match child.name.as_str() {
                "pci" => self.pci(child, Parent::Cpu(index), index)?,
                // NCCL puts a NIC it cannot place on PCIe (a socket
                // interface, say) straight under its CPU.
                "nic" => {
                    let link = LinkKind::Pcie {
                        generation: 3,
                        width: 16,
                    };
                    tracing::debug!(
                        line = child.line,
                        "NCCL XML: nic without a pci parent; joined to its CPU by PCIe 3.0 x16"
                    );
                    self.nic(child, Parent::Cpu(index), &link, index)?;
                }
                _ => ignored(child, "cpu"),
            }
        }
        Ok(())
    }

    fn pci(&mut self, el: &Element, parent: Parent, cpu: usize) -> Result<(), TopologyError> {
        let class = el.attr("class").unwrap_or("");
        let bus_id = el.attr("busid").map(String::from);
        // As in NCCL, a `gpu` or `nic` child decides what the function is,
        // whatever its class says.
        if let Some(gpu) = el.children_named("gpu").next() {
            for other in el.children.iter().filter(|c| !std::ptr::eq(*c, gpu)) {
                ignored(other, "pci of a GPU");
            }
            return self.gpu(gpu, bus_id, parent, pcie_link(el), cpu);
        }
        if el.children_named("nic").next().is_some() {
            let link = pcie_link(el);
            for child in &el.children {
                if child.name == "nic" {
                    self.nic(child, parent, &link, cpu)?;
                } else {
                    ignored(child, "pci of a NIC");
                }
            }
            return Ok(());
        }
        if class.starts_with("0x0680") || class.starts_with("0x03") || class.starts_with("0x02") {
            // An NVSwitch is reached through the NVLinks that name it; a
            // GPU or NIC function without its child is one NCCL skipped.
            tracing::debug!(
                line = el.line,
                class,
                "NCCL XML: pci function without gpu or nic; ignored"
            );
            return Ok(());
        }
        if class != "0x060400" {
            tracing::debug!(
                line = el.line,
                class,
                "NCCL XML: pci of another class; taken as a bridge, as NCCL does"
            );
        }
        let index = self.switches.len();
        self.switches.push(SwitchPlan {
            bus_id,
            parent,
            link: pcie_link(el),
            cpu,
        });
        for child in &el.children {
            if child.name == "pci" {
                self.pci(child, Parent::Switch(index), cpu)?;
            } else {
                // `pcilink` (links between Broadcom switch chips) included.
                ignored(child, "pci bridge");
            }
        }
        Ok(())
    }

    fn gpu(
        &mut self,
        el: &Element,
        bus_id: Option<String>,
        parent: Parent,
        link: LinkKind,
        cpu: usize,
    ) -> Result<(), TopologyError> {
        let number = |key: &str| -> Result<Option<u32>, TopologyError> {
            el.attr(key)
                .map(|v| {
                    v.trim().parse::<u32>().map_err(|_| {
                        xml_error(el.line, "gpu", format!("`{key}` is `{v}`, not a number"))
                    })
                })
                .transpose()
        };
        let Some(dev) = number("dev")? else {
            return Err(xml_error(el.line, "gpu", "a gpu without `dev`"));
        };
        let generation = match number("sm")? {
            Some(sm) => nvlink_generation(sm),
            None => {
                tracing::debug!(
                    line = el.line,
                    "NCCL XML: gpu without `sm`; taking NVLink 3"
                );
                3
            }
        };
        let mut nvlinks = Vec::new();
        for child in &el.children {
            if child.name != "nvlink" {
                // `c2c` (Grace's chip-to-chip link) included.
                ignored(child, "gpu");
                continue;
            }
            let Some(class) = child.attr("tclass") else {
                return Err(xml_error(
                    child.line,
                    "nvlink",
                    "an nvlink without `tclass`",
                ));
            };
            let count = match child.attr("count").map(|c| c.trim().parse::<u32>()) {
                Some(Ok(count)) => count,
                Some(Err(_)) | None => {
                    return Err(xml_error(
                        child.line,
                        "nvlink",
                        "`count` is missing or not a number",
                    ));
                }
            };
            if count == 0 {
                tracing::debug!(line = child.line, "NCCL XML: nvlink with count 0; ignored");
                continue;
            }
            nvlinks.push(NvlinkPlan {
                target: child.attr("target").map(String::from),
                class: class.to_string(),
                count,
                line: child.line,
            });
        }
        self.gpus.push(GpuPlan {
            dev,
            bus_id,
            generation,
            parent,
            link,
            cpu,
            nvlinks,
            line: el.line,
        });
        Ok(())
    }

    fn nic(
        &mut self,
        el: &Element,
        parent: Parent,
        link: &LinkKind,
        cpu: usize,
    ) -> Result<(), TopologyError> {
        for child in &el.children {
            if child.name != "net" {
                ignored(child, "nic");
                continue;
            }
            let name = match child.attr("name") {
                Some(name) if !name.trim().is_empty() => name.trim().to_string(),
                _ => {
                    let dev = child.attr("dev").unwrap_or("?");
                    tracing::debug!(
                        line = child.line,
                        "NCCL XML: net without a name; calling it NET{dev}"
                    );
                    format!("NET{dev}")
                }
            };
            if self.nics.iter().any(|n| n.name == name) {
                return Err(xml_error(
                    child.line,
                    "net",
                    format!("two NIC ports are named `{name}`"),
                ));
            }
            // Each port of a multi-port card gets its own link to the
            // card's parent: the ports are separate devices to NCCL.
            self.nics.push(NicPlan {
                name,
                parent,
                link: link.clone(),
                cpu,
            });
        }
        Ok(())
    }

    fn build(self) -> Result<Topology, TopologyError> {
        let mut order: Vec<usize> = (0..self.gpus.len()).collect();
        order.sort_by_key(|&g| (self.gpus[g].dev, self.gpus[g].line));
        for w in order.windows(2) {
            let (a, b) = (&self.gpus[w[0]], &self.gpus[w[1]]);
            if a.dev == b.dev {
                return Err(xml_error(
                    a.line.max(b.line),
                    "gpu",
                    format!(
                        "two GPUs have dev {} (lines {} and {})",
                        a.dev,
                        a.line.min(b.line),
                        a.line.max(b.line)
                    ),
                ));
            }
        }

        let mut t = Topology::new(
            format!("nccl-{}gpu", self.gpus.len()),
            format!(
                "from an NCCL topology dump: {} GPUs, {} NIC ports, {} CPUs, {} PCIe bridges",
                self.gpus.len(),
                self.nics.len(),
                self.cpus.len(),
                self.switches.len()
            ),
        );
        let mut gpu_node = vec![0; self.gpus.len()];
        for &g in &order {
            let gpu = &self.gpus[g];
            let mut node =
                Node::new(format!("GPU{}", gpu.dev), NodeKind::Gpu).numa(self.cpus[gpu.cpu].numa);
            if let Some(id) = &gpu.bus_id {
                node = node.pci_bus_id(id.clone());
            }
            gpu_node[g] = t.add_node(node);
        }
        let mut cpu_node = Vec::with_capacity(self.cpus.len());
        for (i, cpu) in self.cpus.iter().enumerate() {
            let taken = self.cpus[..i].iter().any(|c| c.numa == cpu.numa);
            let name = if taken {
                // Dumps fused from several hosts repeat NUMA ids.
                format!("CPU{}.{i}", cpu.numa)
            } else {
                format!("CPU{}", cpu.numa)
            };
            cpu_node.push(t.add_node(Node::new(name, NodeKind::Cpu).numa(cpu.numa)));
        }
        join_cpus(&mut t, &cpu_node);

        let mut switch_node: Vec<NodeId> = Vec::with_capacity(self.switches.len());
        let resolve = |p: Parent, switch_node: &[NodeId]| match p {
            Parent::Cpu(c) => cpu_node[c],
            Parent::Switch(s) => switch_node[s],
        };
        for (i, sw) in self.switches.iter().enumerate() {
            let mut node =
                Node::new(format!("PLX{i}"), NodeKind::PcieSwitch).numa(self.cpus[sw.cpu].numa);
            if let Some(id) = &sw.bus_id {
                node = node.pci_bus_id(id.clone());
            }
            let id = t.add_node(node);
            // Parents precede children in the document, so theirs exist.
            let up = resolve(sw.parent, &switch_node);
            t.connect(id, up, sw.link.clone());
            switch_node.push(id);
        }
        for &g in &order {
            let gpu = &self.gpus[g];
            t.connect(
                gpu_node[g],
                resolve(gpu.parent, &switch_node),
                gpu.link.clone(),
            );
        }
        for nic in &self.nics {
            let id = t
                .add_node(Node::new(nic.name.clone(), NodeKind::Nic).numa(self.cpus[nic.cpu].numa));
            t.connect(id, resolve(nic.parent, &switch_node), nic.link.clone());
        }

        self.add_nvlinks(&mut t, &order, &gpu_node, &cpu_node)?;
        t.validate()?;
        Ok(t)
    }

    /// NVLinks the way NCCL reads them (`ncclTopoAddNvLinks`): a target of
    /// class `0x03….` is a GPU; `0x068001` is the GPU's own CPU (IBM
    /// POWER's NPU); anything else — `0x068000` NVSwitches, and the
    /// bridge class `0x060400` NCCL writes for switches it cannot see —
    /// is the one NVSwitch fabric. Each GPU lists its links to another
    /// GPU itself, so a pair's bundle is read from both ends.
    fn add_nvlinks(
        &self,
        t: &mut Topology,
        order: &[usize],
        gpu_node: &[NodeId],
        cpu_node: &[NodeId],
    ) -> Result<(), TopologyError> {
        let mut by_bus: BTreeMap<u64, usize> = BTreeMap::new();
        for (g, gpu) in self.gpus.iter().enumerate() {
            if let Some(key) = gpu.bus_id.as_deref().and_then(bus_id_key) {
                by_bus.insert(key, g);
            }
        }
        let mut one_way: BTreeMap<(usize, usize), u32> = BTreeMap::new();
        let mut to_cpu = vec![0u32; self.gpus.len()];
        let mut to_fabric = vec![0u32; self.gpus.len()];
        for &g in order {
            for nv in &self.gpus[g].nvlinks {
                if nv.class.starts_with("0x03") {
                    let peer = nv
                        .target
                        .as_deref()
                        .and_then(bus_id_key)
                        .and_then(|k| by_bus.get(&k));
                    match peer {
                        Some(&h) if h != g => *one_way.entry((g, h)).or_default() += nv.count,
                        _ => tracing::debug!(
                            line = nv.line,
                            target = nv.target.as_deref(),
                            "NCCL XML: nvlink to a GPU not in the dump; ignored, as NCCL does"
                        ),
                    }
                } else if nv.class == "0x068001" {
                    to_cpu[g] += nv.count;
                } else {
                    if nv.class != "0x068000" {
                        tracing::debug!(
                            line = nv.line,
                            class = nv.class.as_str(),
                            "NCCL XML: nvlink target class taken as an NVSwitch, as NCCL does"
                        );
                    }
                    to_fabric[g] += nv.count;
                }
            }
        }
        let bundle = |count: u32, generation: u8, line: usize| {
            u8::try_from(count)
                .map(|count| LinkKind::Nvlink { generation, count })
                .map_err(|_| xml_error(line, "gpu", format!("{count} NVLinks in one bundle")))
        };

        let mut pairs: Vec<(usize, usize)> =
            one_way.keys().map(|&(a, b)| (a.min(b), a.max(b))).collect();
        pairs.sort_unstable_by_key(|&(a, b)| (self.gpus[a].dev, self.gpus[b].dev));
        pairs.dedup();
        for (a, b) in pairs {
            let there = one_way.get(&(a, b)).copied();
            let back = one_way.get(&(b, a)).copied();
            let count = match (there, back) {
                (Some(x), Some(y)) => {
                    if x != y {
                        tracing::debug!(
                            a = self.gpus[a].dev,
                            b = self.gpus[b].dev,
                            "NCCL XML: the two ends list {x} and {y} NVLinks; taking {}",
                            x.min(y)
                        );
                    }
                    x.min(y)
                }
                (Some(x), None) | (None, Some(x)) => {
                    tracing::debug!(
                        a = self.gpus[a].dev,
                        b = self.gpus[b].dev,
                        "NCCL XML: an NVLink listed from one end only"
                    );
                    x
                }
                (None, None) => continue,
            };
            let generation = self.gpus[a].generation.min(self.gpus[b].generation);
            let kind = bundle(count, generation, self.gpus[a].line)?;
            t.connect(gpu_node[a], gpu_node[b], kind);
        }

        for &g in order {
            if to_cpu[g] > 0 {
                let gpu = &self.gpus[g];
                let kind = bundle(to_cpu[g], gpu.generation, gpu.line)?;
                t.connect(gpu_node[g], cpu_node[gpu.cpu], kind);
            }
        }
        if order.iter().any(|&g| to_fabric[g] > 0) {
            let fabric = t.add_node(Node::new("NVSwitch", NodeKind::NvSwitch));
            for &g in order {
                if to_fabric[g] > 0 {
                    let gpu = &self.gpus[g];
                    let kind = bundle(to_fabric[g], gpu.generation, gpu.line)?;
                    t.connect(gpu_node[g], fabric, kind);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
