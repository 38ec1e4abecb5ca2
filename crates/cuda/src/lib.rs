//! # ferrocoll-cuda
//!
//! The CUDA executor: the same verified schedules the CPU executor runs,
//! as NVRTC-compiled reduce-copy kernels and peer copies on CUDA streams.
//!
//! Invariants: nothing here calls into the CUDA driver or NVRTC before
//! [`probe`] has seen the library, so a machine without them gets a typed
//! [`CudaError::BackendUnavailable`], never a panic; every wait on the
//! device is bounded by the configured timeout.

pub mod error;
pub mod kernels;
pub mod probe;

pub use error::CudaError;
