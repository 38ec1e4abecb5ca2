//! The rig the host-API tests share: the threads executor with small
//! chunks and a bounded wait, and ranks moved onto progress threads.

use std::time::Duration;

use ferrocoll_core::comm::{AsyncCommunicator, CommError, Planning};
use ferrocoll_core::cpu::{self, CpuCommunicator, CpuConfig};

/// Small chunks (short buffers still cross many segments) and a bound on
/// every wait.
pub fn config() -> CpuConfig {
    CpuConfig {
        planning: Planning {
            timeout: Duration::from_secs(20),
            max_chunk_bytes: Some(256),
            ..CpuConfig::builtin().planning
        },
        ..CpuConfig::builtin()
    }
}

/// Run `f` on `n` threads, each with its rank's communicator moved onto a
/// progress thread.
pub fn run_async<R: Send>(
    n: u32,
    f: impl Fn(AsyncCommunicator<CpuCommunicator>) -> Result<R, CommError> + Sync,
) -> Vec<Result<R, CommError>> {
    let comms = cpu::group(n, &config()).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(AsyncCommunicator::new(c)?))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
