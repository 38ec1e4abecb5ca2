//! How a group plans its calls, said once for every executor: the
//! [`Planning`] value each config (`CpuConfig`, `ProcessConfig`,
//! `CudaConfig`) holds, and its one mapping to the planner's settings,
//! where each executor adds only what it alone knows ([`Executor`]: its
//! rule, its defaults, the bounds its transport sets).

use std::sync::Arc;
use std::time::Duration;

use super::planner::{PlannerSettings, link_slots};
use crate::algorithms::Algorithm;
use crate::select::{AlgoFilter, ProtoFilter, Rule, SharedSelector};
use crate::settings::EnvOverrides;
use crate::verify::Verified;

/// How long a wait lasts by default: 10 minutes, torch.distributed's
/// default with NCCL (30 with gloo). A rank that checkpoints, or runs a
/// long evaluation, between two calls must not fail its group; a peer
/// that is certainly gone is noticed without waiting for this (over
/// shared memory in tens of milliseconds, a TCP peer within 2 s, a
/// process's exit at once).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// How a group plans its calls; every rank of a group passes the same.
///
/// [`Planning::default`] is the built-in planning of every executor: what
/// differs between executors (the chunk size, the channels of a GPU) is
/// left `None` here and filled in by the executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planning {
    /// The longest any wait may last before the rank gives up and fails
    /// the group.
    pub timeout: Duration,
    /// Force an algorithm; `None` asks `selector`, then the executor's
    /// rule.
    pub algorithm: Option<Algorithm>,
    /// Which algorithms each collective may run (`FERROCOLL_ALGO` in
    /// NCCL_ALGO's forms): a collective allowed one runs it as if forced,
    /// a selection not allowed gives way to an allowed algorithm.
    pub algorithms: Option<AlgoFilter>,
    /// Which protocols each collective may use on an executor that has
    /// more than one (`FERROCOLL_PROTO` in NCCL_PROTO's forms): a
    /// collective allowed one uses it, whatever the selector chose.
    pub protocols: Option<ProtoFilter>,
    /// A schedule of your own: every call whose collective (with its root)
    /// and world size match it runs this schedule; other calls use
    /// `algorithm` or the selector.
    pub schedule: Option<Arc<Verified>>,
    /// Selects the algorithm of calls that force none (the facade plugs in
    /// the topology-aware selector). It must answer the same on every
    /// rank. A selection brings its own channels and chunk size, which
    /// then replace `channels` and `max_chunk_bytes` for that call.
    pub selector: Option<SharedSelector>,
    /// Channels of forced and rule-picked algorithms (`None`: the
    /// executor's: 1 on hosts, a GPU's fair share of thread blocks).
    pub channels: Option<u32>,
    /// The largest chunk, in bytes, moved in one step; larger buffers run
    /// in segments that pipeline through the links (`None`: the
    /// executor's). Tests make it tiny so small inputs cross many
    /// segments.
    pub max_chunk_bytes: Option<usize>,
    /// Messages each link holds in flight: never fewer than the built-in
    /// schedules were proven with (2), nor than `schedule` was.
    pub slots_per_link: u32,
    /// The host executors' run-time watch over their kernels (on by
    /// default; see [`crate::kernels::KernelWatch`]). Every rank must set
    /// it alike.
    pub kernel_watch: crate::kernels::WatchSettings,
}

impl Default for Planning {
    fn default() -> Self {
        Planning {
            timeout: DEFAULT_TIMEOUT,
            algorithm: None,
            algorithms: None,
            protocols: None,
            schedule: None,
            selector: None,
            channels: None,
            max_chunk_bytes: None,
            slots_per_link: 4,
            kernel_watch: crate::kernels::WatchSettings::default(),
        }
    }
}

/// What an executor adds to a [`Planning`]: its rule, its defaults, and
/// the bounds its links and transport set.
#[derive(Debug, Clone, Copy)]
pub struct Executor {
    /// Picks the algorithm when nothing else does.
    pub rule: Rule,
    /// Channels where the planning names none.
    pub channels: u32,
    /// The chunk size where the planning names none.
    pub max_chunk_bytes: usize,
    /// A hard bound on one message (a transport's slot).
    pub max_message_bytes: Option<usize>,
    /// A hard bound on one low-latency message (`None`: no LL).
    pub max_ll_message_bytes: Option<usize>,
    /// The most channels the executor's links were set up for.
    pub max_channels: Option<u32>,
    /// World size × input bytes up to which calls take the one-shot
    /// protocol (0: the executor has none).
    pub one_shot_bytes: usize,
}

impl Planning {
    /// The planner's settings for `executor`: the one mapping every
    /// executor uses.
    pub fn settings(&self, executor: Executor) -> PlannerSettings {
        PlannerSettings {
            algorithm: self.algorithm,
            algorithms: self.algorithms.clone(),
            protocols: self.protocols.clone(),
            selector: self.selector.clone(),
            channels: self.channels.unwrap_or(executor.channels),
            max_chunk_bytes: self.max_chunk_bytes.unwrap_or(executor.max_chunk_bytes),
            max_message_bytes: executor.max_message_bytes,
            max_ll_message_bytes: executor.max_ll_message_bytes,
            slots_per_link: self.link_slots(),
            schedule: self.schedule.clone(),
            rule: executor.rule,
            one_shot_bytes: executor.one_shot_bytes,
            max_channels: executor.max_channels,
        }
    }

    /// Slots each link gets (see [`link_slots`]).
    pub fn link_slots(&self) -> u32 {
        link_slots(self.slots_per_link, self.schedule.as_deref())
    }

    /// This planning with the `FERROCOLL_*` overrides that concern
    /// planning (`FERROCOLL_ALGO`, `FERROCOLL_PROTO`, `FERROCOLL_TIMEOUT_MS`) applied.
    pub fn with_overrides(mut self, env: &EnvOverrides) -> Self {
        env.apply(&mut self.algorithm, &mut self.timeout);
        env.apply_algorithms(&mut self.algorithms);
        env.apply_protocols(&mut self.protocols);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::host_rule;

    fn executor() -> Executor {
        Executor {
            rule: host_rule,
            channels: 3,
            max_chunk_bytes: 1 << 20,
            max_message_bytes: Some(4096),
            max_ll_message_bytes: None,
            max_channels: Some(8),
            one_shot_bytes: 512,
        }
    }

    #[test]
    fn the_executor_fills_what_the_planning_leaves_open() {
        let s = Planning::default().settings(executor());
        assert_eq!((s.channels, s.max_chunk_bytes), (3, 1 << 20));
        assert_eq!((s.max_message_bytes, s.max_channels), (Some(4096), Some(8)));
        assert_eq!((s.slots_per_link, s.one_shot_bytes), (4, 512));
        let planning = Planning {
            channels: Some(2),
            max_chunk_bytes: Some(64),
            slots_per_link: 1,
            algorithm: Some(Algorithm::Ring),
            ..Planning::default()
        };
        let s = planning.settings(executor());
        assert_eq!((s.channels, s.max_chunk_bytes), (2, 64));
        // Never fewer slots than the built-in schedules were proven with.
        assert_eq!(s.slots_per_link, crate::verify::DEFAULT_SLOTS_PER_LINK);
        assert_eq!(s.algorithm, Some(Algorithm::Ring));
    }
}
