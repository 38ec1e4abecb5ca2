//! # ferrocoll-core
//!
//! The part of ferrocoll that knows no hardware: element types and
//! collectives, the **schedule IR**, the algorithms that generate schedules,
//! and the **symbolic verifier** that proves them.
//!
//! | module | what is there |
//! |---|---|
//! | [`types`] | [`DataType`], [`ReduceOp`], [`Collective`] and their nccl-tests names and busbw factors |
//! | [`schedule`] | [`Schedule`], [`Step`], JSON and ASCII forms |
//! | [`algorithms`] | ring, double binary tree, direct (full mesh), halving-doubling |
//! | [`flow`] | the buffering model every executor implements, and why one run decides deadlock |
//! | [`verify`](mod@verify) | [`verify()`](verify::verify): a [`Schedule`] in, a [`Verified`] schedule or every violation out |
//! | [`plan`] | the [`ExecutionPlan`]: a verified schedule compiled for one call — what every executor and the simulator interpret |
//! | [`replay`] | a serial run of an execution plan on concrete numbers: the oracle executors are tested against |
//! | [`select`] | how `auto` becomes an algorithm: forced, a [`Selector`](select::Selector), an executor's rule |
//! | [`grad_sync`] | gradient buckets: [`GradientSync`](grad_sync::GradientSync) overlapped with backward, [`Bucketer`](grad_sync::Bucketer) blocking, one packing rule |
//! | [`comm`] | the [`Communicator`](comm::Communicator) trait, its one entry point [`Call`](comm::Call), and [`CommError`](comm::CommError) |
//! | [`kernels`] | host reduction kernels ([`Reduce`] for every element type) |
//! | [`cpu`] | the CPU executor: ranks as threads over shared memory |
//! | [`link`] | the link seam of host groups and the executor that runs a plan over any kind of link |
//! | [`conformance`] | the kit every executor is checked with against a serial reference |
//!
//! ## Glossary
//! - **rank** — one participant, `0..n`; **world size** — `n`.
//! - **block** — `count` elements, the unit of a buffer's shape (an
//!   all-gather output is `n` blocks).
//! - **chunk** — what a schedule moves: each block is cut into
//!   `chunks_per_block` chunks.
//! - **segment** — the pipelining slice: a plan cuts every chunk's
//!   elements into `segments` pieces and runs the whole schedule once per
//!   segment, so large buffers stream through the links.
//! - **channel** — an independent, ordered list of steps of one rank
//!   (a thread, a CUDA stream); a **link** is (sender, receiver, channel).
//! - **step** — receive from some peers, combine with a local read, write
//!   locally, send to some peers; every part optional.
//! - **plan** — a verified schedule compiled for one call; its
//!   **instructions** are the steps of every segment with byte regions.
//!
//! ## Invariants
//! - Schedules are independent of the element count, the data type and the
//!   op; [`plan`] is the only place that turns chunks into bytes, steps into
//!   instructions, and `after` references into waits.
//! - Executors run plans compiled from a [`Verified`] schedule and treat any
//!   state the verifier rules out (a missing message, an overrun slot) as a
//!   bug, not an error.
//! - Only [`settings`] reads the environment (the `FERROCOLL_*` variables,
//!   applied by `CpuConfig::default` and the facade's `from_env`;
//!   `builtin()` configurations read nothing). Nothing here touches a GPU;
//!   only [`cpu::run`] spawns threads (one per rank, scoped to the call).

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod algorithms;
pub mod aligned;
pub mod comm;
pub mod conformance;
pub mod cpu;
pub mod error;
pub mod flow;
pub mod grad_sync;
pub mod host;
pub mod input;
pub mod kernels;
pub mod link;
pub mod plan;
pub mod replay;
pub mod schedule;
pub mod select;
pub mod settings;
pub mod trace;
pub mod types;
pub mod verify;
pub mod xml;

/// The 16-bit float types `f16` and `bf16` elements use.
pub use half;

pub use algorithms::{Algorithm, AlgorithmError, AlgorithmParams, generate};
pub use error::{MscclError, ParseNameError, ScheduleFileError, XmlError};
pub use kernels::Reduce;
pub use plan::ExecutionPlan;
pub use schedule::{Schedule, ScheduleBuilder, Step};
pub use types::{Buffer, Collective, CollectiveKind, DataType, Element, Rank, ReduceOp};
pub use verify::{Verified, VerifyError, VerifyOptions, verify};

/// What a program that calls collectives needs in scope.
pub mod prelude {
    pub use crate::comm::{AsyncCommunicator, CommError, Communicator, CommunicatorExt, Work};
    pub use crate::grad_sync::GradientSync;
    pub use crate::kernels::Reduce;
    pub use crate::types::{Collective, DataType, Element, Rank, ReduceOp};
}
