//! What a recorder keeps of one call, and whose recorder it is.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::types::CallShape;

/// How a call ended, or that it has not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum CallState {
    /// Entered, not returned.
    Running,
    /// Returned its result.
    Done,
    /// Returned an error (its text).
    Failed(String),
}

/// One call as its rank saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The call's number on its communicator (collectives and barriers
    /// count; every rank numbers alike).
    pub call: u64,
    /// What was called: `all-reduce`, `broadcast(root 2)`, `barrier`.
    pub collective: String,
    /// Element type (empty for a barrier).
    pub dtype: String,
    /// Elements per block.
    pub count: usize,
    /// Reduction.
    pub op: String,
    /// One buffer instead of two.
    pub in_place: bool,
    /// What ran: the algorithm or schedule, or `one-shot`; `None` until
    /// the call was planned.
    pub algorithm: Option<String>,
    /// The plan's hash (what ranks agree on), where one was compiled.
    pub plan: Option<String>,
    /// When an `AsyncCommunicator` queued it, µs since the Unix epoch
    /// (`None`: called directly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_us: Option<u64>,
    /// Entry, µs since the Unix epoch.
    pub started_us: u64,
    /// Return, µs since the Unix epoch.
    pub ended_us: Option<u64>,
    /// How it ended.
    #[serde(flatten)]
    pub state: CallState,
}

impl CallRecord {
    /// What ranks must agree on: the call's description without what ran
    /// or when.
    pub fn signature(&self) -> String {
        if self.collective == "barrier" {
            return "barrier".to_owned();
        }
        format!(
            "{} {} x{} {}{}",
            self.collective,
            self.dtype,
            self.count,
            self.op,
            if self.in_place { " in place" } else { "" }
        )
    }
}

/// A call an `AsyncCommunicator` queued that its progress thread has
/// not started: state "queued".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedRecord {
    /// What was started: `all-reduce f32 x1024 sum in place`.
    pub what: String,
    /// When, µs since the Unix epoch.
    pub queued_us: u64,
}

/// Who a recorder belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The group: the same on every rank of it (a job id, a split's
    /// path).
    pub group: String,
    /// This rank in the group.
    pub rank: u32,
    /// The group's size.
    pub world_size: u32,
    /// `threads`, `processes`, …
    pub executor: &'static str,
}

/// Now, µs since the Unix epoch.
pub(super) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A call as the ring keeps it: the shape as given, text only when a
/// dump is written (a call costs no formatting).
pub(super) struct Entry {
    pub call: u64,
    /// `None`: a barrier.
    pub shape: Option<CallShape>,
    pub algorithm: Option<std::sync::Arc<str>>,
    pub plan: Option<u64>,
    pub queued_us: Option<u64>,
    pub started_us: u64,
    pub ended_us: Option<u64>,
    pub state: CallState,
}

impl Entry {
    pub(super) fn record(&self) -> CallRecord {
        let (collective, dtype, count, op, in_place) = match &self.shape {
            Some(s) => (
                s.collective.to_string(),
                s.dtype.to_string(),
                s.count,
                s.op.to_string(),
                s.in_place,
            ),
            None => ("barrier".into(), String::new(), 0, String::new(), false),
        };
        CallRecord {
            call: self.call,
            collective,
            dtype,
            count,
            op,
            in_place,
            algorithm: self
                .algorithm
                .as_deref()
                .map(str::to_owned)
                .or_else(|| self.shape.is_none().then(|| "agreement".to_owned())),
            plan: self.plan.map(|h| format!("{h:016x}")),
            queued_us: self.queued_us,
            started_us: self.started_us,
            ended_us: self.ended_us,
            state: self.state.clone(),
        }
    }
}
