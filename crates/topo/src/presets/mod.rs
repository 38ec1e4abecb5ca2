//! Well-known machines, by name.
//!
//! Every constant cites its source where it is defined. `host` is special:
//! it is measured on this machine when asked for ([`crate::probe::host`]).

pub mod cluster;
pub mod cpu_cluster;
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
    "dgx-a100x2",
    "dgx-a100x4",
    "dgx-h100x2",
    "dgx-h100x4",
    "dgx-h100x8",
    "host",
    "cpu-cluster",
];

/// The preset called `name`. `host` measures this machine (a second or
/// so, once per process) and gives it `host_ranks` threads; the cluster
/// presets (`dgx-h100x2` …) take `:nics=N,gbps=R` (see [`cluster`]);
/// `cpu-cluster` takes `:hosts=H,ranks=L,gbit=R` and measures this
/// machine as each host (see [`cpu_cluster`]).
pub fn by_name(name: &str, host_ranks: u32) -> Result<Topology, TopologyError> {
    if let Some(cluster) = cluster::parse(name) {
        return cluster?.build();
    }
    if let Some(cluster) = cpu_cluster::parse(name) {
        return cluster?.build(crate::probe::host::measured());
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{NodeKind, PathClass};

    /// Every preset: its devices, how GPU0 reaches GPU1 and the last
    /// device, and whether peer access is on.
    #[test]
    fn every_preset_has_the_shape_it_claims() {
        let nv = PathClass::NvLink;
        let cases: &[(&str, usize, PathClass, PathClass, bool)] = &[
            ("pcie3-4gpu", 4, PathClass::Pix, PathClass::Phb, true),
            ("pcie3-8gpu-2numa", 8, PathClass::Pix, PathClass::Sys, true),
            ("pcie4-4gpu", 4, PathClass::Pix, PathClass::Phb, true),
            ("pcie4-4gpu-nop2p", 4, PathClass::Pix, PathClass::Phb, false),
            ("pcie4-8gpu-2numa", 8, PathClass::Pix, PathClass::Sys, true),
            (
                "pcie4-8gpu-2numa-nop2p",
                8,
                PathClass::Pix,
                PathClass::Sys,
                false,
            ),
            ("pcie5-4gpu", 4, PathClass::Pix, PathClass::Phb, true),
            ("pcie5-8gpu-2numa", 8, PathClass::Pix, PathClass::Sys, true),
            (
                "consumer-4gpu-pcie4",
                4,
                PathClass::Phb,
                PathClass::Phb,
                false,
            ),
            (
                "consumer-8gpu-pcie4",
                8,
                PathClass::Pix,
                PathClass::Phb,
                false,
            ),
            ("consumer-2gpu-nvlink-bridge", 2, nv(2), nv(2), true),
            ("dgx1-v100", 8, nv(1), PathClass::Sys, true),
            ("dgx-a100", 8, nv(12), nv(12), true),
            ("dgx-h100", 8, nv(18), nv(18), true),
            ("seed-8gpu-mesh", 8, nv(2), PathClass::Sys, true),
            ("dgx-a100x2", 16, nv(12), PathClass::Net, true),
            ("dgx-a100x4", 32, nv(12), PathClass::Net, true),
            ("dgx-h100x2", 16, nv(18), PathClass::Net, true),
            ("dgx-h100x4", 32, nv(18), PathClass::Net, true),
            ("dgx-h100x8", 64, nv(18), PathClass::Net, true),
            ("host", 3, PathClass::Shm, PathClass::Shm, true),
            ("cpu-cluster", 4, PathClass::Shm, PathClass::Net, true),
        ];
        assert_eq!(cases.len(), NAMES.len());
        for &(name, devices, first, last, p2p) in cases {
            let t = by_name(name, 3).unwrap();
            let d = t.devices();
            assert_eq!(d.len(), devices, "{name}");
            assert_eq!(t.path_class(d[0], d[1]).unwrap(), first, "{name}");
            assert_eq!(t.path_class(d[0], d[devices - 1]).unwrap(), last, "{name}");
            assert_eq!(t.p2p(d[0], d[1]), p2p, "{name}");
            let kind = if name == "host" || name == "cpu-cluster" {
                NodeKind::Thread
            } else {
                NodeKind::Gpu
            };
            assert!(d.iter().all(|&i| t.nodes[i].kind == kind), "{name}");
            // Every device reaches every other.
            for &a in &d {
                for &b in &d {
                    t.route(a, b).unwrap();
                }
            }
        }
        assert!(matches!(
            by_name("dgx-b200", 1),
            Err(TopologyError::UnknownPreset { .. })
        ));
    }
}
