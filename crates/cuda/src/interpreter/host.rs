//! The host-slice [`Communicator`] on the interpreter: each call's slices
//! staged through device memory on the rank's own stream. It exists so the
//! conformance kit and the bench drive the device executor like every
//! other; it allocates and waits per call, which the stream-ordered API
//! ([`DeviceCommunicator`]) never does.

use cudarc::driver::result;

use super::memory::Pool;
use ferrocoll_core::comm::{Call, Checked, CommError, Communicator};
use ferrocoll_core::types::CallShape;
use ferrocoll_core::{Collective, DataType, Rank, ReduceOp};
use ferrocoll_device::{DeviceCall, DeviceCommunicator};

use super::communicator::CudaCommunicator;
use super::memory::Current;
use crate::error::CudaError;

impl Communicator for CudaCommunicator {
    fn rank(&self) -> Rank {
        DeviceCommunicator::rank(self)
    }

    fn world_size(&self) -> u32 {
        self.size()
    }

    fn execute(&mut self, call: Call<'_>) -> Result<(), CommError> {
        match call.check(DeviceCommunicator::rank(self), self.size())? {
            Checked::Collective {
                shape,
                input,
                mut output,
            } => self.staged(&shape, input.map(|i| i.as_bytes()), output.as_bytes_mut()),
            Checked::Barrier => {
                // A one-byte all-reduce: no rank returns before every rank
                // has entered (its blocks wait for every peer's message).
                let shape = CallShape {
                    collective: Collective::AllReduce,
                    count: 1,
                    dtype: DataType::U8,
                    op: ReduceOp::Max,
                    in_place: true,
                    purpose: Default::default(),
                };
                self.staged(&shape, None, &mut [0])
            }
            Checked::Send { .. } | Checked::Recv { .. } => Err(CommError::Unsupported {
                what: "point-to-point send and receive on the device interpreter (its \
                       send-recv collective and all-to-all run)"
                    .into(),
            }),
        }
    }

    fn abort(&mut self) {
        DeviceCommunicator::abort(self);
    }
}

impl CudaCommunicator {
    /// Copy the slices to the device, run the call on the rank's stream,
    /// wait, and copy the output back. Stream-ordered allocation and
    /// copies on the rank's own stream: nothing waits for the whole device
    /// while peers sharing it spin in their launches.
    fn staged(
        &mut self,
        shape: &CallShape,
        input: Option<&[u8]>,
        output: &mut [u8],
    ) -> Result<(), CommError> {
        let ctx = self.context().clone();
        let stream = self.stream().clone();
        let s = stream.cu_stream();
        let driver = |e| CommError::from(CudaError::from(e));
        let _current = Current::bind(&ctx).map_err(CommError::from)?;
        let pool = self.pool();
        let mut owned = Vec::new();
        let result = (|| {
            let mut put = |bytes: &[u8]| -> Result<u64, CommError> {
                // SAFETY: the context is current and `s` is its stream;
                // the block is freed on the same stream after the call.
                let ptr = unsafe { pool.alloc(bytes.len(), s) }.map_err(CommError::from)?;
                owned.push(ptr);
                // SAFETY: `ptr` holds the bytes; a copy from pageable
                // memory returns once they are staged.
                unsafe { result::memcpy_htod_async(ptr, bytes, s) }.map_err(driver)?;
                Ok(ptr)
            };
            let call = DeviceCall {
                collective: shape.collective,
                dtype: shape.dtype,
                count: shape.count,
                input: input.map(&mut put).transpose()?,
                output: put(output)?,
                op: shape.op,
            };
            // SAFETY: the blocks hold the slices' lengths, which `check`
            // matched to the call's shape, on this rank's device; they are
            // freed on this stream after the call.
            unsafe { self.enqueue(&call, &stream) }?;
            self.synchronize(&stream)?;
            // SAFETY: the block holds `output.len()` bytes; the call has
            // completed; the stream is waited for before returning.
            unsafe { result::memcpy_dtoh_async(output, call.output, s) }.map_err(driver)?;
            // SAFETY: the rank's own stream.
            unsafe { result::stream::synchronize(s) }.map_err(driver)
        })();
        for ptr in owned {
            // SAFETY: allocated above on this stream; freed once, after
            // (in stream order) everything that used it.
            unsafe { Pool::free(ptr, s) };
        }
        result
    }
}
