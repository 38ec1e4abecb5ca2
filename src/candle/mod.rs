//! Collectives on candle tensors (`candle` feature), the way
//! `torch.distributed` works on torch tensors: [`all_reduce`] and
//! [`broadcast`] change the tensor in place, [`all_gather`] and
//! [`reduce_scatter`] return a new one, and [`DataParallel`] averages a
//! model's gradients across ranks after each backward pass (DDP's sync,
//! bucketed).
//!
//! CPU tensors go through the host API ([`Communicator`]) with no copy
//! when they are contiguous: the collective runs on the tensor's own
//! storage, under candle's storage lock (so thread ranks must not share
//! one tensor's storage). A strided view is gathered into a temporary and
//! scattered back, so ranks whose views differ in layout still make the
//! same call (candle itself refuses views whose elements overlap, before
//! the call).
//! Dtypes: f32, f64, f16, bf16, u8, u32, i32, i64.
//!
//! CUDA tensors go through the stream-ordered device API on their
//! `CudaSlice` and the tensor's stream (`candle-cuda` feature,
//! `ferrocoll::candle::cuda`); the host functions refuse them with
//! [`CandleError::Unsupported`].
//!
//! [`Communicator`]: crate::comm::Communicator

#[cfg(feature = "candle-cuda")]
pub mod cuda;
mod data_parallel;
mod host;
mod storage;
#[cfg(test)]
mod tests;

use thiserror::Error;

use crate::comm::CommError;
use crate::grad_sync::SyncError;

pub use data_parallel::DataParallel;
pub use host::{all_gather, all_reduce, broadcast, reduce_scatter};

/// Why a collective on a tensor failed.
#[derive(Debug, Error)]
pub enum CandleError {
    /// The collective itself.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Gradient sync (see [`SyncError`]).
    #[error(transparent)]
    Sync(#[from] SyncError),
    /// candle, building or reading a tensor.
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
    /// The device API's backend (NCCL or ferrocoll's CUDA executor).
    #[error(transparent)]
    Device(Box<dyn std::error::Error + Send + Sync>),
    /// A tensor this function cannot take: its device, dtype or rank.
    #[error("{0}")]
    Unsupported(String),
}

/// A refused gradient sync, its communicator dropped.
impl<C: crate::comm::Communicator + Send + 'static> From<Box<crate::grad_sync::Refused<C>>>
    for CandleError
{
    fn from(refused: Box<crate::grad_sync::Refused<C>>) -> CandleError {
        CandleError::Sync(refused.error)
    }
}
