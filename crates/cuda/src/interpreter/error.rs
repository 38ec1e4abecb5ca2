//! The interpreter's error: what a stream-ordered call reports.

use ferrocoll_core::comm::CommError;
use ferrocoll_device::ArgumentError;
use thiserror::Error;

use crate::error::CudaError;

/// Why an interpreter call failed.
#[derive(Debug, Clone, Error)]
pub enum InterpreterError {
    /// The driver, NVRTC or a device failed or is missing.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The call's arguments were refused before anything was enqueued.
    #[error(transparent)]
    Argument(#[from] ArgumentError),
    /// The collective failed: a mismatch, a timeout, a peer that failed,
    /// a plan that does not fit the group's buffers.
    #[error(transparent)]
    Collective(#[from] CommError),
}

impl From<InterpreterError> for CommError {
    fn from(e: InterpreterError) -> Self {
        match e {
            InterpreterError::Collective(c) => c,
            InterpreterError::Cuda(c) => c.into(),
            InterpreterError::Argument(a) => CommError::backend("cuda", a),
        }
    }
}
