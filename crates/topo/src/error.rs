//! Errors of the topology crate.

use thiserror::Error;

/// A topology that cannot be built, loaded, discovered or used.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum TopologyError {
    /// The graph breaks an invariant of [`crate::Topology`].
    #[error("invalid topology: {0}")]
    Invalid(String),
    /// A file or link names a node that is not there.
    #[error("unknown node `{0}`")]
    UnknownNode(String),
    /// No path joins two devices.
    #[error("no path from {from} to {to}")]
    Unreachable {
        /// Source device.
        from: String,
        /// Destination device.
        to: String,
    },
    /// The JSON does not parse or does not fit the format.
    #[error("topology file, line {line} column {column}: {message}")]
    Json {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What serde said.
        message: String,
    },
    /// The file is JSON but not a ferrocoll topology.
    #[error("not a ferrocoll topology file (format field: {found:?})")]
    NotATopologyFile {
        /// The `format` field found, if any.
        found: Option<String>,
    },
    /// A topology file of another format version.
    #[error(
        "topology file version {found:?} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// The version found.
        found: Option<u32>,
        /// The version this build reads.
        supported: u32,
    },
    /// `nvidia-smi topo -m` text that does not parse.
    #[error("nvidia-smi topo -m, line {line}: {message}")]
    Smi {
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// NCCL topology XML that does not parse.
    #[error("NCCL topology XML, line {line} (<{element}>): {message}")]
    NcclXml {
        /// 1-based line.
        line: usize,
        /// The element being read.
        element: String,
        /// What is wrong.
        message: String,
    },
    /// NVML could not be loaded or queried.
    #[error("NVML discovery: {0}")]
    Nvml(String),
    /// No preset of that name.
    #[error("no preset named `{name}`; known: {known}")]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// The presets there are.
        known: String,
    },
    /// A file could not be read.
    #[error("{path}: {message}")]
    Io {
        /// The path.
        path: String,
        /// The OS error.
        message: String,
    },
    /// The question needs more work than the tool's budget allows
    /// ([`crate::work`]).
    #[error(
        "this needs more than the work budget of {limit} steps (simulated instructions and search steps): ask for less — fewer sizes (-b/-e/-f), ranks or algorithms — or raise FERROCOLL_WORK_BUDGET"
    )]
    Budget {
        /// The budget that ran out.
        limit: u64,
    },
    /// More ranks than the built-in schedules are made for.
    #[error(
        "{ranks} ranks is more than the {limit} the built-in schedules are made for (their proofs and plans grow as n² and more): ask for fewer (--ranks, --gpus)"
    )]
    TooManyRanks {
        /// Ranks asked for.
        ranks: u32,
        /// The most there may be.
        limit: u32,
    },
    /// The schedule needs more ranks than the topology has devices.
    #[error("the schedule has {ranks} ranks but the topology `{topology}` has {devices} devices")]
    TooFewDevices {
        /// Ranks in the schedule.
        ranks: u32,
        /// Devices in the topology.
        devices: usize,
        /// The topology.
        topology: String,
    },
}
