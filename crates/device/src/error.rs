//! What a stream-ordered call refuses before it enqueues anything.

use thiserror::Error;

/// A call whose arguments cannot run: nothing was enqueued on this rank.
/// Its peers may have enqueued their part of the call, and their kernels
/// then wait for this rank: unless every rank refused the call alike,
/// abort the communicator.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ArgumentError {
    /// A buffer's length does not fit the call's shape.
    #[error("{collective}: {buffer} holds {len} elements where {want}")]
    Length {
        /// The collective called.
        collective: String,
        /// Which buffer ("input", "output", "buffer").
        buffer: &'static str,
        /// Its length in elements.
        len: usize,
        /// What the shape needs, in words.
        want: String,
    },
    /// The stream or a buffer belongs to another CUDA context than the
    /// communicator's.
    #[error("{what} is in a context of GPU {found}, not the communicator's (GPU {device})")]
    Device {
        /// The stream or buffer.
        what: &'static str,
        /// Its device ordinal.
        found: usize,
        /// The communicator's.
        device: usize,
    },
    /// A root outside the communicator.
    #[error("root {root} is not a rank of a communicator of {size}")]
    Root {
        /// The root asked for.
        root: u32,
        /// The communicator's size.
        size: u32,
    },
    /// A stream the call cannot be ordered on.
    #[error("{0}")]
    Stream(String),
    /// Out-of-place buffers that overlap.
    #[error("{0}")]
    Overlap(String),
    /// A call the backend does not offer (for example an in-place
    /// all-to-all).
    #[error("{0}")]
    Unsupported(String),
    /// cudarc's event tracking cannot order the call (a capture while it
    /// tracks the buffers), or stored an error around it. Refused before
    /// the call: nothing was enqueued. Found after: the call may have
    /// been enqueued, and the communicator must be aborted.
    #[error("{0}")]
    Tracking(String),
}
