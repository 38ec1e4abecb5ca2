//! The CPU executor: ranks are threads of one process, exchanging through
//! shared memory, running any [`crate::Verified`] schedule.
//!
//! ```
//! use ferrocoll_core::cpu::{self, CpuConfig};
//! use ferrocoll_core::comm::Communicator;
//! use ferrocoll_core::ReduceOp;
//!
//! let results = cpu::run(4, &CpuConfig::default(), |comm| {
//!     let mine = vec![comm.rank() as f32 + 1.0; 1000];
//!     let mut sum = vec![0.0f32; 1000];
//!     comm.all_reduce(&mine, &mut sum, ReduceOp::Sum)?;
//!     Ok(sum[0])
//! });
//! for r in results {
//!     assert_eq!(r.unwrap(), 10.0);
//! }
//! ```
//!
//! Waits are bounded by [`CpuConfig::timeout`]; a rank that errors, times
//! out or panics marks the group failed, and every other rank's pending and
//! later calls return [`CommError::PeerFailed`](crate::comm::CommError::PeerFailed)
//! instead of hanging.

mod communicator;
mod executor;
mod group;
mod kernels;
mod plan;
mod select;

pub use communicator::{AbortHandle, CpuCommunicator, group, run};
pub use kernels::{Reduce, reduce_slices};
pub use select::auto_algorithm;

use std::sync::Arc;
use std::time::Duration;

use crate::algorithms::Algorithm;
use crate::choose::SharedChooser;
use crate::verify::Verified;

/// Settings of a CPU group. Every rank of a group shares them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuConfig {
    /// The longest any wait may last before the rank gives up and fails the group.
    pub timeout: Duration,
    /// Force an algorithm; `None` asks `chooser`, then [`auto_algorithm`].
    pub algorithm: Option<Algorithm>,
    /// Picks the algorithm of calls that do not force one (the facade
    /// plugs in the topology-aware selector); `None` uses [`auto_algorithm`].
    /// A chooser's plan brings its own channels and chunk size, which then
    /// replace `channels` and `max_chunk_bytes` for that call; leave it
    /// `None` to set those yourself.
    pub chooser: Option<SharedChooser>,
    /// Channels for ring, tree and direct.
    pub channels: u32,
    /// The largest chunk, in bytes, moved in one step; larger buffers run
    /// in several segments that pipeline through the links. Tests make it
    /// tiny so small inputs still cross many segments.
    pub max_chunk_bytes: usize,
    /// Messages each link holds in flight (at least the verifier's 2).
    pub slots_per_link: u32,
    /// A schedule of your own: every call whose collective (with its root)
    /// and world size match it runs this schedule; other calls use
    /// `algorithm` or `auto`.
    pub schedule: Option<Arc<Verified>>,
}

impl Default for CpuConfig {
    fn default() -> Self {
        CpuConfig {
            timeout: Duration::from_secs(60),
            algorithm: None,
            chooser: None,
            channels: 1,
            // Every segment boundary is a round of hand-offs between ranks;
            // with zero-copy messages little is gained from finer
            // pipelining. Measured on 2 cores, 64 MiB all-reduce: 4 MiB
            // beat 1 MiB by 0.1–0.2 of the memory-bandwidth ceiling at 4
            // ranks and matched it at 2 (docs/benchmarks.md).
            max_chunk_bytes: 4 << 20,
            slots_per_link: 4,
            schedule: None,
        }
    }
}
