//! Per-call algorithm selection: simulate every candidate on the topology
//! and take the fastest.
//!
//! Candidates are each applicable algorithm with the orders the
//! [`crate::search`] found (the best ring set and the single best ring,
//! trees laid over the best ring), and the schedules synthesized for the
//! topology — tree packings on GPUs (all-gather, reduce-scatter,
//! all-reduce), the hierarchical all-reduce across machines — each at a
//! few chunk sizes. The choice is a
//! pure function of (collective, size, world size, topology, options), so
//! every rank that holds the same topology selects the same; ties go to
//! the earlier candidate in a fixed order. Choices are cached per
//! (collective, size).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use ferrocoll_core::algorithms::{MAX_CHANNELS, forest, hierarchical};
use ferrocoll_core::plan::{Compiler, DEVICE_CHUNK_BYTES, HOST_CHUNK_BYTES, MAX_PLAN_INSTRUCTIONS};
use ferrocoll_core::select::{Choice, Protocol, Selection, Selector};
use ferrocoll_core::verify::{Verified, VerifyOptions, verify};
use ferrocoll_core::{Algorithm, AlgorithmParams, Collective, DataType, Rank, generate};

use crate::error::TopologyError;
use crate::graph::{NodeId, NodeKind, Topology};
use crate::search;
use crate::sim::{self, CostModel, Prediction};

mod candidate;
mod predict;
mod steps;

use steps::{check_plan_steps, linear_steps};

pub use candidate::{Candidate, LL_CANDIDATE_MAX_BYTES, LL_MESSAGE_BYTES, human_bytes};

/// A verdict, reached once by whoever asks first.
type VerdictCell = OnceLock<Result<Arc<Verdict>, TopologyError>>;

/// Cached verdicts kept at most; past it the cache starts over.
/// Work units ([`crate::work`]) charged per step of a schedule to prove.
const PROOF_WORK: u64 = 256;

const CACHE_LIMIT: usize = 4096;

/// The default [`SelectOptions::tie_margin`]: 3 %.
pub const TIE_MARGIN: f64 = 0.03;

/// What the selector may choose from.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectOptions {
    /// Algorithms to consider, in order of preference; empty takes the
    /// devices' default: on GPUs ring, tree, direct, halving-doubling (the
    /// order NCCL prefers its algorithms in), on threads direct first (the
    /// CPU executor's zero-copy and direct-write paths are built around
    /// it; docs/cpu-executor.md), then ring, tree, halving-doubling.
    pub algorithms: Vec<Algorithm>,
    /// Predictions closer than this fraction of the best are a tie, and
    /// ties go to the preferred candidate: the simulator is not more
    /// accurate than that (docs/topology.md, calibration), so a smaller
    /// lead is no evidence.
    pub tie_margin: f64,
    /// Chunk sizes to consider, in order of preference; empty takes the
    /// devices' defaults (GPUs: 512 KiB, 128 KiB, 2 MiB; threads: 4 MiB,
    /// 1 MiB — each executor's own default first).
    pub chunk_sizes: Vec<usize>,
    /// Rings a ring set may hold.
    pub max_rings: usize,
    /// Copies of each channel layout to consider (NCCL runs many channels
    /// on the same rings so that one channel's step latency hides behind
    /// the others' transfers); empty takes the devices' defaults (GPUs:
    /// 1, 2, 4, 8, 16; threads: 1).
    pub channel_multipliers: Vec<u32>,
    /// The element type of the calls.
    pub dtype: DataType,
    /// Messages a link holds in flight.
    pub slots_per_link: u32,
    /// The cost model.
    pub cost: CostModel,
    /// Tree packings to consider for all-gather, reduce-scatter and
    /// all-reduce (the load model's best first; each is simulated at
    /// every size asked). `None` takes the devices' default: on GPUs
    /// [`TREE_PACKINGS`] up to [`TREE_PACKING_MAX_RANKS`] ranks, on threads
    /// none (host memory is one full mesh: there is nothing to pack).
    pub tree_packings: Option<usize>,
    /// Whether to consider the hierarchical all-reduce where the devices
    /// sit in several machines of as many members each; `None`: yes,
    /// unless `algorithms` names a list.
    pub hierarchical: Option<bool>,
    /// The most one low-latency message carries on the executor that will
    /// run the selection (the device interpreter's LL slot): an LL
    /// candidate's chunk is cut so that its schedule's widest step fits,
    /// so what is simulated is what runs.
    pub ll_message_bytes: usize,
    /// Which simulator model predicts each candidate.
    pub fidelity: sim::Fidelity,
}

