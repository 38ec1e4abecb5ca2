//! NCCL behind the stream-ordered device API: collectives enqueued on
//! the caller's stream, errors found by polling NCCL's async error.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cudarc::driver::{CudaContext, CudaStream};
use ferrocoll_core::Rank;
use ferrocoll_device::{DeviceCall, DeviceCommunicator};
use nccl_rs_sys::{library, ncclResult_t};

use crate::communicator::NcclCommunicator;
use crate::{NcclError, call, check};

// SAFETY: `size` and `context` are NCCL's own (read back from the
// communicator, the context it was created in); `enqueue` hands NCCL the
// call's pointers with the shapes `DeviceCall` describes and nothing more.
unsafe impl DeviceCommunicator for NcclCommunicator {
    type Error = NcclError;

    fn rank(&self) -> Rank {
        self.rank_id()
    }

    fn size(&self) -> u32 {
        self.size_n()
    }

    fn context(&self) -> &Arc<CudaContext> {
        NcclCommunicator::context(self)
    }

    unsafe fn enqueue(&mut self, call: &DeviceCall, stream: &CudaStream) -> Result<(), NcclError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.issue(call, stream) }
    }

    fn check(&mut self) -> Result<(), NcclError> {
        self.live()?;
        if self.group_flag().load(Ordering::Acquire) {
            let e = NcclError::Invalid("another rank of the group failed".into());
            return Err(self.fail(e));
        }
        let lib = library()?;
        let mut state = ncclResult_t::ncclInProgress;
        // SAFETY: a live communicator and a valid out-pointer.
        let r = unsafe { call!(lib, ncclCommGetAsyncError(self.raw(), &mut state)) };
        match check(r).and_then(|()| match state {
            ncclResult_t::ncclInProgress => Ok(()),
            other => check(other),
        }) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn synchronize(&mut self, stream: &CudaStream) -> Result<(), NcclError> {
        self.finish_on(stream, "the stream's collectives")
    }

    fn abort(&mut self) {
        NcclCommunicator::abort(self)
    }
}
