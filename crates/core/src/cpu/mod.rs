//! The CPU executor: ranks are threads of one process, exchanging through
//! shared memory, running any [`crate::Verified`] schedule.
//!
//! ```
//! use ferrocoll_core::cpu::{self, CpuConfig};
//! use ferrocoll_core::comm::{Communicator, CommunicatorExt};
//! use ferrocoll_core::ReduceOp;
//!
//! let results = cpu::run(4, &CpuConfig::default(), |comm| {
//!     let mine = vec![comm.rank() as f32 + 1.0; 1000];
//!     let mut sum = vec![0.0f32; 1000];
//!     comm.all_reduce(&mine, &mut sum, ReduceOp::Sum)?;
//!     Ok(sum[0])
//! });
//! for r in results {
//!     assert_eq!(r.unwrap(), 10.0);
//! }
//! ```
//!
//! Waits are bounded by [`CpuConfig::planning`]`.timeout`; a rank that errors, times
//! out or panics marks the group failed, and every other rank's pending and
//! later calls return [`CommError::PeerFailed`](crate::comm::CommError::PeerFailed)
//! instead of hanging.

mod agree;
mod board;
mod communicator;
mod group;
mod links;
mod oneshot;
mod pin;

pub use communicator::{AbortHandle, CpuCommunicator, group, run};

use crate::comm::{Executor, PlannerSettings, Planning};
use crate::select::host_rule;
use crate::settings::{EnvOverrides, SettingsError};

/// Settings of a CPU group. Every rank of a group shares them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuConfig {
    /// How calls are planned: timeout, algorithm or schedule, selector,
    /// channels (1 unless set), chunk size
    /// ([`HOST_CHUNK_BYTES`](crate::plan::HOST_CHUNK_BYTES) unless set),
    /// slots; without a selector or algorithm, [`host_rule`] picks.
    pub planning: Planning,
    /// [`run`] pins rank `r`'s thread (a thread it creates, gone when it
    /// returns) to the `r`-th CPU this process may use, when every rank
    /// gets one of its own (Linux; elsewhere nothing happens). On by
    /// default: waiting ranks spin, and two that the OS leaves on one core
    /// make every small call several times slower (a 4 KiB all-reduce on
    /// 2 ranks: 30–40 µs unpinned early in a run, 5–10 µs pinned). Turn it
    /// off when those CPUs must be shared with other work of yours.
    /// Communicators from [`group`] run on your threads and are never
    /// pinned.
    pub pin_ranks: bool,
    /// Calls whose world size × input bytes is at most this take the
    /// one-shot protocol (see [`crate::plan::OneShot`]): each rank
    /// publishes its input once and builds its output from its peers' in
    /// one pass, one synchronization per call. 0 turns it off; a forced
    /// `algorithm` or a matching `schedule` also does, for their calls.
    /// Values above [`crate::settings::MAX_ONE_SHOT_BYTES`] count as that
    /// (each rank stages twice the budget over the world size).
    pub one_shot_bytes: usize,
    /// The flight recorder's size and dump directory ([`crate::trace`]);
    /// `None`: `FERROCOLL_TRACE_BUFFER` and `FERROCOLL_TRACE_DIR`.
    pub trace: Option<crate::settings::TraceSettings>,
}

impl Default for CpuConfig {
    /// The built-in settings with the `FERROCOLL_*` environment applied
    /// (see [`crate::settings`]; a malformed variable is logged and
    /// ignored here — [`CpuConfig::from_env`] reports it).
    fn default() -> Self {
        CpuConfig::builtin().with_overrides(&EnvOverrides::read_or_warn())
    }
}

impl CpuConfig {
    /// The built-in settings, whatever the environment says.
    pub fn builtin() -> Self {
        CpuConfig {
            planning: Planning::default(),
            pin_ranks: true,
            one_shot_bytes: crate::plan::ONE_SHOT_BYTES,
            trace: None,
        }
    }

    /// The built-in settings with the `FERROCOLL_*` environment applied;
    /// a malformed variable is an error.
    pub fn from_env() -> Result<Self, SettingsError> {
        CpuConfig::builtin().with_env()
    }

    /// These settings with the `FERROCOLL_*` environment applied on top.
    pub fn with_env(self) -> Result<Self, SettingsError> {
        Ok(self.with_overrides(&EnvOverrides::read()?))
    }

    fn with_overrides(mut self, env: &EnvOverrides) -> Self {
        self.planning = self.planning.with_overrides(env);
        if let Some(bytes) = env.one_shot_bytes {
            self.one_shot_bytes = bytes;
        }
        self
    }

    /// How the group plans its calls.
    pub fn planner_settings(&self) -> PlannerSettings {
        self.planning.settings(Executor {
            rule: host_rule,
            channels: 1,
            max_chunk_bytes: crate::plan::HOST_CHUNK_BYTES,
            max_message_bytes: None,
            max_ll_message_bytes: None,
            max_channels: None,
            one_shot_bytes: self.one_shot_bytes,
        })
    }

    /// Slots each link gets (see [`crate::comm::link_slots`]).
    pub(crate) fn link_slots(&self) -> u32 {
        self.planning.link_slots()
    }
}
