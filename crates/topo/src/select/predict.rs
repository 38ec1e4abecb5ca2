//! Predicting the selector's candidates: each simulated with its chunk
//! and protocol, every candidate at one size by one model.

use std::collections::HashMap;
use std::sync::Arc;

use ferrocoll_core::Collective;
use ferrocoll_core::plan::{Compiler, Layout};
use ferrocoll_core::select::Protocol;

use super::{Candidate, TopologySelector};
use crate::error::TopologyError;
use crate::sim::{self, Prediction, SimOptions};

/// What makes two candidates' plans at one size the same: the schedule's
/// compiler (by address), the protocol and the call's layout.
type PlanKey = (usize, Option<Protocol>, Layout);

impl TopologySelector {
    /// Simulate one candidate.
    pub fn predict(
        &self,
        candidate: &Candidate,
        collective: Collective,
        size: usize,
    ) -> Result<Prediction, TopologyError> {
        self.predict_with(candidate, collective, size, self.options.fidelity)
    }

    /// The simulator's options for `candidate` at `fidelity`.
    fn sim_options(
        &self,
        candidate: &Candidate,
        collective: Collective,
        fidelity: sim::Fidelity,
    ) -> SimOptions {
        let cost = match candidate.protocol {
            Some(Protocol::LowLatency) => {
                let reduces = matches!(
                    collective,
                    Collective::AllReduce | Collective::Reduce { .. }
                );
                self.options.cost.low_latency(reduces)
            }
            _ => self.options.cost.clone(),
        };
        SimOptions {
            max_chunk_bytes: Some(candidate.max_chunk_bytes),
            slots_per_link: self.options.slots_per_link,
            in_place: false,
            dtype: self.options.dtype,
            cost,
            placement: Some(self.devices.clone()),
            fidelity,
        }
    }

    pub(super) fn predict_with(
        &self,
        candidate: &Candidate,
        collective: Collective,
        size: usize,
        fidelity: sim::Fidelity,
    ) -> Result<Prediction, TopologyError> {
        let compiler = self.compiler(candidate, collective)?;
        let options = self.sim_options(candidate, collective, fidelity);
        sim::simulate(&compiler, &self.topology, size, &options)
    }

    /// One model for every candidate at `size`: on `Auto`, the detailed
    /// engine where it is cheap for all of them, else the steady estimate
    /// for all (the two differ by up to a few tenths on trees, so a
    /// comparison across models would be decided by the model).
    pub(super) fn fidelity_at(
        &self,
        candidates: &[Candidate],
        collective: Collective,
        size: usize,
    ) -> Result<sim::Fidelity, TopologyError> {
        if self.options.fidelity != sim::Fidelity::Auto {
            return Ok(self.options.fidelity);
        }
        for c in candidates {
            let compiler = self.compiler(c, collective)?;
            let options = self.sim_options(c, collective, sim::Fidelity::Auto);
            if sim::model_for(&compiler, &self.topology, size, &options)? == sim::Fidelity::Steady {
                return Ok(sim::Fidelity::Steady);
            }
        }
        Ok(sim::Fidelity::Detailed)
    }

    /// Every candidate with its prediction, in candidate order.
    ///
    /// Candidates that differ only in their chunk size often cut the call
    /// alike (a call smaller than every chunk, a step's slice below
    /// each): those compile to the same plan, which is simulated once.
    pub fn evaluate(
        &self,
        collective: Collective,
        size: usize,
    ) -> Result<Vec<(Candidate, Prediction)>, TopologyError> {
        let candidates = self.candidates_at(collective, size);
        let fidelity = self.fidelity_at(&candidates, collective, size)?;
        // Keyed by the compiler's address, with the compiler kept alive
        // beside its answer so no other compiler can take that address
        // while the map lives.
        let mut simulated: HashMap<PlanKey, (Arc<Compiler>, Prediction)> = HashMap::new();
        candidates
            .into_iter()
            .map(|c| {
                let compiler = self.compiler(&c, collective)?;
                let options = self.sim_options(&c, collective, fidelity);
                let layout = sim::layout_of(&compiler, &self.topology, size, &options)?;
                let key = (Arc::as_ptr(&compiler) as usize, c.protocol, layout);
                let p = match simulated.get(&key) {
                    Some((_, p)) => p.clone(),
                    None => {
                        let p = sim::simulate(&compiler, &self.topology, size, &options)?;
                        simulated.insert(key, (compiler, p.clone()));
                        p
                    }
                };
                Ok((c, p))
            })
            .collect()
    }
}
