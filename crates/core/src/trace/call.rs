//! What a recorder keeps of one call, and whose recorder it is.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

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
