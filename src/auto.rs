//! `auto` on the CPU executor, topology-aware: every call that forces no
//! algorithm is planned by [`ferrocoll_topo::select::Selector`] on this
//! host's measured topology ([`ferrocoll_topo::presets::host`]).
//!
//! The host is measured once per process (about a tenth of a second, on
//! first use), so every rank of every group in the process sees the same
//! topology and makes the same choice. `FERROCOLL_ALGO` still forces an
//! algorithm over the selector.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use ferrocoll_core::Collective;
use ferrocoll_core::choose::{Choice, Chooser, SharedChooser};
use ferrocoll_core::cpu::CpuConfig;
use ferrocoll_topo::presets;
use ferrocoll_topo::probe::host;
use ferrocoll_topo::select::{SelectOptions, Selector};

use crate::env::{EnvError, cpu_config_from_env};

/// A selector per world size, built on first use for the CPU host.
#[derive(Debug, Default)]
pub struct HostChooser {
    selectors: Mutex<HashMap<u32, Option<Arc<Selector>>>>,
}

impl HostChooser {
    fn selector(&self, world_size: u32) -> Option<Arc<Selector>> {
        let mut map = self.selectors.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(world_size)
            .or_insert_with(|| {
                let topology = presets::host(world_size, host::measured());
                match Selector::new(topology, world_size, SelectOptions::default()) {
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

impl Chooser for HostChooser {
    fn choose(&self, collective: Collective, world_size: u32, bytes: usize) -> Option<Choice> {
        let selector = self.selector(world_size)?;
        Chooser::choose(selector.as_ref(), collective, world_size, bytes)
    }
}

/// The process-wide host chooser.
pub fn host_chooser() -> SharedChooser {
    static CHOOSER: OnceLock<SharedChooser> = OnceLock::new();
    CHOOSER
        .get_or_init(|| SharedChooser(Arc::new(HostChooser::default())))
        .clone()
}

/// `base` with the topology-aware chooser plugged in and the
/// `FERROCOLL_*` overrides applied: what the `ferrocoll` tool runs with.
pub fn cpu_config(base: CpuConfig) -> Result<CpuConfig, EnvError> {
    cpu_config_from_env(CpuConfig {
        chooser: Some(host_chooser()),
        ..base
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_runs_what_the_host_selector_chooses() {
        let config = cpu_config(CpuConfig::default()).unwrap();
        let chooser = config.chooser.clone().unwrap();
        let choice = chooser.0.choose(Collective::AllReduce, 3, 1 << 20).unwrap();
        assert!(choice.why.contains("selected on `host`"), "{}", choice.why);
        let again = chooser.0.choose(Collective::AllReduce, 3, 1 << 20).unwrap();
        assert_eq!(choice, again);
        // And the executor runs it correctly.
        let out = ferrocoll_core::cpu::run(3, &config, |comm| {
            use ferrocoll_core::comm::Communicator;
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
