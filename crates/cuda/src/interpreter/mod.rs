//! The execution plan interpreted on the device: the launch path.
//!
//! Each rank runs one persistent launch per call (a thread block per
//! channel) that walks its part of the device program
//! ([`crate::program`]), reading peers' buffers in place and storing into
//! them over NVLink/P2P where ranks address each other's memory, and
//! synchronising through counters in peer-mapped memory. A group sets up
//! everything once — windows, state, the failure board, each plan's tables
//! on its first call — so a call is one launch on the caller's stream:
//! capturable, with no allocation or host wait.
//!
//! Ranks are threads of one process ([`group`], several may share a GPU)
//! or one per process and GPU ([`ipc::join`], windows shared by CUDA IPC
//! handles, every message staged). Messages travel in bulk or, for small
//! calls, as LL lines (`program::Protocol`).
//!
//! Invariants: ranks sharing a GPU are threads of one process, and every
//! rank's blocks are resident at once (checked when the group opens);
//! windows are in device memory where every pair of devices has peer
//! access and in host memory every GPU maps otherwise; every wait on the
//! device and on the host is bounded by the configured timeout; a failure
//! anywhere raises every rank's alarm and is on the board, which every
//! rank's `check` reads, so no rank waits out a dead peer. The protocol
//! runs on CPU threads in the tests (`host_kernel`).

mod board;
mod communicator;
mod engine;
mod error;
mod host;
pub mod ipc;
mod lasts;
mod loaded;
mod mapped;
mod memory;
mod residency;
pub(crate) mod setup;
mod threads;

use std::sync::Arc;

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;
use ferrocoll_device::DeviceCommunicator;

pub use communicator::CudaCommunicator;
pub use engine::{Engine, KernelFacts, THREADS};
pub use error::InterpreterError;

use crate::config::CudaConfig;
use crate::error::CudaError;

/// Open a group with one rank per entry of `devices` (a device may
/// repeat: its ranks then share it, each with its own stream).
pub fn group(devices: &[usize], config: &CudaConfig) -> Result<Vec<CudaCommunicator>, CudaError> {
    let group = Arc::new(setup::Group::open(devices, config)?);
    (0..devices.len() as Rank)
        .map(|r| CudaCommunicator::new(r, group.clone()))
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
    F: Fn(&mut CudaCommunicator) -> Result<R, CommError> + Sync,
{
    let comms = group(devices, config)?;
    Ok(threads::run_ranks(
        comms,
        DeviceCommunicator::rank,
        &f,
        |c, _| c.abort(),
    ))
}
