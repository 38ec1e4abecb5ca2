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
    /// An MSCCL algorithm file (`.xml`) that is not a schedule this build
    /// can run.
    #[error("MSCCL XML: {0}")]
    Msccl(#[from] MscclError),
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

/// An XML document that could not be parsed: the line, the element being
/// read ([`crate::xml::DOCUMENT`] outside any), and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("line {line}, element `{element}`: {message}")]
pub struct XmlError {
    /// 1-based line of the problem.
    pub line: usize,
    /// The element being read.
    pub element: String,
    /// What is wrong.
    pub message: String,
}

/// An MSCCL algorithm that cannot become a ferrocoll schedule, or a
/// schedule that cannot be written as one. `at` names the place in the
/// terms of the side it came from: `line 12, gpu 0 tb 1 step 3` for a
/// file read, `rank 0 channel 1 step 2` for a schedule written.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MscclError {
    /// Not well-formed XML.
    #[error("malformed XML: {0}")]
    Xml(#[from] XmlError),
    /// A required attribute is missing, or its value is unreadable or out
    /// of range.
    #[error("{at}: attribute `{attr}` {problem}")]
    Attribute {
        /// Where.
        at: String,
        /// The attribute.
        attr: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Elements that contradict each other: duplicate ids, a send with no
    /// matching receiving threadblock, a dependency on nothing.
    #[error("{at}: {problem}")]
    Inconsistent {
        /// Where.
        at: String,
        /// What contradicts what.
        problem: String,
    },
    /// A construct of MSCCL's format that ferrocoll's step model has no
    /// equivalent for; refused by name, never skipped.
    #[error("{at}: {construct} is not supported: {why}")]
    Unsupported {
        /// Where.
        at: String,
        /// The construct (a step type, a collective, an attribute value).
        construct: String,
        /// Why it has no ferrocoll equivalent.
        why: String,
    },
    /// A ferrocoll schedule MSCCL's format cannot express.
    #[error("cannot write MSCCL XML: {at}: {why}")]
    Inexpressible {
        /// The step or channel.
        at: String,
        /// Why.
        why: String,
    },
}
