//! `bench --backend cpu`: ranks as threads of this process.

use std::sync::Arc;

use ferrocoll::Verified;
use ferrocoll::cpu::CpuConfig;
use ferrocoll::topo::probe::membw::MemoryBandwidth;

use super::BenchArgs;
use super::row::Row;
use super::run::Cpu;
use super::setup::custom_schedule;
use super::target::{Sweep, Target, host_bandwidth};

/// The CPU executor on threads, with the schedule file the run executes.
pub(crate) struct Threads {
    custom: Option<Arc<Verified>>,
}

/// Open the thread ranks.
pub(crate) fn open(args: &mut BenchArgs) -> Result<Box<dyn Target>, String> {
    let custom = custom_schedule(&args.algo, args.ranks)?;
    Ok(Box::new(Threads { custom }))
}

impl Target for Threads {
    fn custom(&self) -> Option<Arc<Verified>> {
        self.custom.clone()
    }

    fn describe(&self, _args: &BenchArgs, config: &CpuConfig, algorithm: &str) -> Vec<String> {
        let s = config.planner_settings();
        vec![format!(
            "# executor: cpu threads, max chunk {} B, {} channel(s), {} slots per link, timeout {:?}, algorithm {algorithm}",
            s.max_chunk_bytes, s.channels, s.slots_per_link, config.planning.timeout,
        )]
    }

    fn memory_bandwidth(&self) -> Result<MemoryBandwidth, String> {
        Ok(host_bandwidth())
    }

    fn run_section(&self, sweep: &Sweep) -> Result<Vec<Row>, String> {
        let backend = Cpu {
            n: sweep.args.ranks,
            config: sweep.config,
        };
        sweep.on(&backend)
    }
}
