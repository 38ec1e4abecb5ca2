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
    #[error("NCCL: rank {rank}: {what} did not finish within {timeout:?}; communicator aborted")]
    Timeout {
        /// The rank that gave up.
        rank: ferrocoll_core::Rank,
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
    /// A stream-ordered call refused before anything was enqueued.
    #[error(transparent)]
    Argument(#[from] ferrocoll_device::ArgumentError),
}

impl From<NcclError> for CommError {
    /// Timeouts become [`CommError::Timeout`], like every executor's;
    /// everything else is a [`CommError::Backend`] that keeps the error.
    fn from(e: NcclError) -> Self {
        match e {
            NcclError::Timeout {
                rank,
                what,
                timeout,
            } => CommError::Timeout {
                rank,
                timeout,
                what: format!("NCCL to finish {what} (communicator aborted)"),
            },
            other => CommError::backend("nccl", other),
        }
    }
}

impl From<cudarc::driver::DriverError> for NcclError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        NcclError::Cuda(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_become_comm_timeouts_and_the_rest_stays_typed() {
        let timeout = std::time::Duration::from_millis(250);
        let e = CommError::from(NcclError::Timeout {
            rank: 3,
            what: "all-reduce".into(),
            timeout,
        });
        assert!(
            matches!(&e, CommError::Timeout { rank: 3, timeout: t, what } if *t == timeout && what.contains("all-reduce")),
            "{e:?}"
        );
        let e = CommError::from(NcclError::MissingSymbol("ncclCommSplit"));
        let CommError::Backend { backend, source } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*backend, "nccl");
        assert_eq!(
            source.downcast_ref::<NcclError>(),
            Some(&NcclError::MissingSymbol("ncclCommSplit"))
        );
    }
}