/// Tree packings `auto` considers on GPUs: the load model's two best (its
/// first is not always the fastest once links are shared fairly;
/// docs/synthesis.md).
pub const TREE_PACKINGS: usize = 2;

/// Above this many ranks `auto` leaves tree packings out by default:
/// packing takes seconds and simulating each packing at every size minutes
/// (`ferrocoll synth` still packs them).
pub const TREE_PACKING_MAX_RANKS: u32 = 16;

impl Default for SelectOptions {
    fn default() -> Self {
        SelectOptions {
            algorithms: Vec::new(),
            tie_margin: TIE_MARGIN,
            chunk_sizes: Vec::new(),
            max_rings: search::MAX_RINGS,
            channel_multipliers: Vec::new(),
            dtype: DataType::F32,
            slots_per_link: 4,
            cost: CostModel::default(),
            tree_packings: None,
            hierarchical: None,
            ll_message_bytes: LL_MESSAGE_BYTES,
            fidelity: sim::Fidelity::Auto,
        }
    }
}

/// A selection with its evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// What to run.
    pub candidate: Candidate,
    /// Its predicted time and bottleneck.
    pub prediction: Prediction,
    /// The next best candidate and its predicted time, µs.
    pub runner_up: Option<(Candidate, f64)>,
}

impl Verdict {
    /// One line: the selection, its prediction, the runner-up.
    pub fn explain(&self) -> String {
        let mut s = format!(
            "{} predicted {:.1} us",
            self.candidate, self.prediction.time_us
        );
        if let Some(b) = self.prediction.bottleneck() {
            s += &format!(
                ", bottleneck {} at {:.0}%",
                b.resource,
                b.utilisation * 100.0
            );
        }
        if let Some((c, t)) = &self.runner_up {
            s += &format!("; runner-up {c} {t:.1} us");
        }
        s
    }
}

/// Selects the algorithm, channels and chunk size of calls for one world
/// size on one topology, by simulating every candidate.
pub struct TopologySelector {
    topology: Topology,
    devices: Vec<NodeId>,
    world_size: u32,
    options: SelectOptions,
    rings: search::RingSet,
    tree_order: Vec<Rank>,
    cache: Mutex<HashMap<(Collective, usize), Arc<VerdictCell>>>,
    /// Each candidate schedule, proven once and compiled per size.
    compilers: Mutex<HashMap<CompilerKey, Arc<Compiler>>>,
    /// The schedules synthesized per collective (each with its channel
    /// multiplier), found on first use and kept: planners key their plans
    /// by these `Arc`s.
    synthesized: Mutex<HashMap<Collective, Arc<OnceLock<Synthesized>>>>,
}

/// Schedules synthesized for one collective, each with its channel
/// multiplier.
pub type Synthesized = Arc<Vec<(Arc<Verified>, u32)>>;

/// What a candidate's compiler is cached under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum CompilerKey {
    Builtin(Algorithm, Collective, AlgorithmParams),
    /// A synthesized schedule by its `Arc`'s address (the selector keeps
    /// every one it made, so addresses are never reused).
    Synthesized(usize),
}

impl fmt::Debug for TopologySelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopologySelector")
            .field("topology", &self.topology.name)
            .field("world_size", &self.world_size)
            .finish_non_exhaustive()
    }
}

