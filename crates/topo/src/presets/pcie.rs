//! Machines whose GPUs talk over PCIe only: servers with PCIe switches and
//! consumer boxes whose cards sit on the CPU's own root ports.

use crate::graph::{LinkKind, Node, NodeKind, Topology};

/// Host memory of a server socket: 8 channels of DDR4-3200 give
/// 8 × 25.6 = 204.8 GB/s (JEDEC DDR4-3200: 3200 MT/s × 8 bytes per channel).
pub(crate) const SERVER_DRAM_GBPS: f64 = 204.8;

/// A desktop's host memory: 2 channels of DDR5-5600 give 2 × 44.8 =
/// 89.6 GB/s (JEDEC DDR5-5600: 5600 MT/s × 8 bytes per channel).
const DESKTOP_DRAM_GBPS: f64 = 89.6;

/// The socket-to-socket link of a two-socket server. Intel Xeon Scalable
/// parts have 2–4 UPI links of 10.4–16 GT/s; at 16 GT/s a link moves about
/// 32 GB/s per direction (2 bytes per transfer, Intel's UPI 2.0 figures),
/// and we count two links: 64 GB/s.
pub(crate) const UPI_GBPS: f64 = 64.0;
/// One socket-to-socket hop, µs: a remote memory access costs a few
/// hundred ns more than a local one; a PCIe transaction crossing sockets
/// is charged the same 1 µs as a PCIe hop.
pub(crate) const UPI_LATENCY_US: f64 = 1.0;

/// The shape of a PCIe server.
pub(crate) struct PcieBox {
    pub generation: u8,
    pub gpus: usize,
    pub numa_nodes: usize,
    /// GPUs behind each PCIe switch; 0 puts every GPU on a CPU root port.
    pub gpus_per_switch: usize,
    pub p2p: bool,
    pub dram_gbps: f64,
}

impl PcieBox {
    pub(crate) fn build(&self, name: &str, description: &str) -> Topology {
        let mut t = Topology::new(name, description);
        let link = LinkKind::Pcie {
            generation: self.generation,
            width: 16,
        };
        let gpus: Vec<usize> = (0..self.gpus)
            .map(|i| {
                let numa = (i * self.numa_nodes / self.gpus) as u32;
                t.add_node(Node::new(format!("GPU{i}"), NodeKind::Gpu).numa(numa))
            })
            .collect();
        let cpus: Vec<usize> = (0..self.numa_nodes)
            .map(|c| {
                t.add_node(
                    Node::new(format!("CPU{c}"), NodeKind::Cpu)
                        .numa(c as u32)
                        .memory_bandwidth(self.dram_gbps),
                )
            })
            .collect();
        for pair in cpus.windows(2) {
            t.connect_with(
                pair[0],
                pair[1],
                LinkKind::CpuInterconnect,
                UPI_GBPS,
                UPI_LATENCY_US,
            );
        }
        let cpu_of = |i: usize| cpus[i * self.numa_nodes / self.gpus];
        if self.gpus_per_switch == 0 {
            for (i, &g) in gpus.iter().enumerate() {
                t.connect(g, cpu_of(i), link.clone());
            }
        } else {
            for (s, group) in gpus.chunks(self.gpus_per_switch).enumerate() {
                let first = s * self.gpus_per_switch;
                let sw = t.add_node(
                    Node::new(format!("PLX{s}"), NodeKind::PcieSwitch)
                        .numa(t.nodes[group[0]].numa.unwrap_or(0)),
                );
                t.connect(sw, cpu_of(first), link.clone());
                for &g in group {
                    t.connect(g, sw, link.clone());
                }
            }
        }
        if !self.p2p {
            for (i, &a) in gpus.iter().enumerate() {
                for &b in &gpus[i + 1..] {
                    t.block_p2p(a, b);
                }
            }
        }
        t
    }
}

/// A consumer box: `gpus` cards on PCIe 4.0 x16 root ports of one desktop
/// CPU, peer-to-peer off (GeForce drivers do not enable it).
pub(crate) fn consumer_pcie(gpus: usize) -> Topology {
    PcieBox {
        generation: 4,
        gpus,
        numa_nodes: 1,
        gpus_per_switch: if gpus > 4 { 4 } else { 0 },
        p2p: false,
        dram_gbps: DESKTOP_DRAM_GBPS,
    }
    .build(
        &format!("consumer-{gpus}gpu-pcie4"),
        &format!(
            "{gpus} consumer GPUs (RTX 4090 class) on PCIe 4.0 x16, one CPU, peer-to-peer off: \
             every transfer is staged in host memory"
        ),
    )
}

/// Two consumer GPUs with a 2-link NVLink bridge, and PCIe 3.0 to the CPU.
/// Turing's bridge (RTX 2080 Ti, Quadro RTX 6000) carries two NVLink 2
/// links, 100 GB/s both directions together (NVIDIA Turing architecture
/// whitepaper, 2018).
pub(crate) fn consumer_nvlink_bridge() -> Topology {
    let mut t = PcieBox {
        generation: 3,
        gpus: 2,
        numa_nodes: 1,
        gpus_per_switch: 0,
        p2p: true,
        dram_gbps: DESKTOP_DRAM_GBPS,
    }
    .build(
        "consumer-2gpu-nvlink-bridge",
        "two Turing GPUs joined by a 2-link NVLink 2 bridge (50 GB/s per direction), PCIe 3.0 x16 to one CPU",
    );
    t.connect(
        0,
        1,
        LinkKind::Nvlink {
            generation: 2,
            count: 2,
        },
    );
    t
}
