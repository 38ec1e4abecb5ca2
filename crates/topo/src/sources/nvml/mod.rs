//! Topology discovery at run time through NVML, the NVIDIA Management
//! Library that ships with the driver.
//!
//! What it finds, per GPU: name, PCI bus id, NUMA node (from sysfs), the
//! PCIe generation and width, the memory bus width and clock (which give
//! the memory bandwidth), and every active NVLink with its generation and
//! the PCI address at its far end. Per pair of GPUs: the closest common
//! PCIe ancestor NVML reports (same switch, several switches, host bridge,
//! NUMA node, system) and whether peer-to-peer reads work. From those it
//! rebuilds the graph: PCIe switches, host bridges and CPUs joined the way
//! the ancestors say, NVLinks between GPUs or to one NVSwitch fabric node,
//! and peer-to-peer blocked where NVML says it is off.
//!
//! Discovery has two halves so that the second can be tested, and rerun,
//! without a GPU: [`snapshot`] makes the NVML calls and returns plain data
//! ([`NvmlSnapshot`], which serialises to JSON so a machine's facts can be
//! saved and shipped), and [`build_topology`] turns that data into a
//! [`Topology`]. [`discover`] does both.
//!
//! Failure behaviour: NVML is loaded with `dlopen` when [`snapshot`] runs,
//! never linked, so this module builds and links on machines without the
//! driver. There, and wherever the library, the driver or the GPUs cannot
//! be reached, the result is [`TopologyError::Nvml`] with the reason;
//! nothing here panics on what NVML or a snapshot says. Facts that only
//! refine the model (NUMA node, memory bandwidth, PCIe width) are left out
//! when a query fails, and a `tracing` warning says so.

use std::collections::{BTreeMap, HashMap};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::error::TopologyError;
use crate::graph::{LinkKind, Node, NodeId, NodeKind, Topology};
use crate::presets::pcie::{UPI_GBPS, UPI_LATENCY_US};

/// Link slots NVML numbers per GPU (`NVML_NVLINK_MAX_LINKS` in `nvml.h`).
/// Querying a slot a GPU does not have just fails, so every GPU is asked
/// about all of them.
pub const NVLINK_MAX_LINKS: u32 = 18;

/// PCIe link assumed for a GPU whose generation or width NVML would not
/// tell: 3.0 x16, the slowest slot any NVLink-era data-centre GPU sits in,
/// so a model built on a guess errs towards slow rather than fast.
const FALLBACK_PCIE: (u8, u8) = (3, 16);

/// Everything [`build_topology`] needs, as NVML reported it on one machine.
///
/// The two matrices are indexed by position in `gpus` (which is NVML's
/// device index, and becomes the rank order); their diagonals are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvmlSnapshot {
    /// The driver version, for the topology's description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The GPUs in NVML index order.
    pub gpus: Vec<GpuFacts>,
    /// `ancestors[i][j]`: the closest PCIe ancestor GPUs `i` and `j` share.
    pub ancestors: Vec<Vec<CommonAncestor>>,
    /// `p2p_read_ok[i][j]`: whether GPU `i` can read GPU `j`'s memory
    /// directly. A pair is modelled peer-to-peer only if both directions
    /// say yes.
    pub p2p_read_ok: Vec<Vec<bool>>,
}

/// What NVML says about one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFacts {
    /// Marketing name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// PCI bus id in sysfs form, lowercase with a 4-digit domain
    /// (`0000:1b:00.0`); see [`normalize_bus_id`].
    pub pci_bus_id: String,
    /// The NUMA node of the GPU's PCIe root, where the kernel knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// Highest PCIe generation the GPU and its slot can both run, 1..=6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_generation: Option<u8>,
    /// Widest PCIe link the GPU and its slot can both run, 1..=16 lanes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_width: Option<u8>,
    /// Width of the memory interface in bits (5120 for HBM3 on H100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bus_width_bits: Option<u32>,
    /// Highest memory clock in MHz, as NVML counts it (data moves on both
    /// edges, so bytes per second = clock × 2 × bus width / 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory_clock_mhz: Option<u32>,
    /// The GPU's active NVLinks; inactive slots are not listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<NvlinkFacts>,
}

