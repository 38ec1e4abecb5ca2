//! Error types shared across modules. Verification failures have their own
//! type in [`crate::verify`](mod@crate::verify); algorithm errors live with the algorithms.

use thiserror::Error;

/// A name (collective, data type, op, algorithm, buffer) that is not one we know.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown {what} `{given}`; expected one of: {}", expected.join(", "))]
pub struct ParseNameError {
    /// What kind of name was being parsed.
    pub what: &'static str,
    /// The text that did not parse.
    pub given: String,
    /// The accepted names.
    pub expected: Vec<&'static str>,
}

impl ParseNameError {
    pub(crate) fn new<const N: usize>(
        what: &'static str,
        given: &str,
        expected: [&'static str; N],
    ) -> Self {
        ParseNameError {
            what,
            given: given.to_owned(),
            expected: expected.to_vec(),
        }
    }
}

/// A schedule file that could not be read.
#[derive(Debug, Error)]
pub enum ScheduleFileError {
    /// Not valid JSON, or not the schedule format; serde's message names the line and column.
    #[error("malformed schedule file: {0}")]
    Malformed(#[from] serde_json::Error),
    /// Written by a newer (or unknown) version of the format.
    #[error(
        "schedule file version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// The version the file declares.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// A file read by [`Schedule::load`](crate::Schedule::load) is not a
    /// schedule: its path and what is wrong.
    #[error("{path}: {error}")]
    InFile {
        /// The path given.
        path: String,
        /// What is wrong with its content.
        error: Box<ScheduleFileError>,
    },
    /// The file could not be opened or read.
    #[error("cannot read schedule file {path}: {source}")]
    Io {
        /// The path given.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}
