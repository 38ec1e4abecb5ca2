//! What `bench` runs on, as one interface: each backend — threads, a
//! process group, the CUDA executor or NCCL, on this process's devices or
//! as one rank of a launched group — opens to a [`Target`] (which one is
//! `backend.rs`'s table), and the sweep asks it only for what differs.

use std::sync::Arc;

use ferrocoll::Verified;
use ferrocoll::cpu::CpuConfig;
use ferrocoll::topo::probe::membw::{self, MemoryBandwidth};

use super::row::Row;
use super::run::{self, Backend};
use super::{BenchArgs, Section};

/// One section to time, with everything the sweep knows about it.
pub(crate) struct Sweep<'a> {
    pub args: &'a BenchArgs,
    /// The section's settings.
    pub config: &'a CpuConfig,
    pub section: &'a Section,
    pub sizes: &'a [usize],
    pub progress: Option<&'a indicatif::ProgressBar>,
}

impl Sweep<'_> {
    /// Time and check the section on `backend`.
    pub(crate) fn on<B: Backend>(&self, backend: &B) -> Result<Vec<Row>, String> {
        run::section(self.args, backend, self.section, self.sizes, self.progress)
    }
}

/// An opened backend.
pub(crate) trait Target {
    /// The schedule file the run executes, if any.
    fn custom(&self) -> Option<Arc<Verified>> {
        None
    }

    /// Whether this process prints the table (rank 0 of a process group).
    fn prints(&self) -> bool {
        true
    }

    /// The header's lines about the executor; `algorithm` as the run
    /// names it.
    fn describe(&self, args: &BenchArgs, config: &CpuConfig, algorithm: &str) -> Vec<String>;

    /// The memory bandwidth that bounds the backend's busbw.
    fn memory_bandwidth(&self) -> Result<MemoryBandwidth, String>;

    /// Time and check one section.
    fn run_section(&self, sweep: &Sweep) -> Result<Vec<Row>, String>;

    /// With `--compare nccl`: the same section on NCCL, its rows labelled.
    fn compare(&self, _sweep: &Sweep) -> Result<Option<Vec<Row>>, String> {
        Ok(None)
    }
}

/// This host's memory bandwidth, every core copying: the ceiling of the
/// host executors.
pub(crate) fn host_bandwidth() -> MemoryBandwidth {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    membw::measure(membw::ARRAY_BYTES, cores, 5)
}

/// The header's line for the GPU backends, which time on the device.
pub(crate) fn device_timing(args: &BenchArgs) -> String {
    format!(
        "# executor: {}, timed on the device: -n calls enqueued back to back per rank stream between CUDA events, one wait",
        args.backend
    )
}
