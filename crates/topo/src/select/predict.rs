//! Predicting the selector's candidates: each simulated with its chunk
//! and protocol, every candidate at one size by one model.

use ferrocoll_core::Collective;
use ferrocoll_core::select::Protocol;

use super::{Candidate, TopologySelector};
use crate::error::TopologyError;
use crate::sim::{self, Prediction, SimOptions};

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

    fn predict_with(
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
    /// comparison across models would be decided by the model). With it,
    /// the detailed engine's estimated work over all of them (0 when the
    /// model was given).
    fn fidelity_at(
        &self,
        candidates: &[Candidate],
        collective: Collective,
        size: usize,
    ) -> Result<(sim::Fidelity, u64), TopologyError> {
        if self.options.fidelity != sim::Fidelity::Auto {
            return Ok((self.options.fidelity, 0));
        }
        let mut total = 0u64;
        for c in candidates {
            let compiler = self.compiler(c, collective)?;
            let options = self.sim_options(c, collective, sim::Fidelity::Auto);
            let work = sim::detailed_work(&compiler, &self.topology, size, &options)?;
            if work > sim::DETAILED_MAX_WORK {
                return Ok((sim::Fidelity::Steady, total));
            }
            total = total.saturating_add(work);
        }
        Ok((sim::Fidelity::Detailed, total))
    }

    /// Every candidate with its prediction, in candidate order. On
    /// `Auto`, where the detailed runs of all of them would cost more
    /// than [`SCREEN_MIN_WORK`], the steady estimate screens them first
    /// (see docs/topology.md): only the candidates that could be
    /// their family's best come back, each from the detailed engine.
    pub fn evaluate(
        &self,
        collective: Collective,
        size: usize,
    ) -> Result<Vec<(Candidate, Prediction)>, TopologyError> {
        let candidates = self.candidates_at(collective, size);
        let (fidelity, work) = self.fidelity_at(&candidates, collective, size)?;
        if fidelity == sim::Fidelity::Detailed && work > SCREEN_MIN_WORK {
            return self.screened(candidates, collective, size);
        }
        self.each(candidates, collective, size, fidelity)
    }

    /// Every candidate predicted by `fidelity`, in candidate order.
    pub(super) fn each(
        &self,
        candidates: Vec<Candidate>,
        collective: Collective,
        size: usize,
        fidelity: sim::Fidelity,
    ) -> Result<Vec<(Candidate, Prediction)>, TopologyError> {
        candidates
            .into_iter()
            .map(|c| {
                let p = self.predict_with(&c, collective, size, fidelity)?;
                Ok((c, p))
            })
            .collect()
    }

    /// The candidates of each family that the steady estimate puts within
    /// [`SCREEN_MARGIN`] of the family's best (the [`SCREEN_KEEP`] best of
    /// them, those before the best in candidate order, and every one
    /// within twice the tie margin), each then simulated in detail; the
    /// rest are left out. The
    /// steady estimate ranks a family's variants (channels, chunk) much as
    /// the detailed engine does but can misjudge one family against
    /// another (trees at mid sizes), so families are screened apart and
    /// compared only on detailed runs.
    pub(crate) fn screened(
        &self,
        candidates: Vec<Candidate>,
        collective: Collective,
        size: usize,
    ) -> Result<Vec<(Candidate, Prediction)>, TopologyError> {
        let steady: Vec<f64> = candidates
            .iter()
            .map(|c| {
                Ok(self
                    .predict_with(c, collective, size, sim::Fidelity::Steady)?
                    .time_us)
            })
            .collect::<Result<_, TopologyError>>()?;
        let mut keep = vec![false; candidates.len()];
        let mut families: Vec<&str> = candidates.iter().map(Candidate::family).collect();
        families.sort_unstable();
        families.dedup();
        for family in families {
            let mut members: Vec<usize> = (0..candidates.len())
                .filter(|&i| candidates[i].family() == family)
                .collect();
            // A NaN estimate sorts last: it must not stand for the best.
            let key = |i: usize| {
                if steady[i].is_nan() {
                    f64::INFINITY
                } else {
                    steady[i]
                }
            };
            members.sort_by(|&a, &b| key(a).total_cmp(&key(b)));
            let first = members[0];
            keep[first] = true;
            let best = steady[first];
            // The verdict prefers the first candidate, in candidate order,
            // within the tie margin of the fastest: every near-tie stays,
            // however many, and so does every candidate the family's best
            // comes after that is within the screen's margin.
            let tied = best * (1.0 + 2.0 * self.options.tie_margin);
            let near = best * (1.0 + SCREEN_MARGIN);
            for (k, &i) in members.iter().enumerate() {
                keep[i] |=
                    steady[i] <= tied || (steady[i] <= near && (k < SCREEN_KEEP || i < first));
            }
        }
        let kept: Vec<Candidate> = candidates
            .into_iter()
            .zip(keep)
            .filter_map(|(c, k)| k.then_some(c))
            .collect();
        tracing::debug!(
            "{collective} {size} B: {} of {} candidates past the steady screen",
            kept.len(),
            steady.len()
        );
        self.each(kept, collective, size, sim::Fidelity::Detailed)
    }
}

/// Above this much estimated detailed work over all candidates (about a
/// fifth of a second of the engine on one core), [`evaluate`] screens
/// them with the steady estimate first.
///
/// [`evaluate`]: TopologySelector::evaluate
pub const SCREEN_MIN_WORK: u64 = 20_000_000;

/// How far above its family's best steady estimate a candidate may be
/// and still be simulated in detail.
pub const SCREEN_MARGIN: f64 = 0.15;

/// At most this many candidates of one family are simulated in detail.
pub const SCREEN_KEEP: usize = 4;
