//! Call preparation, once for every host and device executor: select the
//! schedule, compile its plan, cache both.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::CommError;
use crate::algorithms::{Algorithm, AlgorithmParams, generate};
use crate::plan::{Chunking, Compiler, ExecutionPlan, OneShotRule, PlanError};
use crate::select::{
    AlgoFilter, Choice, ProtoFilter, Protocol, Rule, Selection, SharedSelector, restrict, select,
};
use crate::types::{CallShape, Collective, CollectiveKind};
use crate::verify::{Verified, VerifyOptions, verify};

/// Plans kept per planner; the least recently used goes first.
const PLAN_CACHE_LIMIT: usize = 64;

/// How an executor plans its calls.
#[derive(Debug, Clone)]
pub struct PlannerSettings {
    /// Force an algorithm (`None`: the selector, then `rule`).
    pub algorithm: Option<Algorithm>,
    /// Which algorithms each collective may run (see [`Planning::algorithms`](super::Planning::algorithms)).
    pub algorithms: Option<AlgoFilter>,
    /// Which protocols each collective may use (see [`Planning::protocols`](super::Planning::protocols));
    /// applied where the executor has LL (`max_ll_message_bytes`).
    pub protocols: Option<ProtoFilter>,
    /// Selects the algorithm of calls that force none.
    pub selector: Option<SharedSelector>,
    /// Channels of forced and rule-picked algorithms.
    pub channels: u32,
    /// The largest chunk when the selector names none.
    pub max_chunk_bytes: usize,
    /// A hard bound on one message (a transport's slot): chunks are cut so
    /// that the widest step's message fits.
    pub max_message_bytes: Option<usize>,
    /// A hard bound on one low-latency message (a transport's LL slot):
    /// where the selector picks LL, chunks are cut so that the widest
    /// step's message fits it, so the call runs the protocol it was
    /// simulated with (`None`: the executor has no LL).
    pub max_ll_message_bytes: Option<usize>,
    /// Messages each link of the executor holds.
    pub slots_per_link: u32,
    /// A schedule of the user's, run for every call it matches.
    pub schedule: Option<Arc<Verified>>,
    /// The executor's fixed rule.
    pub rule: Rule,
    /// World size × published bytes up to which calls take the one-shot
    /// protocol (0: never). Only executors that implement it set it.
    pub one_shot_bytes: usize,
    /// The most channels the executor's links were set up for (`None`:
    /// any). A selector's choice past it is set aside for the rule, with
    /// the reason in the call's log line, rather than failing the call.
    pub max_channels: Option<u32>,
}

impl PlannerSettings {
    /// Which calls take the one-shot protocol: none when an algorithm is
    /// forced, never those a configured schedule runs.
    pub fn one_shot_rule(&self, world_size: u32) -> OneShotRule {
        if self.algorithm.is_some() {
            return OneShotRule::never();
        }
        let custom = self
            .schedule
            .as_ref()
            .map(|v| v.schedule())
            .filter(|s| s.world_size == world_size)
            .map(|s| s.collective);
        // Staging is allocated at the budget: never more than the
        // settings layer accepts.
        let budget = self.one_shot_bytes.min(crate::settings::MAX_ONE_SHOT_BYTES);
        // A collective FERROCOLL_ALGO restricts runs what it allows.
        let restricted: Vec<CollectiveKind> = self.algorithms.as_ref().map_or_else(Vec::new, |f| {
            CollectiveKind::ALL
                .into_iter()
                .filter(|&k| f.allowed(k).is_some())
                .collect()
        });
        OneShotRule::new(budget, custom).excluding(&restricted)
    }
}

/// A call's plan and why its schedule was chosen.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The plan.
    pub plan: Arc<ExecutionPlan>,
    /// Why this schedule (for the debug log line).
    pub why: Arc<str>,
    /// The hash of the plan's [`signature`](ExecutionPlan::signature):
    /// what ranks compare to agree on the call.
    pub signature: u64,
    /// The selector's protocol for the call, if it had a view (device
    /// executors agree on the protocol they use through their own
    /// handshake).
    pub protocol: Option<crate::select::Protocol>,
}

impl Planned {
    /// The executors' one debug line per call: what runs, and why.
    pub fn describe(&self) -> String {
        let p = &self.plan;
        format!(
            "{} {} B {}: algorithm={} channels={} chunks/block={} segments={} in_place={} plan={:016x} ({})",
            p.collective,
            p.size_bytes(),
            p.dtype,
            p.schedule,
            p.channels,
            p.chunks_per_block,
            p.segments,
            p.in_place,
            p.hash,
            self.why
        )
    }
}

