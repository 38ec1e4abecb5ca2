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

mod assemble;
mod query;

pub use assemble::build_topology;
pub use query::snapshot;

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

#[cfg(test)]
mod tests;
