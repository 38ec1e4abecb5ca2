//! Link kinds and their nominal rates.
//!
//! Every rate is the **raw per-direction signalling rate** of the link as
//! its specification states it, in GB/s (1e9 bytes per second). What a
//! transfer really gets after protocol overheads is the simulator's
//! business ([`crate::sim::cost`]), so a topology file says what the
//! hardware is, not what some model thinks of it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a directed link is made of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LinkKind {
    /// `count` NVLink lanes ("links" in NVIDIA's words) of one generation.
    Nvlink {
        /// NVLink generation, 1..=5.
        generation: u8,
        /// Links bundled between the two ends.
        count: u8,
    },
    /// A PCIe connection.
    Pcie {
        /// PCIe generation, 1..=6.
        generation: u8,
        /// Lanes, 1..=16.
        width: u8,
    },
    /// A CPU-to-CPU interconnect (Intel UPI/QPI, AMD xGMI/Infinity Fabric).
    CpuInterconnect,
    /// Threads of one process exchanging data through host memory.
    SharedMemory,
    /// A network port (InfiniBand, RoCE, Ethernet).
    Network,
}

impl LinkKind {
    /// The nominal per-direction rate in GB/s, where the kind fixes it.
    ///
    /// Sources:
    /// - NVLink per link and direction: 20 GB/s for NVLink 1 (P100, NVIDIA
    ///   Tesla P100 whitepaper, 2016), 25 GB/s for NVLink 2 (V100 whitepaper,
    ///   2017), 3 (A100 whitepaper, 2020: 12 links, 600 GB/s bidirectional)
    ///   and 4 (H100 whitepaper, 2022: 18 links, 900 GB/s bidirectional),
    ///   50 GB/s for NVLink 5 (Blackwell datasheet: 18 links, 1.8 TB/s).
    /// - PCIe x16 per direction after 128b/130b line coding (PCI Express
    ///   base specifications 3.0/4.0/5.0/6.0): 8, 16, 32, 64 GT/s per lane
    ///   give 0.985, 1.97, 3.94, 7.88 GB/s per lane; gen 1/2 use 8b/10b at
    ///   2.5/5 GT/s (0.25/0.5 GB/s per lane). Gen 6 (PAM4, FLIT) is taken
    ///   as 7.88 GB/s per lane before FLIT overhead.
    ///
    /// `CpuInterconnect`, `SharedMemory` and `Network` depend on the part,
    /// so their links always carry an explicit rate.
    pub fn nominal_bandwidth(&self) -> Option<f64> {
        match *self {
            LinkKind::Nvlink { generation, count } => {
                let per_link = match generation {
                    1 => 20.0,
                    2..=4 => 25.0,
                    5 => 50.0,
                    _ => return None,
                };
                Some(per_link * f64::from(count))
            }
            LinkKind::Pcie { generation, width } => {
                let per_lane = match generation {
                    1 => 0.25,
                    2 => 0.5,
                    3 => 0.985,
                    4 => 1.969,
                    5 => 3.938,
                    6 => 7.877,
                    _ => return None,
                };
                Some(per_lane * f64::from(width))
            }
            _ => None,
        }
    }

    /// The one-way latency one hop of this kind adds, in microseconds,
    /// where the kind fixes it.
    ///
    /// Sources: NVLink hop latency is under a microsecond; NCCL's tuning
    /// model (NVIDIA/nccl `src/graph/tuning.cc`, `hwLat`) charges 0.6 µs
    /// per NVLink hop for its low-latency protocol, and we use that. A PCIe
    /// hop through a switch or root port: about 1 µs, the figure NCCL's
    /// model uses for PCIe (`hwLat` PCI = 1.0 µs).
    pub fn nominal_latency_us(&self) -> Option<f64> {
        match self {
            LinkKind::Nvlink { .. } => Some(0.6),
            LinkKind::Pcie { .. } => Some(1.0),
            _ => None,
        }
    }

    /// Whether `nvidia-smi` would count this as an NVLink path.
    pub fn is_nvlink(&self) -> bool {
        matches!(self, LinkKind::Nvlink { .. })
    }

    /// Whether this is a PCIe link.
    pub fn is_pcie(&self) -> bool {
        matches!(self, LinkKind::Pcie { .. })
    }
}

impl fmt::Display for LinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkKind::Nvlink { generation, count } => write!(f, "NVLink{generation} x{count}"),
            LinkKind::Pcie { generation, width } => write!(f, "PCIe{generation} x{width}"),
            LinkKind::CpuInterconnect => f.write_str("CPU interconnect"),
            LinkKind::SharedMemory => f.write_str("shared memory"),
            LinkKind::Network => f.write_str("network"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nominal_rates_match_the_datasheets() {
        let nv = |generation, count| LinkKind::Nvlink { generation, count };
        let pcie = |generation, width| LinkKind::Pcie { generation, width };
        // A100: 12 links, 600 GB/s both directions together.
        assert_eq!(nv(3, 12).nominal_bandwidth(), Some(300.0));
        // H100: 18 links, 900 GB/s both directions together.
        assert_eq!(nv(4, 18).nominal_bandwidth(), Some(450.0));
        let gen4 = pcie(4, 16).nominal_bandwidth().unwrap();
        assert!((gen4 - 31.5).abs() < 0.1, "{gen4}");
        let gen5 = pcie(5, 16).nominal_bandwidth().unwrap();
        assert!((gen5 - 63.0).abs() < 0.1, "{gen5}");
        assert_eq!(nv(9, 1).nominal_bandwidth(), None);
        assert_eq!(LinkKind::SharedMemory.nominal_bandwidth(), None);
    }
}
