//! The cost model's constants: what a transfer really gets out of a link,
//! and what a step costs beyond moving its bytes.
//!
//! Every number says where it comes from. None was tuned to make a
//! prediction match a published result.

use crate::graph::{LinkKind, NodeKind};

/// The knobs of the cost model. [`CostModel::default`] holds the values
/// documented on each constant below.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// Fraction of an NVLink's raw rate that carries payload.
    pub nvlink_efficiency: f64,
    /// Fraction of a PCIe link's raw rate that carries payload.
    pub pcie_efficiency: f64,
    /// Fraction of a CPU interconnect's stated rate that carries payload.
    pub cpu_interconnect_efficiency: f64,
    /// Fraction of a network port's rate that carries payload.
    pub network_efficiency: f64,
    /// Fixed cost of one collective call on a GPU, µs.
    pub gpu_call_us: f64,
    /// Cost of one step on a GPU beyond the wire, µs.
    pub gpu_step_us: f64,
    /// Fixed cost of one collective call on the CPU executor, µs.
    pub thread_call_us: f64,
    /// Cost of one step on the CPU executor beyond its memory traffic, µs.
    pub thread_step_us: f64,
}

/// NVLink payload share: NCCL models an NVLink 3 link at 20 of its 25 GB/s
/// and an NVLink 4 link at 20.6 (NVIDIA/nccl `src/graph/topo.h`), and its
/// maintainers put the application-visible rate at about 80 % of the line
/// rate because of packet headers and flow control (NVIDIA/nccl issue
/// 1054, NVIDIA/nccl-tests issue 212).
pub const NVLINK_EFFICIENCY: f64 = 0.80;

/// PCIe payload share: NCCL models an x16 link as width × speed / 80, 24
/// GB/s for gen 4 against 31.5 raw (NVIDIA/nccl `src/graph/topo.cc`); the
/// gap is TLP headers and framing (24 bytes per 256-byte payload) plus
/// flow-control and acknowledgement traffic.
pub const PCIE_EFFICIENCY: f64 = 24.0 / 31.5;

/// Our UPI/xGMI figures are already payload rates (presets/pcie.rs).
pub const CPU_INTERCONNECT_EFFICIENCY: f64 = 1.0;

/// A network port: Ethernet/InfiniBand headers on 4 KiB MTU frames cost
/// a few percent; NCCL models a 100 Gb/s port at 12 of its 12.5 GB/s
/// (`src/graph/topo.h`, NET_BW).
pub const NETWORK_EFFICIENCY: f64 = 12.0 / 12.5;

/// Launch and set-up of one GPU collective: NCCL's model charges a base
/// latency of 8.4 µs for a ring with its Simple protocol
/// (NVIDIA/nccl `src/graph/tuning.cc`, `baseLat`).
pub const GPU_CALL_US: f64 = 8.4;

/// Per-step synchronisation on a GPU (flag write, remote poll, fence):
/// NCCL charges 3.4 µs per Simple-protocol ring step over NVLink
/// (`tuning.cc`, `hwLat`); 0.6 µs of that is the wire, which our links
/// carry themselves, so a step adds 2.8 µs.
pub const GPU_STEP_US: f64 = 2.8;

/// The CPU executor's fixed cost per call (checking the call's signature
/// across ranks and finding the plan), µs. Measured: the 4 KiB rows of
/// `ferrocoll bench` at 2 ranks take about 3 µs for a two-step schedule
/// (docs/benchmarks.md), about 1 µs of which is the two hand-offs.
pub const THREAD_CALL_US: f64 = 1.0;

/// The CPU executor's cost per step beyond memory traffic (slot
/// bookkeeping, posting and taking messages), µs; the same measurement.
pub const THREAD_STEP_US: f64 = 0.5;

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            nvlink_efficiency: NVLINK_EFFICIENCY,
            pcie_efficiency: PCIE_EFFICIENCY,
            cpu_interconnect_efficiency: CPU_INTERCONNECT_EFFICIENCY,
            network_efficiency: NETWORK_EFFICIENCY,
            gpu_call_us: GPU_CALL_US,
            gpu_step_us: GPU_STEP_US,
            thread_call_us: THREAD_CALL_US,
            thread_step_us: THREAD_STEP_US,
        }
    }
}

impl CostModel {
    /// The payload rate a link of `kind` with raw rate `bandwidth` gives.
    pub fn effective_bandwidth(&self, kind: &LinkKind, bandwidth: f64) -> f64 {
        bandwidth
            * match kind {
                LinkKind::Nvlink { .. } => self.nvlink_efficiency,
                LinkKind::Pcie { .. } => self.pcie_efficiency,
                LinkKind::CpuInterconnect => self.cpu_interconnect_efficiency,
                LinkKind::Network => self.network_efficiency,
                LinkKind::SharedMemory => 1.0,
            }
    }

    /// The fixed cost of a call and of a step on a device of `kind`, µs.
    pub fn overheads(&self, kind: NodeKind) -> (f64, f64) {
        match kind {
            NodeKind::Thread => (self.thread_call_us, self.thread_step_us),
            _ => (self.gpu_call_us, self.gpu_step_us),
        }
    }
}
