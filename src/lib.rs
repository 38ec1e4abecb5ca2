//! # ferrocoll
//!
//! Collective communication for Rust — all-reduce and its siblings —
//! where every schedule is **data**, proven correct by a symbolic verifier
//! before anything runs.
//!
//! ## First steps
//!
//! Ranks as threads of this process, [`cpu::run`]:
//!
//! ```
//! use ferrocoll::cpu::{self, CpuConfig};
//! use ferrocoll::prelude::*;
//!
//! // Four ranks; each averages its gradient with the others'.
//! let results = cpu::run(4, &CpuConfig::default(), |comm| {
//!     let mut grad = vec![comm.rank() as f32; 1024];
//!     comm.all_reduce_in_place(&mut grad, ReduceOp::Avg)?;
//!     Ok(grad[0])
//! });
//! assert!(results.into_iter().all(|r| r.unwrap() == 1.5));
//! ```
//!
//! Ranks as processes, one per `ferrocoll launch -n N -- your-program`
//! (or torchrun-, Slurm- or OpenMPI-style variables), through
//! [`env::process_communicator_from_env`]:
//!
//! ```no_run
//! use ferrocoll::prelude::*;
//! use ferrocoll::process::ProcessConfig;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut comm = ferrocoll::env::process_communicator_from_env(&ProcessConfig::default())?;
//! let mut grads = vec![1.0f32; 1 << 20];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
//! # Ok(()) }
//! ```
//!
//! Non-blocking: move a communicator onto its own progress thread with
//! [`AsyncCommunicator`](comm::AsyncCommunicator); each call starts at once
//! and returns a [`Work`](comm::Work) that owns its buffers until
//! [`wait`](comm::Work::wait) gives them back, so the caller computes while
//! data moves. [`GradientSync`](grad_sync::GradientSync) builds DDP-style
//! bucketed gradient averaging on it, and
//! [`split`](comm::Communicator::split) makes tensor × data parallel grids:
//!
//! ```
//! use ferrocoll::comm::AsyncCommunicator;
//! use ferrocoll::cpu::{self, CpuConfig};
//! use ferrocoll::prelude::*;
//!
//! let comms = cpu::group(2, &CpuConfig::default()).unwrap();
//! std::thread::scope(|s| {
//!     for comm in comms {
//!         s.spawn(move || {
//!             let mut comm = AsyncCommunicator::new(comm)?;
//!             let work = comm.iall_reduce(vec![1.0f32; 4096], ReduceOp::Avg);
//!             // ... backward of earlier layers runs here ...
//!             let grads = work.wait()?;
//!             assert_eq!(grads[0], 1.0);
//!             Ok::<(), CommError>(())
//!         });
//!     }
//! });
//! ```
//!
//! Every rank must make the same calls; they are agreed before any data
//! moves, so a mismatch, a dead rank or a timeout is a typed
//! [`CommError`](comm::CommError) on every rank, never a hang. The
//! examples, in order: `01_all_reduce` (minimal),
//! `02_data_parallel_training` (an MLP trained data-parallel, checked
//! against one rank), `03_write_your_own_schedule` (build, break and
//! prove a schedule), `04_custom_vs_nccl` (on a GPU),
//! `05_overlap_gradient_sync` (gradient sync hidden behind backward).
//! `docs/training.md` puts it together, with the `torch.distributed`
//! equivalent of each call.
//!
//! ## Schedules as data
//!
//! Each algorithm generates a schedule that the verifier proves for a
//! world size before it runs:
//!
//! ```
//! use ferrocoll::{generate, verify, Algorithm, AlgorithmParams, Collective, VerifyOptions};
//!
//! let schedule = generate(Algorithm::Ring, Collective::AllReduce, 8, &AlgorithmParams::default())?;
//! let verified = verify(schedule, &VerifyOptions::default())?;
//! assert_eq!(verified.schedule().message_count(), 8 * 2 * 7);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## This crate
//!
//! This facade re-exports [`ferrocoll_core`], reads the launcher's
//! environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, … in
//! [`env`](mod@env)) and ships the `ferrocoll` command-line tool (`bench`,
//! `verify`, `schedule`, `launch`, ...). The `FERROCOLL_*` settings are
//! read in one place, core's `settings`, which every entry point applies;
//! beyond those, the crates below read only what locates their own
//! libraries (CUDA's and NCCL's, from `PATH`, `HOME` and Python
//! environments) and the job secret (`ferrocoll-rendezvous`).
//!
//! Cargo features (all on by default): `cli` (the tool and its crates),
//! `log` (`ferrocoll::log::init`), `topo` (`ferrocoll::topo`,
//! `ferrocoll::auto`), `gpu` (`ferrocoll::cuda`, `ferrocoll::nccl`, `ferrocoll::device`),
//! `candle` (collectives on candle tensors, `ferrocoll::candle`). With
//! `default-features = false` a library gets the core, the thread and
//! process executors and the `env://` bootstrap only.

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub use ferrocoll_core::*;
/// The CUDA executor (libraries loaded at run time; a typed error without them).
#[cfg(feature = "gpu-api")]
pub use ferrocoll_cuda as cuda;
/// The stream-ordered device API: collectives on cudarc device buffers,
/// enqueued on the caller's stream (NCCL implements it).
#[cfg(feature = "gpu-api")]
pub use ferrocoll_device as device;
/// NCCL behind the same `Communicator` trait (loaded at run time).
#[cfg(feature = "gpu-api")]
pub use ferrocoll_nccl as nccl;
#[cfg(feature = "candle")]
pub mod candle;
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
#[cfg(feature = "topo")]
pub mod network;

/// Facts about this build, from `build.rs`.
pub mod build_info {
    /// The target triple the crate was compiled for.
    pub const TARGET: &str = env!("FERROCOLL_BUILD_TARGET");
    /// The cargo profile (`debug` or `release`).
    pub const PROFILE: &str = env!("FERROCOLL_BUILD_PROFILE");
}

/// The README's and the guides' code blocks, compiled (and run, unless a
/// block says `no_run`) as doctests, so the docs cannot drift from the API.
#[cfg(doctest)]
mod docs_compile {
    #[doc = include_str!("../README.md")]
    mod readme {}
    #[doc = include_str!("../docs/architecture.md")]
    mod architecture {}
    #[doc = include_str!("../docs/benchmarks.md")]
    mod benchmarks {}
    #[doc = include_str!("../docs/cpu-executor.md")]
    mod cpu_executor {}
    #[doc = include_str!("../docs/cuda-executor.md")]
    mod cuda_executor {}
    #[doc = include_str!("../docs/diagnostics.md")]
    mod diagnostics {}
    #[doc = include_str!("../docs/nccl.md")]
    mod nccl {}
    #[doc = include_str!("../docs/plan.md")]
    mod plan {}
    #[doc = include_str!("../docs/processes.md")]
    mod processes {}
    #[doc = include_str!("../docs/reliability.md")]
    mod reliability {}
    #[doc = include_str!("../docs/schedules.md")]
    mod schedules {}
    #[doc = include_str!("../docs/synthesis.md")]
    mod synthesis {}
    #[doc = include_str!("../docs/topology.md")]
    mod topology {}
    #[doc = include_str!("../docs/training.md")]
    mod training {}
    #[doc = include_str!("../cuda/README.md")]
    mod cuda_readme {}
}