/// One active NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvlinkFacts {
    /// The link slot, 0..[`NVLINK_MAX_LINKS`].
    pub link: u32,
    /// NVLink generation 1..=5, already translated from NVML's version
    /// code by [`nvlink_generation`].
    pub generation: u8,
    /// PCI bus id of the far end, normalised; `None` when NVML could not
    /// say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_pci_bus_id: Option<String>,
    /// The far end's 24-bit PCI class code from sysfs (`0x030200` is a 3D
    /// controller, `0x068000` an NVSwitch bridge), where readable. It tells
    /// a GPU hidden from this process apart from a switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_pci_class: Option<u32>,
}

/// The closest PCIe ancestor two GPUs share, nearest first; the levels of
/// `nvmlDeviceGetTopologyCommonAncestor`, which `nvidia-smi topo -m`
/// prints as PIX, PXB, PHB, NODE and SYS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommonAncestor {
    /// Both on one board (dual-GPU cards such as the K80); modelled like
    /// [`CommonAncestor::Single`].
    Internal,
    /// Behind the same PCIe switch (PIX).
    Single,
    /// Behind a tree of PCIe switches, below the host bridge (PXB).
    Multiple,
    /// Under the same host bridge (PHB).
    HostBridge,
    /// Under different host bridges of one NUMA node (NODE).
    Node,
    /// On different CPU sockets (SYS).
    System,
}

impl From<TopologyLevel> for CommonAncestor {
    fn from(level: TopologyLevel) -> Self {
        match level {
            TopologyLevel::Internal => CommonAncestor::Internal,
            TopologyLevel::Single => CommonAncestor::Single,
            TopologyLevel::Multiple => CommonAncestor::Multiple,
            TopologyLevel::HostBridge => CommonAncestor::HostBridge,
            TopologyLevel::Node => CommonAncestor::Node,
            TopologyLevel::System => CommonAncestor::System,
        }
    }
}

/// Translate the code `nvmlDeviceGetNvLinkVersion` returns into an NVLink
/// generation.
///
/// The code is an `nvmlNvlinkVersion_t`, not the generation: NVML counts
/// minor revisions too (1 = 1.0, 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1,
/// 6 = 4.0, 7 = 5.0), so an A100 answers 4 or 5 and an H100 answers 6.
/// NVIDIA documented this late, and code that read the number as the
/// generation mis-rated links (open-mpi/hwloc issue 658). `None` for 0
/// (NVML's "invalid") and for codes newer than this table.
pub fn nvlink_generation(nvml_version: u32) -> Option<u8> {
    match nvml_version {
        1 => Some(1),
        2 | 3 => Some(2),
        4 | 5 => Some(3),
        6 => Some(4),
        7 => Some(5),
        _ => None,
    }
}

/// Rewrite a PCI bus id into the form sysfs uses: lowercase, 4-digit
/// domain. NVML prints an 8-digit uppercase domain (`00000000:1B:00.0`),
/// sysfs and our topology files `0000:1b:00.0`; normalising both sides lets
/// NVLink far ends be matched against GPUs whichever form they came in.
pub fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if rest.contains(':') => match u32::from_str_radix(domain, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => id,
        },
        // No domain at all (`1b:00.0`): domain 0 is the only one most
        // machines have.
        Some(_) => format!("0000:{id}"),
        None => id,
    }
}

/// Discover this machine's GPU topology: [`snapshot`], then
/// [`build_topology`].
///
/// # Errors
/// [`TopologyError::Nvml`] when NVML or the driver is missing, sees no GPU
/// or fails a query the graph cannot do without; [`TopologyError::Invalid`]
/// when what NVML reported does not make a valid graph.
pub fn discover() -> Result<Topology, TopologyError> {
    build_topology(&snapshot()?)
}

/// Ask NVML for the facts [`build_topology`] needs.
///
/// # Errors
/// [`TopologyError::Nvml`]: the library or driver is missing (the message
/// says "NVML not found"), NVML sees no GPU, or it failed to give a GPU's
/// PCI address.
pub fn snapshot() -> Result<NvmlSnapshot, TopologyError> {
    let nvml = Nvml::init().map_err(|e| TopologyError::Nvml(init_failure(&e)))?;
    read_snapshot(&nvml)
}

