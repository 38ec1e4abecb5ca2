//! Errors of the NCCL communicator.

use ferrocoll_core::comm::CommError;
use nccl_rs_sys::{LoadError, ncclResult_t};
use thiserror::Error;

/// Why an NCCL operation failed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum NcclError {
    /// The library is not installed where we looked.
    #[error(transparent)]
    NotFound(#[from] LoadError),
    /// The loaded NCCL is older than a function we need.
    #[error("the loaded NCCL has no `{0}` (too old?)")]
    MissingSymbol(&'static str),
    /// NCCL returned an error.
    #[error("NCCL: {message} ({code:?})")]
    Nccl {
        /// The result code.
        code: ncclResult_t,
        /// NCCL's description.
        message: String,
    },
    /// A wait outlasted the timeout; the communicator was aborted.
    #[error("NCCL: {what} did not finish within {timeout:?}; communicator aborted")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The timeout.
        timeout: std::time::Duration,
    },
    /// The CUDA driver failed (NCCL needs a GPU).
    #[error("CUDA: {0}")]
    Cuda(String),
    /// A bad argument.
    #[error("{0}")]
    Invalid(String),
}

impl From<NcclError> for CommError {
    fn from(e: NcclError) -> Self {
        CommError::Backend {
            message: e.to_string(),
        }
    }
}

impl From<cudarc::driver::DriverError> for NcclError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        NcclError::Cuda(e.to_string())
    }
}
