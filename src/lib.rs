//! # ferrocoll
//!
//! Collective communication for Rust: all-reduce and its siblings as
//! **schedules that are data**, proven correct by a symbolic verifier
//! before anything runs.
//!
//! This facade re-exports [`ferrocoll_core`], reads the environment
//! ([`env`](mod@env), the only place that does) and ships the `ferrocoll`
//! command-line tool (`bench`, `verify`, `schedule`, `launch`, ...).
//!
//! Cargo features (all on by default): `cli` (the tool and its crates),
//! `log` (`ferrocoll::log::init`), `topo` (`ferrocoll::topo`,
//! `ferrocoll::auto`), `gpu` (`ferrocoll::cuda`, `ferrocoll::nccl`). With
//! `default-features = false` a library gets the core, the thread and
//! process executors and the `env://` bootstrap only.
//!
//! ```
//! use ferrocoll::{generate, verify, Algorithm, AlgorithmParams, Collective, VerifyOptions};
//!
//! let schedule = generate(Algorithm::Ring, Collective::AllReduce, 8, &AlgorithmParams::default())?;
//! let verified = verify(schedule, &VerifyOptions::default())?;
//! assert_eq!(verified.schedule().message_count(), 8 * 2 * 7);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub use ferrocoll_core::*;
/// The CUDA executor (libraries loaded at run time; a typed error without them).
#[cfg(feature = "gpu")]
pub use ferrocoll_cuda as cuda;
/// NCCL behind the same `Communicator` trait (loaded at run time).
#[cfg(feature = "gpu")]
pub use ferrocoll_nccl as nccl;
/// Ranks as processes: the same schedules over shared memory or TCP.
pub use ferrocoll_process as process;
/// The rendezvous store processes meet at (`env://` bootstrap).
pub use ferrocoll_rendezvous as rendezvous;
/// The topology crate: link graph, sources, simulator, search and selector.
#[cfg(feature = "topo")]
pub use ferrocoll_topo as topo;

#[cfg(feature = "topo")]
pub mod auto;
pub mod env;
#[cfg(feature = "log")]
pub mod log;

/// Facts about this build, from `build.rs`.
pub mod build_info {
    /// The target triple the crate was compiled for.
    pub const TARGET: &str = env!("FERROCOLL_BUILD_TARGET");
    /// The cargo profile (`debug` or `release`).
    pub const PROFILE: &str = env!("FERROCOLL_BUILD_PROFILE");
}