/// The message for a failed `nvmlInit`, sorted by what the user can do
/// about it.
fn init_failure(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(_)
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::LibraryNotFound => {
            format!(
                "NVML not found: no NVIDIA driver on this machine (loading libnvidia-ml.so.1: {e})"
            )
        }
        NvmlError::DriverNotLoaded => "NVML not found: no NVIDIA driver on this machine \
             (libnvidia-ml.so.1 is installed but the kernel driver is not loaded)"
            .to_string(),
        NvmlError::NoPermission => {
            "NVML is installed but may not talk to the driver (no permission)".to_string()
        }
        other => format!("NVML failed to initialise: {other}"),
    }
}

/// A query failure that discovery cannot work around.
fn query_failure(what: &str) -> impl Fn(NvmlError) -> TopologyError + '_ {
    move |e| TopologyError::Nvml(format!("{what}: {e}"))
}

fn read_snapshot(nvml: &Nvml) -> Result<NvmlSnapshot, TopologyError> {
    let count = nvml
        .device_count()
        .map_err(query_failure("counting GPUs"))?;
    if count == 0 {
        return Err(TopologyError::Nvml(
            "NVML is loaded but reports no GPU".into(),
        ));
    }
    let devices = (0..count)
        .map(|i| {
            nvml.device_by_index(i)
                .map_err(|e| TopologyError::Nvml(format!("opening GPU {i}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;

    let mut gpus = Vec::with_capacity(devices.len());
    for (i, device) in devices.iter().enumerate() {
        let pci = device
            .pci_info()
            .map_err(|e| TopologyError::Nvml(format!("PCI address of GPU {i}: {e}")))?;
        let pci_bus_id = normalize_bus_id(&pci.bus_id);
        let name = device.name().unwrap_or_else(|e| {
            warn!("NVML: name of GPU {i}: {e}");
            "NVIDIA GPU".into()
        });
        // NVML's own NUMA query (nvmlDeviceGetNumaNodeId) answers with the
        // node *of the GPU's memory* on coherent Grace systems and fails
        // elsewhere; the node of the PCIe root, which is what staging
        // through host memory cares about, is the kernel's.
        let numa = sysfs_numa_node(&pci_bus_id);
        // The "max" queries give what GPU and slot can both do; the
        // "current" ones drop to gen 1 while the GPU idles, so they are
        // only a fallback.
        let pcie_generation = device
            .max_pcie_link_gen()
            .or_else(|_| device.current_pcie_link_gen())
            .ok()
            .and_then(|g| u8::try_from(g).ok())
            .filter(|g| (1..=6).contains(g));
        let pcie_width = device
            .max_pcie_link_width()
            .or_else(|_| device.current_pcie_link_width())
            .ok()
            .and_then(|w| u8::try_from(w).ok())
            .filter(|w| (1..=16).contains(w));
        if pcie_generation.is_none() || pcie_width.is_none() {
            warn!(
                "NVML: PCIe link of GPU {i} unknown; assuming PCIe {}.0 x{}",
                FALLBACK_PCIE.0, FALLBACK_PCIE.1
            );
        }
        gpus.push(GpuFacts {
            name,
            pci_bus_id,
            numa,
            pcie_generation,
            pcie_width,
            memory_bus_width_bits: device.memory_bus_width().ok(),
            max_memory_clock_mhz: device.max_clock_info(Clock::Memory).ok(),
            nvlinks: read_nvlinks(i, device),
        });
    }

    let n = devices.len();
    let mut ancestors = vec![vec![CommonAncestor::Internal; n]; n];
    let mut p2p_read_ok = vec![vec![true; n]; n];
    for i in 0..n {
        for j in 0..n {
            if i == j {
                continue;
            }
            // The wrapper takes the second device by value, so open it anew.
            let other = nvml
                .device_by_index(j as u32)
                .map_err(|e| TopologyError::Nvml(format!("opening GPU {j}: {e}")))?;
            ancestors[i][j] = match devices[i].topology_common_ancestor(other) {
                Ok(level) => level.into(),
                Err(e) => {
                    let guess = guess_ancestor(&gpus[i], &gpus[j]);
                    warn!(
                        "NVML: common PCIe ancestor of GPUs {i} and {j}: {e}; assuming {guess:?}"
                    );
                    guess
                }
            };
            // An unanswered query counts as "no": a staged copy is always
            // possible, a peer access that is not is a crash.
            p2p_read_ok[i][j] = match devices[i].p2p_status(&devices[j], P2pCapabilitiesIndex::Read)
            {
                Ok(status) => status == P2pStatus::Ok,
                Err(e) => {
                    warn!("NVML: peer-to-peer status of GPUs {i} and {j}: {e}; assuming off");
                    false
                }
            };
        }
    }

    Ok(NvmlSnapshot {
        driver_version: nvml.sys_driver_version().ok(),
        gpus,
        ancestors,
        p2p_read_ok,
    })
}

/// The active NVLinks of GPU `i`. Slots that do not exist or are down make
/// the state query fail or answer "inactive", and are skipped.
fn read_nvlinks(i: usize, device: &nvml_wrapper::Device<'_>) -> Vec<NvlinkFacts> {
    let mut links = Vec::new();
    for slot in 0..NVLINK_MAX_LINKS {
        let link = device.link_wrapper_for(slot);
        if !matches!(link.is_active(), Ok(true)) {
            continue;
        }
        let from_version = link.version().ok().and_then(nvlink_generation);
        let Some(generation) = from_version.or_else(|| {
            device
                .architecture()
                .ok()
                .and_then(generation_of_architecture)
        }) else {
            warn!(
                "NVML: NVLink {slot} of GPU {i} is active but its generation is unknown; left out"
            );
            continue;
        };
        let remote_pci_bus_id = match link.remote_pci_info() {
            Ok(pci) => Some(normalize_bus_id(&pci.bus_id)),
            Err(e) => {
                warn!("NVML: far end of NVLink {slot} of GPU {i}: {e}");
                None
            }
        };
        let remote_pci_class = remote_pci_bus_id.as_deref().and_then(sysfs_pci_class);
        links.push(NvlinkFacts {
            link: slot,
            generation,
            remote_pci_bus_id,
            remote_pci_class,
        });
    }
    links
}

/// The NVLink generation each architecture shipped with, for drivers that
/// will not say per link.
fn generation_of_architecture(arch: DeviceArchitecture) -> Option<u8> {
    match arch {
        DeviceArchitecture::Pascal => Some(1),
        DeviceArchitecture::Volta | DeviceArchitecture::Turing => Some(2),
        DeviceArchitecture::Ampere => Some(3),
        DeviceArchitecture::Hopper => Some(4),
        DeviceArchitecture::Blackwell => Some(5),
        _ => None,
    }
}

/// A stand-in when NVML cannot place two GPUs: NUMA nodes that differ mean
/// different sockets; otherwise assume different host bridges of one
/// socket, the farthest PCIe relation short of crossing sockets.
fn guess_ancestor(a: &GpuFacts, b: &GpuFacts) -> CommonAncestor {
    match (a.numa, b.numa) {
        (Some(x), Some(y)) if x != y => CommonAncestor::System,
        _ => CommonAncestor::Node,
    }
}

/// The NUMA node the kernel assigns the PCI device; `None` where sysfs
/// is absent or says -1 (firmware gave no affinity).
fn sysfs_numa_node(bus_id: &str) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{bus_id}/numa_node")).ok()?;
    u32::try_from(text.trim().parse::<i64>().ok()?).ok()
}

/// The PCI class code of a device from sysfs (`0x030200`).
fn sysfs_pci_class(bus_id: &str) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{bus_id}/class")).ok()?;
    let text = text.trim();
    u32::from_str_radix(text.strip_prefix("0x").unwrap_or(text), 16).ok()
}

/// Whether a PCI class code is a display controller (base class 0x03),
/// which is what every NVIDIA GPU enumerates as.
fn is_display_class(class: u32) -> bool {
    class >> 16 == 0x03
}

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

#[cfg(test)]
mod tests;
