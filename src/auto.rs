//! `auto` on the CPU executor, topology-aware: every call that forces no
//! algorithm is selected by a [`TopologySelector`] on this host's measured
//! topology ([`ferrocoll_topo::presets::host`]).
//!
//! The host is measured once per process (about a tenth of a second, on
//! first use), so every rank of every group in the process sees the same
//! topology and makes the same choice. `FERROCOLL_ALGO` still forces an
//! algorithm over the selector.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use ferrocoll_core::Collective;
use ferrocoll_core::cpu::CpuConfig;
use ferrocoll_core::select::{Selection, Selector, SharedSelector};
use ferrocoll_topo::presets;
use ferrocoll_topo::probe::host;
use ferrocoll_topo::select::{SelectOptions, TopologySelector};

use crate::comm::Planning;
use crate::env::{EnvError, cpu_config_from_env};

/// A selector per world size, built on first use for the CPU host.
#[derive(Debug, Default)]
pub struct HostSelector {
    selectors: Mutex<HashMap<u32, Option<Arc<TopologySelector>>>>,
}

impl HostSelector {
    fn selector(&self, world_size: u32) -> Option<Arc<TopologySelector>> {
        let mut map = self.selectors.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(world_size)
            .or_insert_with(|| {
                let topology = presets::host(world_size, host::measured());
                match TopologySelector::new(topology, world_size, SelectOptions::default()) {
                    Ok(s) => Some(Arc::new(s)),
                    Err(e) => {
                        tracing::warn!("no host selector for {world_size} ranks: {e}");
                        None
                    }
                }
            })
            .clone()
    }
}

impl Selector for HostSelector {
    fn select(&self, collective: Collective, world_size: u32, bytes: usize) -> Option<Selection> {
        let selector = self.selector(world_size)?;
        selector.select(collective, world_size, bytes)
    }
}

/// The process-wide host selector.
pub fn host_selector() -> SharedSelector {
    static SELECTOR: OnceLock<SharedSelector> = OnceLock::new();
    SELECTOR
        .get_or_init(|| SharedSelector(Arc::new(HostSelector::default())))
        .clone()
}

/// `base` with the topology-aware selector plugged in and the
/// `FERROCOLL_*` overrides applied: what the `ferrocoll` tool runs with.
pub fn cpu_config(base: CpuConfig) -> Result<CpuConfig, EnvError> {
    cpu_config_from_env(CpuConfig {
        planning: Planning {
            selector: Some(host_selector()),
            ..base.planning
        },
        ..base
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_runs_what_the_host_selector_chooses() {
        let config = cpu_config(CpuConfig::default()).unwrap();
        let selector = config.planning.selector.clone().unwrap();
        let selection = selector
            .0
            .select(Collective::AllReduce, 3, 1 << 20)
            .unwrap();
        assert!(
            selection.why.contains("selected on `host`"),
            "{}",
            selection.why
        );
        let again = selector
            .0
            .select(Collective::AllReduce, 3, 1 << 20)
            .unwrap();
        assert_eq!(selection, again);
        // And the executor runs it correctly.
        let out = ferrocoll_core::cpu::run(3, &config, |comm| {
            use ferrocoll_core::comm::{Communicator, CommunicatorExt};
            let input = vec![comm.rank() as f32 + 1.0; 1000];
            let mut output = vec![0.0f32; 1000];
            comm.all_reduce(&input, &mut output, ferrocoll_core::ReduceOp::Sum)?;
            Ok(output[999])
        });
        for r in out {
            assert_eq!(r.unwrap(), 6.0);
        }
    }
}
