//! Matrices over the devices of a topology.

use std::fmt::Write;

use crate::error::TopologyError;
use crate::graph::{Router, Topology};
use crate::probe::Matrix;
use crate::sim::CostModel;
use crate::sim::network::Network;

/// The `nvidia-smi topo -m` view: one row and column per device, the path
/// class in each cell, and each device's NUMA node; the legend follows.
pub fn smi_matrix(topo: &Topology) -> Result<String, TopologyError> {
    let devices = topo.devices();
    let mut s = String::from("        ");
    for &d in &devices {
        let _ = write!(s, "{:<8}", topo.nodes[d].name);
    }
    s.push_str("NUMA Affinity\n");
    // One router for every pair: its search trees are shared.
    let mut router = Router::new(topo);
    for &a in &devices {
        let _ = write!(s, "{:<8}", topo.nodes[a].name);
        for &b in &devices {
            let mut cell = router.path_class(a, b)?.to_string();
            if a != b && !topo.p2p(a, b) {
                cell.push('*');
            }
            let _ = write!(s, "{cell:<8}");
        }
        match topo.nodes[a].numa {
            Some(n) => {
                let _ = writeln!(s, "{n}");
            }
            None => s.push_str("N/A\n"),
        }
    }
    s.push_str(
        "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the link between NUMA nodes (UPI, xGMI)\n  NODE = Connection traversing PCIe and the link between host bridges of one NUMA node\n  PHB  = Connection traversing PCIe and a PCIe host bridge (the CPU)\n  PXB  = Connection traversing several PCIe switches, no host bridge\n  PIX  = Connection traversing at most one PCIe switch\n  NV#  = Connection over a bonded set of # NVLinks\n  SHM  = Threads of one process sharing host memory\n  *    = Peer-to-peer off: staged through host memory\n",
    );
    Ok(s)
}

/// Predicted one-way bandwidth between every pair of devices, GB/s of
/// payload: the route's narrowest resource after protocol efficiency, a
/// staged copy's host memory counted twice. The diagonal is the device's
/// own memory where modelled (else 0).
pub fn bandwidth_matrix(topo: &Topology, cost: &CostModel) -> Result<Matrix, TopologyError> {
    let devices = topo.devices();
    let n = devices.len();
    let mut network = Network::new(topo, devices.clone(), cost);
    let mut m = Matrix::new(n);
    for (a, &device) in devices.iter().enumerate() {
        for b in 0..n {
            let v = if a == b {
                topo.nodes[device].memory_bandwidth.unwrap_or(0.0)
            } else {
                let (uses, _) = network.route(a as u32, b as u32)?;
                uses.iter()
                    .map(|&(r, w)| network.resources[r].capacity / w / 1e3)
                    .fold(f64::INFINITY, f64::min)
            };
            m.set(a, b, if v.is_finite() { v } else { 0.0 });
        }
    }
    Ok(m)
}

/// Predicted one-way latency between every pair of devices, µs: the
/// route's hop latencies (the executor's per-step overhead comes on top).
pub fn latency_matrix(topo: &Topology) -> Result<Matrix, TopologyError> {
    let devices = topo.devices();
    let n = devices.len();
    let mut m = Matrix::new(n);
    let mut router = Router::new(topo);
    for a in 0..n {
        for b in 0..n {
            if a != b {
                m.set(a, b, router.route(devices[a], devices[b])?.latency_us);
            }
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    #[test]
    fn the_smi_view_of_a_dgx1_matches_its_nvlink_counts() {
        let t = presets::by_name("dgx1-v100", 1).unwrap();
        let text = smi_matrix(&t).unwrap();
        let row0 = text.lines().nth(1).unwrap();
        let cells: Vec<&str> = row0.split_whitespace().collect();
        assert_eq!(
            &cells[..9],
            ["GPU0", "X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
        );
        let off = presets::by_name("pcie4-4gpu-nop2p", 1).unwrap();
        assert!(smi_matrix(&off).unwrap().contains("PIX*"));
    }

    #[test]
    fn bandwidth_follows_the_narrowest_hop() {
        let t = presets::by_name("dgx1-v100", 1).unwrap();
        let m = bandwidth_matrix(&t, &CostModel::default()).unwrap();
        assert!((m.get(0, 3) - 40.0).abs() < 1e-9, "{}", m.get(0, 3));
        assert!((m.get(0, 1) - 20.0).abs() < 1e-9);
        // No NVLink: PCIe 3 at NCCL's efficiency, 15.75 × 24/31.5.
        assert!(m.get(0, 5) < 13.0, "{}", m.get(0, 5));
        let off = presets::by_name("pcie4-4gpu-nop2p", 1).unwrap();
        let m = bandwidth_matrix(&off, &CostModel::default()).unwrap();
        assert!(
            m.get(0, 1) > 20.0 && m.get(0, 1) <= 24.01,
            "{}",
            m.get(0, 1)
        );
        let lat = latency_matrix(&off).unwrap();
        assert!(
            lat.get(0, 1)
                > latency_matrix(&presets::by_name("pcie4-4gpu", 1).unwrap())
                    .unwrap()
                    .get(0, 1)
        );
    }
}
