//! NVLink machines: DGX-1 (V100 hybrid cube mesh), DGX A100 and DGX H100
//! (NVSwitch), and the partial mesh drawn in the seed article.

use super::pcie::{SERVER_DRAM_GBPS, UPI_GBPS, UPI_LATENCY_US};
use crate::graph::{LinkKind, Node, NodeKind, Topology};

/// HBM bandwidth, GB/s, from the datasheets: V100 SXM2 900 GB/s, A100 SXM
/// 80 GB 2039 GB/s, H100 SXM 3.35 TB/s.
const V100_HBM: f64 = 900.0;
const A100_HBM: f64 = 2039.0;
const H100_HBM: f64 = 3350.0;

/// Eight GPUs, two CPUs joined by UPI, GPUs in pairs behind PCIe switches
/// of `pcie_gen` (`gpus_per_switch` each), returning the GPU ids.
fn eight_gpu_chassis(
    t: &mut Topology,
    hbm: f64,
    pcie_gen: u8,
    gpus_per_switch: usize,
) -> Vec<usize> {
    let gpus: Vec<usize> = (0..8)
        .map(|i| {
            t.add_node(
                Node::new(format!("GPU{i}"), NodeKind::Gpu)
                    .numa(i / 4)
                    .memory_bandwidth(hbm),
            )
        })
        .collect();
    let cpus: Vec<usize> = (0..2)
        .map(|c| {
            t.add_node(
                Node::new(format!("CPU{c}"), NodeKind::Cpu)
                    .numa(c)
                    .memory_bandwidth(SERVER_DRAM_GBPS),
            )
        })
        .collect();
    t.connect_with(
        cpus[0],
        cpus[1],
        LinkKind::CpuInterconnect,
        UPI_GBPS,
        UPI_LATENCY_US,
    );
    let pcie = LinkKind::Pcie {
        generation: pcie_gen,
        width: 16,
    };
    for (s, group) in gpus.chunks(gpus_per_switch).enumerate() {
        let numa = (s * gpus_per_switch / 4) as u32;
        let sw = t.add_node(Node::new(format!("PLX{s}"), NodeKind::PcieSwitch).numa(numa));
        t.connect(sw, cpus[numa as usize], pcie.clone());
        for &g in group {
            t.connect(g, sw, pcie.clone());
        }
    }
    gpus
}

/// DGX-1 with V100: each GPU's six NVLink 2 links form the hybrid cube
/// mesh (two quads with single and double links, joined across), as
/// `nvidia-smi topo -m` on a DGX-1V shows it (NVIDIA DGX-1 with Tesla V100
/// system architecture whitepaper, 2017; the same counts appear in the
/// topology dump of NVIDIA/nccl issue 671). PCIe 3.0 switches hold two
/// GPUs each.
pub(crate) fn dgx1_v100() -> Topology {
    let mut t = Topology::new(
        "dgx1-v100",
        "NVIDIA DGX-1 with 8 V100 SXM2: NVLink 2 hybrid cube mesh (6 links per GPU), PCIe 3.0 switches, two Xeon sockets",
    );
    let g = eight_gpu_chassis(&mut t, V100_HBM, 3, 2);
    let mesh: [(usize, usize, u8); 12] = [
        (0, 1, 1),
        (0, 2, 1),
        (0, 3, 2),
        (0, 4, 2),
        (1, 2, 2),
        (1, 3, 1),
        (1, 5, 2),
        (2, 3, 2),
        (2, 6, 1),
        (3, 7, 1),
        (4, 5, 1),
        (4, 6, 1),
    ];
    let rest: [(usize, usize, u8); 4] = [(4, 7, 2), (5, 6, 2), (5, 7, 1), (6, 7, 2)];
    for &(a, b, count) in mesh.iter().chain(&rest) {
        t.connect(
            g[a],
            g[b],
            LinkKind::Nvlink {
                generation: 2,
                count,
            },
        );
    }
    t
}

/// Eight GPUs each joined to one NVSwitch fabric by `links` NVLinks of
/// `generation`. The fabric's several switch chips are one node: every GPU
/// spreads its links over all of them, so no pair of GPUs contends inside
/// the fabric, only on a GPU's own links.
fn nvswitch_box(t: &mut Topology, gpus: &[usize], generation: u8, links: u8) {
    let fabric = t.add_node(Node::new("NVSwitch", NodeKind::NvSwitch));
    for &g in gpus {
        t.connect(
            g,
            fabric,
            LinkKind::Nvlink {
                generation,
                count: links,
            },
        );
    }
}

/// DGX A100: 8 A100 SXM, 12 NVLink 3 links each to six NVSwitches
/// (300 GB/s per direction per GPU), PCIe 4.0 switches with two GPUs each,
/// two AMD EPYC sockets (NVIDIA DGX A100 system architecture whitepaper,
/// 2020).
pub(crate) fn dgx_a100() -> Topology {
    let mut t = Topology::new(
        "dgx-a100",
        "NVIDIA DGX A100: 8 A100 SXM on NVSwitch, 12 NVLink 3 links per GPU (300 GB/s per direction), PCIe 4.0 switches, two EPYC sockets",
    );
    let g = eight_gpu_chassis(&mut t, A100_HBM, 4, 2);
    nvswitch_box(&mut t, &g, 3, 12);
    t
}

/// DGX H100: 8 H100 SXM, 18 NVLink 4 links each to four NVSwitches
/// (450 GB/s per direction per GPU), PCIe 5.0 switches with two GPUs each,
/// two Xeon sockets (NVIDIA DGX H100 user guide and H100 whitepaper, 2022).
pub(crate) fn dgx_h100() -> Topology {
    let mut t = Topology::new(
        "dgx-h100",
        "NVIDIA DGX H100: 8 H100 SXM on NVSwitch, 18 NVLink 4 links per GPU (450 GB/s per direction), PCIe 5.0 switches, two Xeon sockets",
    );
    let g = eight_gpu_chassis(&mut t, H100_HBM, 5, 2);
    nvswitch_box(&mut t, &g, 4, 18);
    t
}

/// The 8-GPU partial NVLink mesh drawn in the seed article
/// (`seeds/001`): GPUs in a 2 × 4 ladder, rungs 0–1, 2–3, 4–5, 6–7, rails
/// down each side, and crossed diagonals in the top and bottom squares.
/// The drawing gives no link counts; we give every edge two NVLink 3 links
/// (50 GB/s per direction), so the picture's point — some pairs must hop
/// or fall back to PCIe — stands on its own.
pub(crate) fn seed_mesh() -> Topology {
    let mut t = Topology::new(
        "seed-8gpu-mesh",
        "the 8-GPU partial NVLink mesh of the seed article: a 2x4 ladder with crossed top and bottom squares, 2 NVLink 3 links per edge, PCIe 4.0 for the rest",
    );
    let g = eight_gpu_chassis(&mut t, A100_HBM, 4, 2);
    let edges = [
        (0, 1),
        (2, 3),
        (4, 5),
        (6, 7),
        (0, 2),
        (2, 4),
        (4, 6),
        (1, 3),
        (3, 5),
        (5, 7),
        (0, 3),
        (1, 2),
        (4, 7),
        (5, 6),
    ];
    for (a, b) in edges {
        t.connect(
            g[a],
            g[b],
            LinkKind::Nvlink {
                generation: 3,
                count: 2,
            },
        );
    }
    t
}