impl TopologySelector {
    /// A selector for `world_size` ranks on the first devices of `topology`.
    pub fn new(
        topology: Topology,
        world_size: u32,
        options: SelectOptions,
    ) -> Result<TopologySelector, TopologyError> {
        topology.validate()?;
        if world_size == 0 {
            return Err(TopologyError::Invalid(
                "world size must be at least 1".into(),
            ));
        }
        let all = topology.devices();
        if all.len() < world_size as usize || world_size == 0 {
            return Err(TopologyError::TooFewDevices {
                ranks: world_size,
                devices: all.len(),
                topology: topology.name.clone(),
            });
        }
        // Before the route tables, which grow as n²: a file is not capped
        // like the presets.
        let limit = ferrocoll_core::algorithms::MAX_WORLD_SIZE;
        if world_size > limit {
            return Err(TopologyError::TooManyRanks {
                ranks: world_size,
                limit,
            });
        }
        let devices = all[..world_size as usize].to_vec();
        let rings = search::rings(&topology, &devices, &options.cost, options.max_rings)?;
        // The best single ring, not a packing's first (which is chosen for
        // what it leaves to the others).
        let tree_order = if rings.orders.len() > 1 {
            search::tree_order(&topology, &devices, &options.cost)?
        } else {
            rings.orders[0].clone()
        };
        Ok(TopologySelector {
            topology,
            devices,
            world_size,
            options,
            rings,
            tree_order,
            cache: Mutex::new(HashMap::new()),
            compilers: Mutex::new(HashMap::new()),
            synthesized: Mutex::new(HashMap::new()),
        })
    }

    /// The topology it selects on.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The ring set the search found.
    pub fn rings(&self) -> &search::RingSet {
        &self.rings
    }

    fn chunk_sizes(&self) -> Vec<usize> {
        if !self.options.chunk_sizes.is_empty() {
            return self.options.chunk_sizes.clone();
        }
        // The executor's default first: it wins ties.
        if self.topology.nodes[self.devices[0]].kind == NodeKind::Thread {
            vec![HOST_CHUNK_BYTES, 1 << 20]
        } else {
            vec![DEVICE_CHUNK_BYTES, 512 << 10, 128 << 10]
        }
    }

    fn algorithms(&self) -> Vec<Algorithm> {
        if !self.options.algorithms.is_empty() {
            return self.options.algorithms.clone();
        }
        use Algorithm::*;
        if self.topology.nodes[self.devices[0]].kind == NodeKind::Thread {
            vec![Direct, Ring, Tree, HalvingDoubling]
        } else {
            vec![Ring, Tree, Direct, HalvingDoubling]
        }
    }

    fn channel_multipliers(&self) -> Vec<u32> {
        if !self.options.channel_multipliers.is_empty() {
            return self.options.channel_multipliers.clone();
        }
        if self.topology.nodes[self.devices[0]].kind == NodeKind::Thread {
            vec![1]
        } else {
            vec![1, 2, 4, 8, 16]
        }
    }

