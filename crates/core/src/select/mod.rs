//! How a call's algorithm is selected: a forced algorithm wins, then a
//! [`Selector`] the caller plugs in (ferrocoll-topo's simulates the
//! candidates on the machine's topology), then the executor's fixed
//! [`Rule`]. "auto" — on the command line, in `FERROCOLL_ALGO` — means
//! "force nothing": let the selector, then the rule, decide.
//!
//! Core knows no topology: [`Selector`] is the seam. A selector must be
//! deterministic — every rank of a group asks it the same question and must
//! get the same answer, or the ranks would run different schedules (the
//! plan hash would catch it, as a mismatch).

use std::fmt;
use std::sync::Arc;

use crate::algorithms::{Algorithm, AlgorithmParams};
use crate::types::{Collective, CollectiveKind};
use crate::verify::Verified;

mod filter;
mod proto;

pub use filter::{AlgoFilter, Allowed};
pub use proto::ProtoFilter;

/// The schedule a selection runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// A built-in generator.
    Builtin {
        /// The algorithm.
        algorithm: Algorithm,
        /// Its channels, ring orders and tree order.
        params: AlgorithmParams,
    },
    /// A schedule the selector synthesized for its topology (a tree
    /// packing, a hierarchical all-reduce), already proven. Planners cache
    /// its compiled form by its content and what it was proven for.
    Synthesized(Arc<Verified>),
}

impl Choice {
    /// The built-in algorithm, if that is what runs.
    pub fn algorithm(&self) -> Option<Algorithm> {
        match self {
            Choice::Builtin { algorithm, .. } => Some(*algorithm),
            Choice::Synthesized(_) => None,
        }
    }

    /// The channels it runs on.
    pub fn channels(&self) -> u32 {
        match self {
            Choice::Builtin { params, .. } => params.channels,
            Choice::Synthesized(v) => v.schedule().channel_count() as u32,
        }
    }

    /// The algorithm's name, or the synthesized schedule's.
    pub fn name(&self) -> &str {
        match self {
            Choice::Builtin { algorithm, .. } => algorithm.name(),
            Choice::Synthesized(v) => &v.schedule().name,
        }
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// How a device executor moves a call's messages: what the selector
/// chooses and what the CUDA executor's programs carry (the values are
/// the kernel's `FC_SIMPLE` and `FC_LL`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// In bulk: a slot's worth of data, then a flag announcing it (full
    /// bandwidth, a flag round trip per message).
    Simple = 0,
    /// With the flag in the data (NCCL's LL): no announcement to wait for,
    /// a fraction of the bandwidth. On the device always staged, 8 data
    /// bytes per 16-byte line, each half carrying the message's flag.
    LowLatency = 1,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Protocol::Simple => "simple",
            Protocol::LowLatency => "LL",
        })
    }
}

/// What was selected for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// What runs.
    pub choice: Choice,
    /// The pipelining grain for this call, if the selector has a view.
    pub max_chunk_bytes: Option<usize>,
    /// How the messages travel, if the selector has a view (executors
    /// with one protocol ignore it).
    pub protocol: Option<Protocol>,
    /// Why, for the debug log line: the prediction and the runner-up.
    pub why: String,
}

/// Selects the algorithm of calls that force none.
pub trait Selector: Send + Sync + fmt::Debug {
    /// The selection for `collective` on `world_size` ranks moving `bytes`
    /// (nccl-tests' size), or `None` to leave it to the executor's rule.
    fn select(&self, collective: Collective, world_size: u32, bytes: usize) -> Option<Selection>;
}

/// A shared selector in a configuration; two are equal when they are the
/// same object.
#[derive(Clone)]
pub struct SharedSelector(pub Arc<dyn Selector>);

impl PartialEq for SharedSelector {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}

impl Eq for SharedSelector {}

