//! How an `auto` call finds its algorithm: a [`Chooser`] the caller plugs
//! in (ferrocoll-topo's selector simulates the candidates on the machine's
//! topology), else each executor's own fixed rule.
//!
//! Core knows no topology: this trait is the seam. A chooser must be
//! deterministic — every rank of a group asks it the same question and must
//! get the same answer, or the ranks would run different schedules.

use std::fmt;
use std::sync::Arc;

use crate::algorithms::{Algorithm, AlgorithmParams};
use crate::types::Collective;

/// What a chooser decided for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Its channels, ring orders and tree order.
    pub params: AlgorithmParams,
    /// The pipelining grain for this call, if the chooser has a view.
    pub max_chunk_bytes: Option<usize>,
    /// Why, for the debug log line: the prediction and the runner-up.
    pub why: String,
}

/// Picks the algorithm of calls that do not force one.
pub trait Chooser: Send + Sync + fmt::Debug {
    /// The plan for `collective` on `world_size` ranks moving `bytes`
    /// (nccl-tests' size), or `None` to leave it to the executor's rule.
    fn choose(&self, collective: Collective, world_size: u32, bytes: usize) -> Option<Choice>;
}

/// A shared chooser in a configuration; two are equal when they are the
/// same object.
#[derive(Clone)]
pub struct SharedChooser(pub Arc<dyn Chooser>);

impl PartialEq for SharedChooser {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}

impl Eq for SharedChooser {}

impl fmt::Debug for SharedChooser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The plan of one `auto`-or-forced call, as every host executor decides
/// it: a forced algorithm wins, then the chooser, then `rule` (the
/// executor's fixed rule). Forced and rule-picked algorithms run on
/// `channels` channels (halving-doubling has exactly one).
pub fn decide(
    forced: Option<Algorithm>,
    chooser: Option<&SharedChooser>,
    channels: u32,
    collective: Collective,
    world_size: u32,
    bytes: usize,
    rule: impl FnOnce() -> (Algorithm, &'static str),
) -> Choice {
    let fixed = |algorithm: Algorithm| AlgorithmParams {
        channels: if algorithm == Algorithm::HalvingDoubling {
            1
        } else {
            channels
        },
        ..AlgorithmParams::default()
    };
    if let Some(algorithm) = forced {
        return Choice {
            algorithm,
            params: fixed(algorithm),
            max_chunk_bytes: None,
            why: "forced by configuration".to_owned(),
        };
    }
    if let Some(choice) = chooser.and_then(|c| c.0.choose(collective, world_size, bytes)) {
        return choice;
    }
    let (algorithm, why) = rule();
    Choice {
        algorithm,
        params: fixed(algorithm),
        max_chunk_bytes: None,
        why: why.to_owned(),
    }
}
