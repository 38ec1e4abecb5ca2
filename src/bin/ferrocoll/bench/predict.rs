//! `bench --predict`: the simulator's time for each row on this host's
//! measured topology, next to the measured time — the calibration of the
//! cost model (docs/topology.md).

use ferrocoll::cpu::CpuConfig;
use ferrocoll::topo::presets;
use ferrocoll::topo::probe::host;
use ferrocoll::topo::probe::membw::MemoryBandwidth;
use ferrocoll::topo::select::{Candidate, SelectOptions, Selector};
use ferrocoll::topo::sim::{self, SimOptions};
use ferrocoll::{Algorithm, AlgorithmParams, Collective};

use super::Section;

/// Predicts rows the way the executor will run them.
pub(crate) struct Predictor {
    selector: Selector,
    config: CpuConfig,
}

impl Predictor {
    /// `swept` is the bench's own memory-bandwidth measurement, taken just
    /// before the sweep, which then replaces the start-up probe's: the
    /// prediction uses the bandwidth of the same run.
    pub(crate) fn new(
        n: u32,
        config: &CpuConfig,
        swept: Option<&MemoryBandwidth>,
    ) -> Result<Predictor, String> {
        let mut measured = *host::measured();
        if let Some(bw) = swept {
            measured.memory_gbps = bw.best;
        }
        let topology = presets::host(n, &measured);
        let selector =
            Selector::new(topology, n, SelectOptions::default()).map_err(|e| e.to_string())?;
        Ok(Predictor {
            selector,
            config: config.clone(),
        })
    }

    /// The predicted time of one out-of-place call, µs.
    pub(crate) fn time_us(
        &self,
        section: &Section,
        collective: Collective,
        size: usize,
    ) -> Option<f64> {
        let prediction = if section.custom {
            let schedule = self.config.schedule.as_ref()?.schedule().clone();
            let options = SimOptions {
                max_chunk_bytes: Some(self.config.max_chunk_bytes),
                element_size: section.dtype.size_bytes(),
                ..SimOptions::default()
            };
            sim::simulate(&schedule, self.selector.topology(), size, &options).ok()?
        } else if let Some(algorithm) = section.algorithm.or(self.config.algorithm) {
            let candidate = Candidate {
                algorithm,
                params: AlgorithmParams {
                    channels: if algorithm == Algorithm::HalvingDoubling {
                        1
                    } else {
                        self.config.channels
                    },
                    ..AlgorithmParams::default()
                },
                max_chunk_bytes: self.config.max_chunk_bytes,
                multiplier: 1,
            };
            self.selector.predict(&candidate, collective, size).ok()?
        } else {
            self.selector
                .choose(collective, size)
                .ok()?
                .prediction
                .clone()
        };
        Some(prediction.time_us)
    }
}