impl fmt::Debug for SharedSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An executor's fixed rule: the algorithm for (collective, world size,
/// bytes) when nothing is forced and no selector answers, and why.
pub type Rule = fn(CollectiveKind, u32, usize) -> (Algorithm, &'static str);

/// The selection of one call: `forced` wins, then `selector`, then `rule`.
/// Forced and rule-picked algorithms run on `channels` channels
/// (halving-doubling has exactly one).
pub fn select(
    forced: Option<Algorithm>,
    selector: Option<&SharedSelector>,
    channels: u32,
    collective: Collective,
    world_size: u32,
    bytes: usize,
    rule: Rule,
) -> Selection {
    let fixed = |algorithm: Algorithm| builtin(algorithm, channels);
    let mut refused = None;
    if let Some(algorithm) = forced {
        match algorithm.supports(collective.kind()) {
            Ok(()) => {
                return Selection {
                    choice: fixed(algorithm),
                    max_chunk_bytes: None,
                    protocol: None,
                    why: "forced by configuration".to_owned(),
                };
            }
            // A forced algorithm that cannot express this collective must
            // not fail the call (and with it the group): fall back to what
            // would run unforced, and say so.
            Err(reason) => refused = Some((algorithm, reason)),
        }
    }
    let mut selection = selector
        .and_then(|s| s.0.select(collective, world_size, bytes))
        .unwrap_or_else(|| {
            let (algorithm, why) = rule(collective.kind(), world_size, bytes);
            Selection {
                choice: fixed(algorithm),
                max_chunk_bytes: None,
                protocol: None,
                why: why.to_owned(),
            }
        });
    if let Some((algorithm, reason)) = refused {
        tracing::warn!(
            "forced algorithm {algorithm} cannot run {} ({reason}); running {} instead",
            collective.kind(),
            selection.choice
        );
        selection.why = format!(
            "forced {algorithm} cannot run {} ({reason}); fell back: {}",
            collective.kind(),
            selection.why
        );
    }
    selection
}

/// A built-in algorithm on `channels` channels (halving-doubling has
/// exactly one).
fn builtin(algorithm: Algorithm, channels: u32) -> Choice {
    Choice::Builtin {
        algorithm,
        params: AlgorithmParams {
            channels: if algorithm == Algorithm::HalvingDoubling {
                1
            } else {
                channels
            },
            ..AlgorithmParams::default()
        },
    }
}

/// `selection` kept to what `filter` allows for `collective`: a choice
/// it does not allow gives way to the first allowed algorithm that can
/// express the collective (on `channels` channels), and says so.
pub fn restrict(
    selection: Selection,
    filter: Option<&AlgoFilter>,
    collective: Collective,
    channels: u32,
) -> Selection {
    let Some(filter) = filter else {
        return selection;
    };
    let kind = collective.kind();
    let chosen = match &selection.choice {
        Choice::Builtin { algorithm, .. } => Some(*algorithm),
        Choice::Synthesized(_) => None,
    };
    if filter.permits(kind, chosen) {
        return selection;
    }
    let Some(algorithm) = filter.fallback(kind) else {
        tracing::warn!(
            "FERROCOLL_ALGO `{filter}` allows nothing that can run {kind}; running {}",
            selection.choice
        );
        return selection;
    };
    Selection {
        choice: builtin(algorithm, channels),
        max_chunk_bytes: None,
        protocol: selection.protocol,
        why: format!(
            "FERROCOLL_ALGO `{filter}` does not allow {} for {kind}",
            selection.choice
        ),
    }
}

/// Above this many ranks, direct's n² messages per call cost more than
/// ring's 2n; below, direct moves each byte the fewest times.
const DIRECT_MAX_RANKS: u32 = 16;

/// Above this many ranks a rooted star funnels too much through the root.
const STAR_MAX_RANKS: u32 = 8;

/// The host executors' rule (threads and processes share host memory, a
/// full mesh in which every rank reaches every other at the same cost).
pub fn host_rule(
    kind: CollectiveKind,
    world_size: u32,
    _bytes: usize,
) -> (Algorithm, &'static str) {
    use CollectiveKind as C;
    match kind {
        C::AllToAll | C::SendRecv => (Algorithm::Direct, "only direct expresses it"),
        C::Broadcast | C::Reduce if world_size <= STAR_MAX_RANKS => {
            (Algorithm::Direct, "few ranks: one star hop from the root")
        }
        C::Broadcast | C::Reduce => (Algorithm::Tree, "many ranks: log-depth tree from the root"),
        _ if world_size <= DIRECT_MAX_RANKS => (
            Algorithm::Direct,
            "shared memory is a full mesh: direct reads every input once and writes every output once",
        ),
        _ => (
            Algorithm::Ring,
            "many ranks: ring keeps messages per call linear in n",
        ),
    }
}