    /// Every candidate for `collective`, in tie-breaking order.
    pub fn candidates(&self, collective: Collective) -> Vec<Candidate> {
        let identity: Vec<Rank> = (0..self.world_size).collect();
        let unless_identity = |o: &Vec<Rank>| {
            if *o == identity {
                Vec::new()
            } else {
                o.clone()
            }
        };
        let mut variants: Vec<(Algorithm, AlgorithmParams, u32)> = Vec::new();
        for a in self.algorithms() {
            if a.supports(collective.kind()).is_err() {
                continue;
            }
            for &m in &self.channel_multipliers() {
                match a {
                    Algorithm::Ring => {
                        let orders = &self.rings.orders;
                        let mut sets = vec![orders[..1].to_vec()];
                        if orders.len() > 1 {
                            sets.push(orders.clone());
                        }
                        for set in sets {
                            let channels = set.len() as u32 * m;
                            if channels > MAX_CHANNELS {
                                continue;
                            }
                            let repeated: Vec<Vec<Rank>> =
                                (0..m).flat_map(|_| set.iter().cloned()).collect();
                            let plain = set.iter().all(|o| *o == identity);
                            variants.push((
                                a,
                                AlgorithmParams {
                                    channels,
                                    ring_orders: if plain { Vec::new() } else { repeated },
                                    ..AlgorithmParams::default()
                                },
                                m,
                            ));
                        }
                    }
                    Algorithm::Tree => variants.push((
                        a,
                        AlgorithmParams {
                            channels: m,
                            tree_order: unless_identity(&self.tree_order),
                            ..AlgorithmParams::default()
                        },
                        m,
                    )),
                    Algorithm::HalvingDoubling if m > 1 => {}
                    _ => variants.push((
                        a,
                        AlgorithmParams {
                            channels: m,
                            ..AlgorithmParams::default()
                        },
                        m,
                    )),
                }
            }
        }
        // A schedule with more steps than a plan may hold never compiles:
        // building and proving it would only cost memory.
        let n = self.world_size;
        variants.retain(|(a, p, _)| {
            linear_steps(*a, collective, n, p.channels).is_none_or(|s| s <= MAX_PLAN_INSTRUCTIONS)
        });
        let mut choices: Vec<(Choice, u32)> = variants
            .into_iter()
            .map(|(algorithm, params, m)| (Choice::Builtin { algorithm, params }, m))
            .collect();
        for (v, m) in self.synthesized(collective).iter() {
            choices.push((Choice::Synthesized(v.clone()), *m));
        }
        let protocol = (!self.on_threads()).then_some(Protocol::Simple);
        let mut out = Vec::new();
        for (choice, multiplier) in choices {
            for &chunk in &self.chunk_sizes() {
                out.push(Candidate {
                    choice: choice.clone(),
                    max_chunk_bytes: chunk,
                    multiplier,
                    protocol,
                });
            }
        }
        out
    }

    /// Whether the ranks are CPU threads.
    fn on_threads(&self) -> bool {
        self.topology.nodes[self.devices[0]].kind == NodeKind::Thread
    }

    /// The candidates at `size`: on GPUs, calls up to
    /// [`LL_CANDIDATE_MAX_BYTES`] also try each schedule with the
    /// low-latency protocol (after the bulk ones: they win ties), at the
    /// chunk whose widest message fits an LL message.
    fn candidates_at(&self, collective: Collective, size: usize) -> Vec<Candidate> {
        let mut out = self.candidates(collective);
        if self.on_threads() || size > LL_CANDIDATE_MAX_BYTES {
            return out;
        }
        let first = self.chunk_sizes()[0];
        let ll: Vec<Candidate> = out
            .iter()
            .filter(|c| c.max_chunk_bytes == first)
            .filter_map(|c| {
                let chunk = self.ll_chunk_bytes(c, collective)?;
                Some(Candidate {
                    max_chunk_bytes: chunk,
                    protocol: Some(Protocol::LowLatency),
                    ..c.clone()
                })
            })
            .collect();
        out.extend(ll);
        out
    }

    /// The largest chunk (whole elements) whose widest step fits one LL
    /// message; `None` where not even one element per chunk does, or the
    /// schedule cannot be made (the bulk candidate reports that).
    fn ll_chunk_bytes(&self, candidate: &Candidate, collective: Collective) -> Option<usize> {
        let widest = self
            .compiler(candidate, collective)
            .ok()?
            .verified()
            .schedule()
            .widest_step() as usize;
        let elem = self.options.dtype.size_bytes();
        let chunk = self.options.ll_message_bytes / widest / elem * elem;
        (chunk > 0).then_some(chunk)
    }

    /// How many tree packings to consider (see [`SelectOptions::tree_packings`]).
    fn tree_packings(&self) -> usize {
        if let Some(k) = self.options.tree_packings {
            return k;
        }
        let threads = self.topology.nodes[self.devices[0]].kind == NodeKind::Thread;
        if threads
            || !self.options.algorithms.is_empty()
            || self.world_size > TREE_PACKING_MAX_RANKS
        {
            0
        } else {
            TREE_PACKINGS
        }
    }

