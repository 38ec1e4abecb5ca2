//! Executor v2: the execution plan interpreted on the device.
//!
//! Each rank runs one persistent launch per call (a thread block per
//! channel) that walks its part of the device program
//! ([`crate::program`]) and stores data straight into its peers' inboxes
//! over NVLink/P2P, synchronising through counters in peer-mapped memory.
//! A group sets up everything once — windows, state, the failure board,
//! each plan's tables on its first call — so a call is one launch on the
//! caller's stream: capturable, with no allocation or host wait.
//!
//! Ranks are threads of one process ([`group`], several may share a GPU)
//! or one per process and GPU ([`ipc::join`], windows shared by CUDA IPC
//! handles). Messages travel in bulk or, for small calls, as LL lines
//! (`program::Protocol`).
//!
//! Invariants: ranks sharing a GPU are threads of one process, and every
//! rank's blocks are resident at once (checked when the group opens);
//! devices are pairwise peer-accessible; every wait on the device and on
//! the host is bounded by the configured timeout; a failure anywhere is
//! on the board, which every rank's blocks poll and every rank's `check`
//! reads, so no rank waits out a dead peer. Nothing here has run on a
//! GPU yet: the protocol runs on CPU threads in
//! [`crate::program::emulate`].

mod board;
mod communicator;
mod engine;
mod error;
mod host;
pub mod ipc;
mod loaded;
mod memory;
mod residency;
pub(crate) mod setup;

use std::sync::Arc;

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;
use ferrocoll_device::DeviceCommunicator;

pub use communicator::InterpreterCommunicator;
pub use engine::THREADS;
pub use error::InterpreterError;

use crate::config::CudaConfig;
use crate::error::CudaError;

/// Open a group with one rank per entry of `devices` (a device may
/// repeat: its ranks then share it, each with its own stream).
pub fn group(
    devices: &[usize],
    config: &CudaConfig,
) -> Result<Vec<InterpreterCommunicator>, CudaError> {
    let group = Arc::new(setup::Group::open(devices, config)?);
    (0..devices.len() as Rank)
        .map(|r| InterpreterCommunicator::new(r, group.clone()))
        .collect()
}

/// Run `f` on every rank of a new group, one thread per rank; a rank that
/// errors or panics aborts its communicator, which fails the others'
/// calls through the board.
pub fn run<R, F>(
    devices: &[usize],
    config: &CudaConfig,
    f: F,
) -> Result<Vec<Result<R, CommError>>, CudaError>
where
    R: Send,
    F: Fn(&mut InterpreterCommunicator) -> Result<R, CommError> + Sync,
{
    let comms = group(devices, config)?;
    Ok(crate::threads::run_ranks(
        comms,
        DeviceCommunicator::rank,
        &f,
        |c, _| c.abort(),
    ))
}