/// Slots a link of an executor gets: as configured, never fewer than the
/// built-in schedules were proven with (2), and never fewer than the
/// configured schedule of the user's was — one count serves every plan of
/// the group, built-in or not.
pub fn link_slots(configured: u32, schedule: Option<&Verified>) -> u32 {
    let custom = schedule.map_or(0, Verified::slots_per_link);
    configured
        .max(crate::verify::DEFAULT_SLOTS_PER_LINK)
        .max(custom)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ScheduleKey {
    Builtin {
        algorithm: Algorithm,
        collective: Collective,
        params: AlgorithmParams,
    },
    Custom,
    /// A selector's synthesized schedule, by content (a selector that
    /// makes a fresh `Arc` per call still finds one compiler per schedule)
    /// and by what it was proven for.
    Synthesized {
        hash: u64,
        slots_per_link: u32,
        in_place: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    shape: CallShape,
    /// The settings' forced algorithm when the plan was made.
    forced: Option<Algorithm>,
    /// An executor's own choice, which also passes over a custom schedule.
    internal: Option<Algorithm>,
}

/// Selects, compiles and caches the plans of one group's calls. Every
/// rank's planner must be built with the same settings: plans are then
/// the same everywhere, and ranks compare their hashes.
#[derive(Debug)]
pub struct Planner {
    world_size: u32,
    settings: PlannerSettings,
    compilers: HashMap<ScheduleKey, Arc<Compiler>>,
    plans: HashMap<PlanKey, Planned>,
    recent: VecDeque<PlanKey>,
}

impl Planner {
    /// A planner for a group of `world_size` ranks.
    pub fn new(world_size: u32, settings: PlannerSettings) -> Self {
        Planner {
            world_size,
            settings,
            compilers: HashMap::new(),
            plans: HashMap::new(),
            recent: VecDeque::new(),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &PlannerSettings {
        &self.settings
    }

    /// Force (or stop forcing) the algorithm of later calls.
    pub fn set_algorithm(&mut self, algorithm: Option<Algorithm>) {
        self.settings.algorithm = algorithm;
    }

    /// The plan of `shape`, selected as the settings say.
    pub fn plan(&mut self, shape: &CallShape) -> Result<Planned, CommError> {
        self.plan_keyed(shape, None)
    }

    /// The plan of `shape` with `algorithm` (for an executor's own calls,
    /// such as a barrier), whatever the settings force.
    pub fn plan_with(
        &mut self,
        shape: &CallShape,
        algorithm: Algorithm,
    ) -> Result<Planned, CommError> {
        self.plan_keyed(shape, Some(algorithm))
    }

    fn plan_keyed(
        &mut self,
        shape: &CallShape,
        internal: Option<Algorithm>,
    ) -> Result<Planned, CommError> {
        let key = PlanKey {
            shape: *shape,
            forced: self.settings.algorithm,
            internal,
        };
        if let Some(hit) = self.plans.get(&key).cloned() {
            self.recent.retain(|k| k != &key);
            self.recent.push_back(key);
            return Ok(hit);
        }
        let planned = self.build(shape, internal)?;
        if self.plans.len() >= PLAN_CACHE_LIMIT
            && let Some(old) = self.recent.pop_front()
        {
            self.plans.remove(&old);
        }
        self.plans.insert(key, planned.clone());
        self.recent.push_back(key);
        Ok(planned)
    }

    fn build(
        &mut self,
        shape: &CallShape,
        internal: Option<Algorithm>,
    ) -> Result<Planned, CommError> {
        let n = self.world_size;
        let st = &self.settings;
        let custom = st.schedule.as_ref().filter(|v| {
            let s = v.schedule();
            internal.is_none() && s.collective == shape.collective && s.world_size == n
        });
        let filter = st.algorithms.as_ref();
        let forced = internal
            .or(st.algorithm)
            .or_else(|| filter.and_then(|f| f.forced(shape.collective.kind())));
        let (key, chunk, why, synthesized, protocol) = match custom {
            Some(_) => (
                ScheduleKey::Custom,
                None,
                "the configured schedule".to_owned(),
                None,
                None,
            ),
            None => {
                let bytes = shape.size_bytes(n);
                let restrict = |s| restrict(s, filter, shape.collective, st.channels);
                let mut s = restrict(select(
                    forced,
                    st.selector.as_ref(),
                    st.channels,
                    shape.collective,
                    n,
                    bytes,
                    st.rule,
                ));
                let channels = s.choice.channels();
                if let Some(max) = st.max_channels.filter(|&m| channels > m) {
                    let rule = restrict(select(
                        forced,
                        None,
                        st.channels,
                        shape.collective,
                        n,
                        bytes,
                        st.rule,
                    ));
                    s = Selection {
                        why: format!(
                            "{} needs {channels} channels, past the {max} this group was set up for; {}",
                            s.choice, rule.why
                        ),
                        ..rule
                    };
                }
                let (key, synthesized) = match s.choice {
                    Choice::Builtin { algorithm, params } => (
                        ScheduleKey::Builtin {
                            algorithm,
                            collective: shape.collective,
                            params,
                        },
                        None,
                    ),
                    Choice::Synthesized(v) => {
                        self.check_synthesized(&v, shape)?;
                        let key = ScheduleKey::Synthesized {
                            hash: crate::plan::stable_hash(v.schedule()),
                            slots_per_link: v.slots_per_link(),
                            in_place: v.supports_in_place(),
                        };
                        (key, Some(v))
                    }
                };
                (key, s.max_chunk_bytes, s.why, synthesized, s.protocol)
            }
        };
        let (protocol, why) = self.filter_protocol(shape, protocol, why);
        let compiler = self.compiler(key, synthesized)?;
        let chunk = self.chunk_bytes(shape, chunk, protocol, &compiler);
        let plan = compiler
            .compile(
                shape,
                Chunking::MaxBytes(chunk),
                self.settings.slots_per_link,
            )
            .map_err(|e| match e {
                PlanError::InPlaceUnproven {
                    schedule,
                    collective,
                } => CommError::InPlaceUnsupported {
                    collective: format!("{collective} with schedule `{schedule}`"),
                },
                other => CommError::Plan(other),
            })?;
        Ok(Planned {
            signature: crate::plan::stable_hash(&plan.signature()),
            plan: Arc::new(plan),
            why: why.into(),
            protocol,
        })
    }

    /// The protocol `FERROCOLL_PROTO` leaves the call, on an executor
    /// that has LL; the reason joins the call's `why` where it changed.
    fn filter_protocol(
        &self,
        shape: &CallShape,
        chosen: Option<Protocol>,
        why: String,
    ) -> (Option<Protocol>, String) {
        let st = &self.settings;
        let Some(filter) = st
            .protocols
            .as_ref()
            .filter(|_| st.max_ll_message_bytes.is_some())
        else {
            return (chosen, why);
        };
        match filter.apply(shape.collective.kind(), chosen) {
            (p, Some(reason)) => (p, format!("{why}; {reason}")),
            (p, None) => (p, why),
        }
    }

    /// A selector's schedule must be for this call: a selector that hands
    /// out another collective's or group's schedule is a bug, and running
    /// it would compute something else.
    fn check_synthesized(&self, v: &Verified, shape: &CallShape) -> Result<(), CommError> {
        let s = v.schedule();
        if s.collective == shape.collective && s.world_size == self.world_size {
            return Ok(());
        }
        Err(CommError::Plan(PlanError::Invalid(format!(
            "the selector chose schedule `{}` ({} on {} ranks) for {} on {} ranks",
            s.name, s.collective, s.world_size, shape.collective, self.world_size
        ))))
    }

    /// The compiler of a schedule, generating and proving it on first use.
    fn compiler(
        &mut self,
        key: ScheduleKey,
        synthesized: Option<Arc<Verified>>,
    ) -> Result<Arc<Compiler>, CommError> {
        if let Some(c) = self.compilers.get(&key) {
            return Ok(c.clone());
        }
        let verified = match &key {
            ScheduleKey::Synthesized { .. } => {
                synthesized.expect("synthesized keys come with their schedule")
            }
            ScheduleKey::Custom => self
                .settings
                .schedule
                .clone()
                .expect("custom keys need a schedule"),
            ScheduleKey::Builtin {
                algorithm,
                collective,
                params,
            } => {
                let schedule = generate(*algorithm, *collective, self.world_size, params)?;
                Arc::new(verify(schedule, &VerifyOptions::default()).map_err(Box::new)?)
            }
        };
        let compiler = Arc::new(Compiler::new(verified));
        self.compilers.insert(key, compiler.clone());
        Ok(compiler)
    }

    /// The chunk size: the selector's or the settings', cut so the widest
    /// step's message fits the transport (an LL slot where the selector
    /// chose LL).
    fn chunk_bytes(
        &self,
        shape: &CallShape,
        selected: Option<usize>,
        protocol: Option<Protocol>,
        c: &Compiler,
    ) -> usize {
        let elem = shape.dtype.size_bytes();
        let chunk = selected.unwrap_or(self.settings.max_chunk_bytes);
        let ll = match protocol {
            Some(Protocol::LowLatency) => self.settings.max_ll_message_bytes,
            _ => None,
        };
        let bound = match (self.settings.max_message_bytes, ll) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match bound {
            Some(max) => {
                let limit = max.max(elem) / c.verified().schedule().widest_step() as usize;
                chunk.min(limit).max(elem)
            }
            None => chunk,
        }
    }
}

#[cfg(test)]
mod tests;
