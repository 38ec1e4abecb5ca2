//! A rank's dump: its recorder's ring as one JSON file, written
//! atomically and named by host, group and rank.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::call::{CallRecord, Identity, QueuedRecord, now_us};

/// The `format` every dump carries.
pub const FORMAT: &str = "ferrocoll-trace/1";

/// One rank's recorded calls, as written to its file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dump {
    /// [`FORMAT`].
    pub format: String,
    /// The host's name.
    pub host: String,
    /// The writing process.
    pub pid: u32,
    /// The group (the same on each of its ranks).
    pub group: String,
    /// This rank in the group.
    pub rank: u32,
    /// The group's size.
    pub world_size: u32,
    /// `threads`, `processes`, …
    pub executor: String,
    /// Why this dump was written.
    pub reason: String,
    /// When, µs since the Unix epoch.
    pub written_us: u64,
    /// Older calls that no longer fit the ring.
    pub dropped: u64,
    /// The calls, oldest first.
    pub calls: Vec<CallRecord>,
    /// Calls queued on an `AsyncCommunicator` behind them, not started,
    /// oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued: Vec<QueuedRecord>,
}

impl Dump {
    pub(super) fn of<'a>(
        identity: &Identity,
        dropped: u64,
        calls: impl IntoIterator<Item = &'a CallRecord>,
        queued: Vec<QueuedRecord>,
        reason: &str,
    ) -> Dump {
        Dump {
            format: FORMAT.to_owned(),
            host: crate::host::name(),
            pid: std::process::id(),
            group: identity.group.clone(),
            rank: identity.rank,
            world_size: identity.world_size,
            executor: identity.executor.to_owned(),
            reason: reason.to_owned(),
            written_us: now_us(),
            dropped,
            calls: calls.into_iter().cloned().collect(),
            queued,
        }
    }

    /// The file this dump goes to in `dir`.
    pub fn file_name(&self) -> String {
        let clean = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect()
        };
        format!(
            "{}.{}.r{}.json",
            clean(&self.host),
            clean(&self.group),
            self.rank
        )
    }

    /// Write into `dir` (created if missing) through a temporary file
    /// renamed into place; a failure is a warning, never an error of the
    /// call that caused the dump.
    pub fn write_into(&self, dir: &Path) -> Option<PathBuf> {
        let path = dir.join(self.file_name());
        let temporary = dir.join(format!(".{}.{}.tmp", self.file_name(), self.pid));
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| {
                let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
                std::fs::write(&temporary, text)
            })
            .and_then(|()| std::fs::rename(&temporary, &path));
        match written {
            Ok(()) => Some(path),
            Err(e) => {
                let _ = std::fs::remove_file(&temporary);
                tracing::warn!("flight recorder: cannot write {}: {e}", path.display());
                None
            }
        }
    }
}
