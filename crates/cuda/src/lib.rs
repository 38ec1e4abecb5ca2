//! # ferrocoll-cuda
//!
//! ferrocoll's CUDA executor: the same verified schedules the CPU executor
//! runs, as a device program one persistent kernel per rank interprets
//! (`cuda/interpret.cu`, compiled by NVRTC at run time), moving data with
//! the SMs' own loads and stores — in place between ranks that address
//! each other's buffers, staged through peers' windows otherwise.
//!
//! | where | what |
//! |---|---|
//! | [`group`], [`run`], [`CudaCommunicator`] | ranks as threads of this process (several may share a GPU); the stream-ordered device API and the host-slice `Communicator` |
//! | [`ipc::join`] | one rank per process and GPU |
//! | [`program`] | the plan lowered to the records the kernel walks, their binary interface and layout |
//! | [`kernels`] | the kernel's source, compiled (and cached) per architecture |
//! | [`probe`], [`info`] | whether CUDA is here, and what it is |
//! | [`GpuProbe`] | link bandwidth and latency between GPUs |
//!
//! Invariants: nothing here calls into the CUDA driver or NVRTC before
//! [`probe`] has seen the library and the symbols it needs, so a machine
//! without them gets a typed [`CudaError::BackendUnavailable`], never a
//! panic; every wait on the device is bounded by the configured timeout.

mod config;
pub mod error;
#[cfg(all(test, unix))]
pub mod host_kernel;
pub mod info;
pub mod interpreter;
pub mod kernels;
mod link_probe;
pub mod probe;
pub mod program;

pub use config::{CudaConfig, DEFAULT_LL_MAX_BYTES, device_rule, staged_rule};
pub use error::CudaError;
pub use interpreter::{CudaCommunicator, InterpreterError, group, ipc, run};
pub use link_probe::GpuProbe;