    /// The schedules synthesized for `collective` on this topology, made
    /// and proven on first use. One that cannot be made is left out (and
    /// logged): the built-in candidates remain.
    ///
    /// Packing and proving take up to seconds: the lock is held only to
    /// find the collective's cell, so other collectives do not wait.
    pub fn synthesized(&self, collective: Collective) -> Synthesized {
        let cell = self
            .synthesized
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(collective)
            .or_default()
            .clone();
        cell.get_or_init(|| Arc::new(self.synthesize(collective)))
            .clone()
    }

    fn synthesize(&self, collective: Collective) -> Vec<(Arc<Verified>, u32)> {
        let mut out = Vec::new();
        if self.world_size < 2 {
            return out;
        }
        let prove = |mut schedule: ferrocoll_core::Schedule, name: &str| {
            schedule.name = name.to_owned();
            verify(schedule, &VerifyOptions::default()).map(Arc::new)
        };
        let trees = self.tree_packings();
        let packable = matches!(
            collective,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllReduce
        );
        if trees > 0 && packable {
            let cost = &self.options.cost;
            match search::tree_packings(&self.topology, &self.devices, cost, collective.kind()) {
                Ok(packings) => {
                    for p in packings.into_iter().take(trees) {
                        match forest::schedule(collective, self.world_size, &p.forest) {
                            Ok(s) => match prove(s, "trees") {
                                Ok(v) => out.push((v, 1)),
                                Err(e) => tracing::warn!("a tree packing did not verify: {e}"),
                            },
                            Err(e) => tracing::warn!("a tree packing is not a schedule: {e}"),
                        }
                    }
                }
                Err(e) => tracing::warn!("no tree packing on `{}`: {e}", self.topology.name),
            }
        }
        let hierarchical = self
            .options
            .hierarchical
            .unwrap_or(self.options.algorithms.is_empty());
        if hierarchical && collective == Collective::AllReduce {
            match search::hierarchy(&self.topology, &self.devices, &self.options.cost) {
                Ok(Some(h)) => {
                    for m in self.channel_multipliers() {
                        let s = hierarchical::schedule(collective, self.world_size, &h, m);
                        match s
                            .map_err(|e| e.to_string())
                            .and_then(|s| prove(s, "hierarchical").map_err(|e| e.to_string()))
                        {
                            Ok(v) => out.push((v, m)),
                            Err(e) => tracing::warn!("no hierarchical schedule x{m}: {e}"),
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("no hierarchy on `{}`: {e}", self.topology.name),
            }
        }
        out
    }

    /// The candidate's schedule, generated and proven on first use.
    fn compiler(
        &self,
        candidate: &Candidate,
        collective: Collective,
    ) -> Result<Arc<Compiler>, TopologyError> {
        let (algorithm, params) = match &candidate.choice {
            Choice::Builtin { algorithm, params } => (*algorithm, params),
            Choice::Synthesized(v) => {
                let key = CompilerKey::Synthesized(Arc::as_ptr(v) as usize);
                return self.cached(key, || Ok(v.clone()));
            }
        };
        self.cached(
            CompilerKey::Builtin(algorithm, collective, params.clone()),
            || {
                let invalid = |e: String| TopologyError::Invalid(e);
                // Ring and direct grow as n² steps, known before they are
                // built: charged (and refused past what a plan may hold)
                // first, so a budget or a bound never pays for gigabytes
                // of steps it then throws away.
                let known = linear_steps(algorithm, collective, self.world_size, params.channels);
                if let Some(steps) = known {
                    check_plan_steps(steps, algorithm, params.channels, self.world_size)?;
                    crate::work::charge(PROOF_WORK * steps)?;
                }
                let schedule = generate(algorithm, collective, self.world_size, params)
                    .map_err(|e| invalid(e.to_string()))?;
                if known.is_none() {
                    // Proving follows every step's chunks symbolically.
                    let steps = schedule.step_count() as u64;
                    check_plan_steps(steps, algorithm, params.channels, self.world_size)?;
                    crate::work::charge(PROOF_WORK * steps)?;
                }
                verify(schedule, &VerifyOptions::default())
                    .map(Arc::new)
                    .map_err(|e| invalid(e.to_string()))
            },
        )
    }

    /// The compiler cached under `key`, made from `make`'s schedule on
    /// first use.
    fn cached(
        &self,
        key: CompilerKey,
        make: impl FnOnce() -> Result<Arc<Verified>, TopologyError>,
    ) -> Result<Arc<Compiler>, TopologyError> {
        if let Some(c) = self
            .compilers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(c.clone());
        }
        let compiler = Arc::new(Compiler::new(make()?));
        // Two callers may make the same compiler at once: both keep the
        // first one cached, so a schedule has one compiler for the
        // selector's life.
        Ok(self
            .compilers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_insert(compiler)
            .clone())
    }

    /// The fastest candidate for `collective` at `size` bytes.
    ///
    /// The first caller for a (collective, size) simulates; callers asking
    /// for it meanwhile (the other ranks of the call) wait for that result
    /// instead of simulating too.
    pub fn verdict(
        &self,
        collective: Collective,
        size: usize,
    ) -> Result<Arc<Verdict>, TopologyError> {
        let cell = {
            let mut cache = self.lock();
            if cache.len() >= CACHE_LIMIT {
                cache.clear();
            }
            cache.entry((collective, size)).or_default().clone()
        };
        cell.get_or_init(|| self.decide(collective, size)).clone()
    }

    fn decide(&self, collective: Collective, size: usize) -> Result<Arc<Verdict>, TopologyError> {
        self.verdict_among(collective, size, self.evaluate(collective, size)?)
    }

    /// The verdict among candidates already evaluated (what
    /// [`evaluate`](Self::evaluate) returned for `collective` at `size`),
    /// so a caller that shows every candidate simulates each once.
    pub fn verdict_among(
        &self,
        collective: Collective,
        size: usize,
        mut ranked: Vec<(Candidate, Prediction)>,
    ) -> Result<Arc<Verdict>, TopologyError> {
        if ranked.is_empty() {
            return Err(TopologyError::Invalid(format!(
                "no algorithm among {:?} runs {collective}",
                self.algorithms()
            )));
        }
        // The first candidate, in preference order, within the tie margin
        // of the fastest.
        let fastest = ranked
            .iter()
            .map(|(_, p)| p.time_us)
            .fold(f64::INFINITY, f64::min);
        let pick = ranked
            .iter()
            .position(|(_, p)| p.time_us <= fastest * (1.0 + self.options.tie_margin))
            .expect("the fastest is within the margin of itself");
        let (candidate, prediction) = ranked.swap_remove(pick);
        let runner_up = ranked
            .into_iter()
            .filter(|(c, _)| c.family() != candidate.family())
            .min_by(|a, b| a.1.time_us.total_cmp(&b.1.time_us))
            .map(|(c, p)| (c, p.time_us));
        let verdict = Arc::new(Verdict {
            candidate,
            prediction,
            runner_up,
        });
        tracing::trace!(
            topology = %self.topology.name,
            "{collective} {size} B on {} ranks: {}",
            self.world_size,
            verdict.explain()
        );
        Ok(verdict)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Collective, usize), Arc<VerdictCell>>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Selector for TopologySelector {
    fn select(&self, collective: Collective, world_size: u32, bytes: usize) -> Option<Selection> {
        if world_size != self.world_size {
            return None;
        }
        match self.verdict(collective, bytes) {
            Ok(v) => Some(Selection {
                choice: v.candidate.choice.clone(),
                max_chunk_bytes: Some(v.candidate.max_chunk_bytes),
                protocol: v.candidate.protocol,
                why: format!("selected on `{}`: {}", self.topology.name, v.explain()),
            }),
            Err(e) => {
                tracing::warn!(
                    "selector on `{}` failed, using the fixed rule: {e}",
                    self.topology.name
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests;
