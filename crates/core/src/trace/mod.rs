//! The flight recorder: every communicator keeps its last calls (what
//! was called, what ran, when, how it ended) so that after a hang or a
//! failure a user can see which rank stalled in which call.
//!
//! - [`FlightRecorder`] holds a ring of the last `FERROCOLL_TRACE_BUFFER`
//!   calls (default [`DEFAULT_CAPACITY`]; 0 records nothing).
//! - With `FERROCOLL_TRACE_DIR=DIR`, every rank writes its ring to
//!   `DIR/<host>.<group>.r<rank>.json` when a call fails (a timeout, a
//!   lost peer, an abort), when its communicator is dropped, and when the
//!   process gets `SIGUSR1` (then for every communicator it holds). Each
//!   write goes to a temporary file renamed into place, so a reader never
//!   sees half a dump.
//! - A call started on an `AsyncCommunicator` is *queued* until its
//!   progress thread runs it: the dump lists the queued calls
//!   ([`Dump::queued`]) and each started call keeps when it was queued
//!   ([`CallRecord::queued_us`]), so a dump tells a call stuck behind
//!   another from one never started.
//! - [`merge`] reads a directory of dumps and names, per group, the first
//!   call the ranks do not all finish, which ranks never started it, never
//!   finished it or failed it, which ranks left no dump, and calls the
//!   ranks describe differently (`ferrocoll trace DIR`).
//!
//! Invariant: recording never fails a call. A dump that cannot be written
//! is a warning.

mod call;
mod dump;
pub mod merge;
mod record;
mod signal;
mod summary;
#[cfg(test)]
mod tests;

pub use crate::settings::DEFAULT_TRACE_CAPACITY as DEFAULT_CAPACITY;
pub use call::{CallRecord, CallState, Identity, QueuedRecord};
pub use dump::{Dump, FORMAT};
pub use record::FlightRecorder;
pub use summary::{SummaryRow, render as render_summary};

/// The `tracing` span of one collective call (level `info`, target
/// `ferrocoll_core::trace`): what a timeline (`FERROCOLL_TIMELINE`, the
/// facade's `log::init`) draws, one per call, with the rank, the call's
/// number, the collective and its bytes. Free when no subscriber wants
/// it.
pub fn call_span(
    rank: u32,
    call: u64,
    shape: &crate::types::CallShape,
    world_size: u32,
) -> tracing::Span {
    tracing::info_span!(
        "collective",
        rank,
        call,
        op = %shape.collective,
        dtype = %shape.dtype,
        bytes = shape.size_bytes(world_size) as u64,
    )
}
