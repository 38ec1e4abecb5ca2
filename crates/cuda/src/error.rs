//! Errors of the CUDA executor.

use ferrocoll_core::comm::CommError;
use thiserror::Error;

/// Why CUDA work could not be done.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CudaError {
    /// The driver, NVRTC or a device is not there; nothing was attempted.
    #[error("CUDA backend unavailable: {reason}")]
    BackendUnavailable {
        /// What is missing, and what to install or set.
        reason: String,
    },
    /// NVRTC could not compile the kernels.
    #[error("NVRTC could not compile the ferrocoll kernels for {arch}: {log}")]
    Compile {
        /// The target architecture (`compute_90`).
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// Ranks sharing a GPU need every block of theirs resident at once
    /// (the interpreter's blocks wait on each other); these cannot be.
    #[error(
        "device {device}: the group's ranks need {blocks} thread blocks resident at once; the GPU holds {capacity} of the interpreter's (use fewer ranks or channels on it)"
    )]
    NotResident {
        /// The CUDA ordinal.
        device: usize,
        /// Blocks the group needs there: its ranks' channels.
        blocks: u64,
        /// Blocks per SM times SMs.
        capacity: u64,
    },
    /// A bad argument: device list, buffer sizes, rank.
    #[error("{0}")]
    Invalid(String),
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(e.to_string())
    }
}

impl From<CudaError> for CommError {
    fn from(e: CudaError) -> Self {
        CommError::backend("cuda", e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cuda_error_stays_typed_inside_comm_error() {
        let e = CommError::from(CudaError::Invalid("device 9 does not exist".into()));
        let CommError::Backend { backend, source } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*backend, "cuda");
        assert_eq!(
            source.downcast_ref::<CudaError>(),
            Some(&CudaError::Invalid("device 9 does not exist".into()))
        );
        assert_eq!(e.to_string(), "cuda: device 9 does not exist");
        assert!(std::error::Error::source(&e).is_some());
    }
}
