//! The versioned JSON form of a schedule: full-word field names, empty
//! fields left out, lossless in both directions.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{RankProgram, Schedule};
use crate::error::ScheduleFileError;
use crate::types::Collective;

/// The schedule file format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleFile {
    version: u32,
    name: String,
    collective: Collective,
    world_size: u32,
    chunks_per_block: u32,
    #[serde(default)]
    scratch_chunks: u32,
    ranks: Vec<RankProgram>,
}

#[derive(Deserialize)]
struct VersionOnly {
    version: Option<u32>,
}

impl Schedule {
    /// The schedule as pretty-printed JSON (format [`FORMAT_VERSION`]).
    pub fn to_json(&self) -> String {
        let file = ScheduleFile {
            version: FORMAT_VERSION,
            name: self.name.clone(),
            collective: self.collective,
            world_size: self.world_size,
            chunks_per_block: self.chunks_per_block,
            scratch_chunks: self.scratch_chunks,
            ranks: self.ranks.clone(),
        };
        serde_json::to_string_pretty(&file).expect("a schedule always serializes")
    }

    /// Parse a schedule from JSON. The result is not verified yet.
    pub fn from_json(text: &str) -> Result<Schedule, ScheduleFileError> {
        // Check the version first so that a newer file gets a clear error,
        // not a complaint about a field this build does not know.
        let probe: VersionOnly = serde_json::from_str(text)?;
        match probe.version {
            Some(FORMAT_VERSION) => {}
            Some(found) => {
                return Err(ScheduleFileError::UnsupportedVersion {
                    found,
                    supported: FORMAT_VERSION,
                });
            }
            None => {
                return Err(ScheduleFileError::Malformed(
                    serde::de::Error::missing_field("version"),
                ));
            }
        }
        let file: ScheduleFile = serde_json::from_str(text)?;
        Ok(Schedule {
            name: file.name,
            collective: file.collective,
            world_size: file.world_size,
            chunks_per_block: file.chunks_per_block,
            scratch_chunks: file.scratch_chunks,
            ranks: file.ranks,
        })
    }

    /// Read and parse a schedule file: JSON, or MSCCL XML when its name
    /// ends in `.xml` ([`super::msccl`]).
    pub fn load(path: impl AsRef<Path>) -> Result<Schedule, ScheduleFileError> {
        let path = path.as_ref();
        let text = crate::input::read_text(path).map_err(|source| ScheduleFileError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let xml = super::msccl::is_msccl_path(path);
        let parsed = if xml {
            Schedule::from_msccl_xml(&text).map_err(ScheduleFileError::from)
        } else {
            Schedule::from_json(&text)
        };
        parsed.map_err(|error| ScheduleFileError::InFile {
            path: path.display().to_string(),
            error: Box::new(error),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_file_is_named_in_its_error() {
        let path =
            std::env::temp_dir().join(format!("fc-bad-schedule-{}.json", std::process::id()));
        std::fs::write(&path, "{\"version\": 1, ").unwrap();
        let err = Schedule::load(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).ok();
        assert!(err.starts_with(&path.display().to_string()), "{err}");
        assert!(err.contains("line 1 column"), "{err}");
    }

    #[test]
    fn unknown_fields_and_versions_are_rejected_with_context() {
        let err = Schedule::from_json(r#"{"version": 2}"#).unwrap_err();
        assert!(matches!(
            err,
            ScheduleFileError::UnsupportedVersion { found: 2, .. }
        ));
        let err = Schedule::from_json(r#"{"name": "x"}"#).unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
        let text = r#"{"version": 1, "name": "x", "collective": {"kind": "all_reduce"},
            "world_size": 1, "chunks_per_block": 1,
            "ranks": [{"channels": [[{"read": {"buffer": "input", "chunk": 0}, "wrte": null}]]}]}"#;
        let err = Schedule::from_json(text).unwrap_err();
        assert!(err.to_string().contains("wrte"), "{err}");
        assert!(err.to_string().contains("line 3"), "{err}");
    }
}
