//! Settings of a process group.

use ferrocoll_core::comm::{Executor, PlannerSettings, Planning};
use ferrocoll_core::select::host_rule;
use ferrocoll_core::settings::{EnvOverrides, SettingsError};

use crate::cluster::SharedClusterModel;
use std::fmt;
use std::str::FromStr;

/// How the processes of a group exchange messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// A link per peer (the built-in choice): shared memory between
    /// ranks of one host, the network ([`NetKind`]) between hosts. A
    /// group on one host is a shared-memory group; one rank per host, a
    /// network group.
    Auto,
    /// Shared-memory segments for every pair: every rank on one host (a
    /// group spanning hosts is refused).
    Shm,
    /// TCP connections for every pair, even inside a host: any hosts.
    Tcp,
    /// MPI point-to-point for every pair, even inside a host: a group
    /// formed over MPI (`ProcessCommunicator::connect_mpi`, feature `mpi`;
    /// elsewhere a typed `SetupError::Mpi`).
    Mpi,
}

/// What links ranks on different hosts under [`TransportKind::Auto`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NetKind {
    /// MPI in a group formed over MPI, else TCP.
    #[default]
    Auto,
    /// ferrocoll's own TCP transport.
    Tcp,
    /// MPI point-to-point (a group formed over MPI).
    Mpi,
}

impl fmt::Display for NetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NetKind::Auto => "auto",
            NetKind::Tcp => "tcp",
            NetKind::Mpi => "mpi",
        })
    }
}

impl FromStr for NetKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(NetKind::Auto),
            "tcp" => Ok(NetKind::Tcp),
            "mpi" => Ok(NetKind::Mpi),
            other => Err(format!(
                "unknown network `{other}` (expected auto, tcp or mpi)"
            )),
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransportKind::Auto => "auto",
            TransportKind::Shm => "shm",
            TransportKind::Tcp => "tcp",
            TransportKind::Mpi => "mpi",
        })
    }
}

impl FromStr for TransportKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(TransportKind::Auto),
            "shm" => Ok(TransportKind::Shm),
            "tcp" => Ok(TransportKind::Tcp),
            "mpi" => Ok(TransportKind::Mpi),
            other => Err(format!(
                "unknown transport `{other}` (expected auto, shm, tcp or mpi)"
            )),
        }
    }
}

/// The built-in size of the fragments MPI links cut messages into (see
/// [`ProcessConfig::mpi_fragment_bytes`]).
const MPI_FRAGMENT_BYTES: usize = 63 << 10;

/// The built-in message size: large enough that the per-message cost (a
/// header and a doorbell) is small against the copy, small enough that a
/// segment of 8 ranks stays in the tens of MiB.
const MESSAGE_BYTES: usize = 512 << 10;

/// Settings of a process group; every rank must pass the same ones
/// (the shared-memory segments are sized from them, and the plan of each
/// call must come out the same everywhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessConfig {
    /// Shared memory, TCP, MPI, or each where it fits (the built-in `Auto`).
    pub transport: TransportKind,
    /// What links hosts under `TransportKind::Auto`: TCP, or MPI in a
    /// group formed over MPI (the built-in `Auto` picks MPI there).
    pub net: NetKind,
    /// MPI links: a message longer than this goes as MPI messages of at
    /// most this many bytes, each under the library's eager limit, so no
    /// send waits on the receiver's rendezvous (OpenMPI's TCP transport
    /// sends up to 64 KiB eagerly; the built-in 63 KiB leaves room for its
    /// headers). 0: every message whole — for fabrics whose rendezvous
    /// moves data without the host (RDMA). Each rank picks its own: the
    /// receiver learns from the first fragment how many follow.
    pub mpi_fragment_bytes: usize,
    /// How calls are planned: timeout (a peer that dies is noticed
    /// sooner: shared memory within about 20 ms, TCP when its connection
    /// closes), algorithm or schedule, selector (it must answer the same
    /// in every process: feed it one topology, rank 0's say, not each
    /// process's own measurement), channels (1 unless set), chunk size
    /// (`max_message_bytes` unless set; a message copied through a slot
    /// never exceeds it; see [`heap_planner_settings`](Self::heap_planner_settings)
    /// for calls on the shared heap), slots.
    pub planning: Planning,
    /// The largest message, in bytes: the shared-memory slot size, and the
    /// bound on a step's message over TCP. Chunks are cut so that the
    /// widest step of a schedule fits, except where every message goes
    /// by reference into the shared heap.
    pub max_message_bytes: usize,
    /// Channels the shared-memory segments have room for; a schedule with
    /// more is refused with an error naming this field.
    pub max_channels: u32,
    /// Names the group's shared-memory segments (`FERROCOLL_JOB_ID`, which
    /// `ferrocoll launch` sets), so the launcher can remove what ranks
    /// killed during setup left behind; `None`: names of this group alone.
    pub job_id: Option<String>,
    /// Shared memory: bytes of each rank's shared heap, from which
    /// `ProcessCommunicator::shared_buffer` hands out buffers that peers
    /// read in place (zero copy; allocated and backed at setup, in the
    /// same tmpfs as the segments). 0: none.
    pub shared_heap_bytes: usize,
    /// Calls whose world size × input bytes is at most this take the
    /// one-shot protocol (`ferrocoll_core::plan::OneShot`): each rank
    /// publishes its input as it announces the call (in its segment over
    /// shared memory, inside the announcement over TCP), and builds its
    /// output from its peers' in one pass. 0 turns it off
    /// (`FERROCOLL_ONE_SHOT_BYTES`); a forced algorithm does too.
    pub one_shot_bytes: usize,
    /// Which host this rank is on (`FERROCOLL_HOST_ID`); `None`: the
    /// system's own answer (hostname, boot id, pid namespace and the
    /// device of `/dev/shm`). Ranks count as one host only if their ids
    /// match *and* each can read a probe file the other wrote in shared
    /// memory. Not part of the settings ranks must share.
    pub host_id: Option<String>,
    /// The network between the group's hosts (a rate, a cluster file):
    /// where set and the group spans hosts with nothing forced, calls
    /// are planned by the selector it builds from rank 0's description of
    /// the group ([`crate::ClusterModel`]; the facade's
    /// `ferrocoll::network::cluster_model`, from `FERROCOLL_NET_GBPS` or
    /// `FERROCOLL_CLUSTER`). `None`: all-reduce across equal hosts runs
    /// the hierarchical schedule, other calls the rule.
    pub cluster: Option<SharedClusterModel>,
    /// The flight recorder's size and dump directory
    /// (`ferrocoll_core::trace`); `None`: `FERROCOLL_TRACE_BUFFER` and
    /// `FERROCOLL_TRACE_DIR`. Not part of the settings ranks must share.
    pub trace: Option<ferrocoll_core::settings::TraceSettings>,
}

