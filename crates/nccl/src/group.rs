//! One NCCL communicator's ranks as threads of this process (the bench
//! and the conformance kit on one machine's GPUs): a failing rank tells
//! the others through a shared flag, so none waits out its timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use crate::NcclError;
use crate::communicator::{NcclCommunicator, NcclConfig, unique_id};

/// Run `f` on `devices.len()` ranks of a new NCCL communicator in this
/// process, one thread per rank (rank `r` on `devices[r]`).
pub fn run<R, F>(
    devices: &[usize],
    config: &NcclConfig,
    f: F,
) -> Result<Vec<Result<R, CommError>>, NcclError>
where
    R: Send,
    F: Fn(&mut NcclCommunicator) -> Result<R, CommError> + Sync,
{
    let id = unique_id()?;
    let n = devices.len() as u32;
    let failed = Arc::new(AtomicBool::new(false));
    let f = &f;
    Ok(std::thread::scope(|scope| {
        let handles: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, &device)| {
                let failed = failed.clone();
                scope.spawn(move || {
                    let mut comm = NcclCommunicator::init_in(
                        &id,
                        rank as Rank,
                        n,
                        device,
                        config,
                        failed.clone(),
                    )
                    .map_err(|e| {
                        failed.store(true, Ordering::Release);
                        CommError::from(e)
                    })?;
                    let out = f(&mut comm);
                    if out.is_err() {
                        failed.store(true, Ordering::Release);
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(CommError::backend(
                        "nccl",
                        NcclError::Invalid("a rank thread panicked".into()),
                    ))
                })
            })
            .collect()
    }))
}
