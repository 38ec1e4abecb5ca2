//! Well-known machines, by name.
//!
//! Every constant cites its source where it is defined. `host` is special:
//! it is measured on this machine when asked for ([`crate::probe::host`]).

mod host;
mod nvlink;
pub(crate) mod pcie;

pub use host::host;

use pcie::{PcieBox, SERVER_DRAM_GBPS};

use crate::error::TopologyError;
use crate::graph::Topology;

/// Names of the presets, in the order `ferrocoll topo --list` prints them.
pub const NAMES: &[&str] = &[
    "pcie3-4gpu",
    "pcie3-8gpu-2numa",
    "pcie4-4gpu",
    "pcie4-4gpu-nop2p",
    "pcie4-8gpu-2numa",
    "pcie4-8gpu-2numa-nop2p",
    "pcie5-4gpu",
    "pcie5-8gpu-2numa",
    "consumer-4gpu-pcie4",
    "consumer-8gpu-pcie4",
    "consumer-2gpu-nvlink-bridge",
    "dgx1-v100",
    "dgx-a100",
    "dgx-h100",
    "seed-8gpu-mesh",
    "host",
];

/// The preset called `name`. `host` measures this machine (a second or
/// so, once per process) and gives it `host_ranks` threads.
pub fn by_name(name: &str, host_ranks: u32) -> Result<Topology, TopologyError> {
    let t = match name {
        "dgx1-v100" => nvlink::dgx1_v100(),
        "dgx-a100" => nvlink::dgx_a100(),
        "dgx-h100" => nvlink::dgx_h100(),
        "seed-8gpu-mesh" => nvlink::seed_mesh(),
        "consumer-4gpu-pcie4" => pcie::consumer_pcie(4),
        "consumer-8gpu-pcie4" => pcie::consumer_pcie(8),
        "consumer-2gpu-nvlink-bridge" => pcie::consumer_nvlink_bridge(),
        "host" => host(host_ranks, crate::probe::host::measured()),
        other => pcie_server(other).ok_or_else(|| TopologyError::UnknownPreset {
            name: name.to_string(),
            known: NAMES.join(", "),
        })?,
    };
    t.validate()?;
    Ok(t)
}

/// `pcie{3,4,5}-{4gpu,8gpu-2numa}[-nop2p]`: a server with two GPUs per
/// PCIe switch, one socket per four GPUs.
fn pcie_server(name: &str) -> Option<Topology> {
    if !NAMES.contains(&name) || !name.starts_with("pcie") {
        return None;
    }
    let generation = name[4..5].parse().ok()?;
    let gpus = if name.contains("-8gpu") { 8 } else { 4 };
    let numa_nodes = if name.contains("2numa") { 2 } else { 1 };
    let p2p = !name.ends_with("-nop2p");
    let description = format!(
        "{gpus} GPUs on PCIe {generation}.0 x16, two per PCIe switch, {numa_nodes} NUMA node(s), peer-to-peer {}",
        if p2p {
            "on"
        } else {
            "off (staged through host memory)"
        }
    );
    Some(
        PcieBox {
            generation,
            gpus,
            numa_nodes,
            gpus_per_switch: 2,
            p2p,
            dram_gbps: SERVER_DRAM_GBPS,
        }
        .build(name, &description),
    )
}
