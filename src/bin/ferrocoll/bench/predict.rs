//! `bench --predict`: the simulator's time for each row on this host's
//! measured topology, next to the measured time — the calibration of the
//! cost model (docs/topology.md). The simulator runs the very plan the
//! executor runs: the same planner settings give the same plan.

use ferrocoll::comm::Planner;
use ferrocoll::cpu::CpuConfig;
use ferrocoll::topo::probe::host;
use ferrocoll::topo::probe::membw::MemoryBandwidth;
use ferrocoll::topo::sim::{self, SimOptions};
use ferrocoll::topo::{Topology, presets};
use ferrocoll::types::CallShape;
use ferrocoll::{Collective, DataType, ReduceOp};

/// Predicts rows the way the executor runs them.
pub(crate) struct Predictor {
    topology: Topology,
    n: u32,
}

impl Predictor {
    /// `swept` is the bench's own memory-bandwidth measurement, taken just
    /// before the sweep, which then replaces the start-up probe's: the
    /// prediction uses the bandwidth of the same run.
    pub(crate) fn new(n: u32, swept: Option<&MemoryBandwidth>) -> Predictor {
        let mut measured = *host::measured();
        if let Some(bw) = swept {
            measured.memory_gbps = bw.best;
        }
        Predictor {
            topology: presets::host(n, &measured),
            n,
        }
    }

    /// The predicted time of one out-of-place call of `size` bytes of
    /// `dtype` under `config`, µs.
    pub(crate) fn time_us(
        &self,
        config: &CpuConfig,
        collective: Collective,
        dtype: DataType,
        size: usize,
    ) -> Option<f64> {
        let blocks = collective.size_blocks(self.n) as usize;
        let shape = CallShape {
            collective,
            count: size / (blocks * dtype.size_bytes()),
            dtype,
            op: ReduceOp::Sum,
            in_place: false,
            purpose: Default::default(),
        };
        let planned = Planner::new(self.n, config.planner_settings())
            .plan(&shape)
            .ok()?;
        let p = sim::simulate_plan(&planned.plan, &self.topology, &SimOptions::default()).ok()?;
        Some(p.time_us)
    }
}
