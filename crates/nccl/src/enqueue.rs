//! Handing one collective to NCCL on a stream: the one place the
//! collectives' pointers become NCCL calls, for the blocking calls on the
//! communicator's own stream and the stream-ordered ones on the caller's.

use std::ffi::c_void;

use cudarc::driver::CudaStream;
use ferrocoll_core::Collective;
use ferrocoll_device::DeviceCall;
use nccl_rs_sys::{library, ncclResult_t};

use crate::communicator::{NcclCommunicator, nccl_op, nccl_type};
use crate::{NcclError, call, check};

impl NcclCommunicator {
    /// Enqueue `call` on `stream` and return once NCCL has taken it (a
    /// non-blocking communicator may report the enqueue itself "in
    /// progress"; that is waited out, the GPU's work is not).
    ///
    /// # Safety
    /// As [`DeviceCommunicator::enqueue`](ferrocoll_device::DeviceCommunicator::enqueue).
    pub(crate) unsafe fn issue(
        &mut self,
        call: &DeviceCall,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        self.live()?;
        let lib = library()?;
        self.context().bind_to_thread()?;
        let t = nccl_type(call.dtype);
        let o = nccl_op(call.op);
        let count = call.count;
        let block = (count * call.dtype.size_bytes()) as u64;
        let me = u64::from(self.rank_id());
        let s = stream.cu_stream() as nccl_rs_sys::cudaStream_t;
        let c = self.raw();
        let p = |x: u64| x as *mut c_void;
        let (input, output) = (call.input, call.output);
        let r = match call.collective {
            Collective::AllReduce => {
                let send = input.unwrap_or(output);
                // SAFETY: `count` elements in both buffers (caller).
                unsafe { call!(lib, ncclAllReduce(p(send), p(output), count, t, o, c, s)) }
            }
            Collective::ReduceScatter => {
                let (send, recv) = match input {
                    Some(i) => (i, output),
                    None => (output, output + me * block),
                };
                // SAFETY: send holds n blocks, recv one (caller).
                unsafe { call!(lib, ncclReduceScatter(p(send), p(recv), count, t, o, c, s)) }
            }
            Collective::AllGather => {
                let send = input.unwrap_or(output + me * block);
                // SAFETY: send holds one block, recv n (caller).
                unsafe { call!(lib, ncclAllGather(p(send), p(output), count, t, c, s)) }
            }
            Collective::Broadcast { root } => {
                let send = input.unwrap_or(output);
                let root = root as i32;
                // SAFETY: `count` elements in both buffers (caller).
                unsafe { call!(lib, ncclBroadcast(p(send), p(output), count, t, root, c, s)) }
            }
            Collective::Reduce { root } => {
                let send = input.unwrap_or(output);
                let root = root as i32;
                // SAFETY: `count` elements in both buffers (caller).
                unsafe { call!(lib, ncclReduce(p(send), p(output), count, t, o, root, c, s)) }
            }
            Collective::AllToAll => {
                let send = input
                    .ok_or_else(|| NcclError::Invalid("all-to-all has no in-place form".into()))?;
                if let Ok(f) = lib.ncclAlltoAll.as_ref() {
                    // SAFETY: both buffers hold n blocks (caller).
                    unsafe { f(p(send), p(output), count, t, c, s) }
                } else {
                    let n = self.size_n();
                    // SAFETY: both buffers hold n blocks (caller).
                    unsafe {
                        crate::all_to_all::grouped(lib, [send, output], block, count, t, n, c, s)?
                    }
                }
            }
            Collective::SendRecv => {
                return Err(NcclError::Invalid(
                    "use send and recv for point-to-point".into(),
                ));
            }
        };
        match r {
            ncclResult_t::ncclInProgress => self.settle("enqueueing a collective"),
            other => check(other).map_err(|e| self.fail(e)),
        }
    }
}