impl Default for ProcessConfig {
    /// The built-in settings with the `FERROCOLL_*` environment applied
    /// (see [`ferrocoll_core::settings`]; a malformed variable is logged
    /// and ignored here — [`ProcessConfig::from_env`] reports it).
    fn default() -> Self {
        ProcessConfig::builtin().with(EnvOverrides::read_or_warn())
    }
}

impl ProcessConfig {
    /// The built-in settings, whatever the environment says.
    pub fn builtin() -> Self {
        ProcessConfig {
            transport: TransportKind::Auto,
            net: NetKind::Auto,
            mpi_fragment_bytes: MPI_FRAGMENT_BYTES,
            planning: Planning::default(),
            max_message_bytes: MESSAGE_BYTES,
            max_channels: 4,
            job_id: None,
            shared_heap_bytes: 0,
            one_shot_bytes: ferrocoll_core::plan::ONE_SHOT_BYTES,
            host_id: None,
            cluster: None,
            trace: None,
        }
    }

    /// The built-in settings with the `FERROCOLL_*` environment applied;
    /// a malformed variable is an error.
    pub fn from_env() -> Result<Self, SettingsError> {
        ProcessConfig::builtin().with_env()
    }

    /// These settings with the `FERROCOLL_*` environment applied on top.
    pub fn with_env(self) -> Result<Self, SettingsError> {
        Ok(self.with(EnvOverrides::read()?))
    }

    fn with(mut self, env: EnvOverrides) -> Self {
        self.planning = self.planning.with_overrides(&env);
        if env.job_id.is_some() {
            self.job_id = env.job_id;
        }
        if let Some(bytes) = env.one_shot_bytes {
            self.one_shot_bytes = bytes;
        }
        if env.host_id.is_some() {
            self.host_id = env.host_id;
        }
        self
    }

    /// How every rank plans its calls: the same settings in every process,
    /// so every rank compiles the same plans.
    pub fn planner_settings(&self) -> PlannerSettings {
        self.planning.settings(Executor {
            rule: host_rule,
            channels: 1,
            max_chunk_bytes: self.max_message_bytes,
            max_message_bytes: Some(self.max_message_bytes),
            max_ll_message_bytes: None,
            // Shared memory lays out its slots per channel at setup.
            max_channels: self.uses_shm().then_some(self.max_channels),
            // Shared memory publishes inputs in its staging, TCP with the
            // call's announcement.
            one_shot_bytes: self.one_shot_bytes,
        })
    }

    /// How calls whose buffers lie in every rank's shared heap are
    /// planned: as [`planner_settings`](Self::planner_settings), but every
    /// message goes by reference, so the slot size no longer bounds the
    /// chunk. The chunk is the configured one, else the thread executor's
    /// ([`HOST_CHUNK_BYTES`](ferrocoll_core::plan::HOST_CHUNK_BYTES)): the
    /// copies are the same, only the hand-offs between ranks fewer.
    pub fn heap_planner_settings(&self) -> PlannerSettings {
        let mut settings = self.planner_settings();
        settings.max_chunk_bytes = self
            .planning
            .max_chunk_bytes
            .unwrap_or(ferrocoll_core::plan::HOST_CHUNK_BYTES);
        settings.max_message_bytes = None;
        settings
    }

    /// Which calls take the one-shot protocol on `world_size` ranks.
    pub(crate) fn one_shot_rule(&self, world_size: u32) -> ferrocoll_core::plan::OneShotRule {
        self.planner_settings().one_shot_rule(world_size)
    }

    /// Whether ranks of one host link by shared memory.
    pub(crate) fn uses_shm(&self) -> bool {
        matches!(self.transport, TransportKind::Auto | TransportKind::Shm)
    }

    /// Whether hosts link by MPI under `Auto`, in a group formed over MPI
    /// (`over_mpi`) or not.
    pub(crate) fn net_is_mpi(&self, over_mpi: bool) -> bool {
        match self.net {
            NetKind::Auto => over_mpi,
            NetKind::Tcp => false,
            NetKind::Mpi => true,
        }
    }

    /// Slots each link gets (see [`ferrocoll_core::comm::link_slots`]).
    pub(crate) fn link_slots(&self) -> u32 {
        self.planning.link_slots()
    }
}
