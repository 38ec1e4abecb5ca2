//! # ferrocoll-cuda
//!
//! The CUDA executors: the same verified schedules the CPU executor runs,
//! as NVRTC-compiled reduce-copy kernels and peer copies on CUDA streams
//! (v1, [`CudaCommunicator`]), and as a device program one persistent
//! kernel per rank interprets ([`interpreter`], v2).
//!
//! Invariants: nothing here calls into the CUDA driver or NVRTC before
//! [`probe`] has seen the library, so a machine without them gets a typed
//! [`CudaError::BackendUnavailable`], never a panic; every wait on the
//! device is bounded by the configured timeout.

mod communicator;
mod config;
pub mod device;
mod enqueue;
pub mod error;
mod group;
pub mod info;
pub mod interpreter;
pub mod kernels;
mod link_probe;
pub mod probe;
pub mod program;
mod threads;

pub use communicator::{CudaCommunicator, CudaElement, group, run};
pub use config::{CudaConfig, device_rule};
pub use error::CudaError;
pub use link_probe::GpuProbe;
