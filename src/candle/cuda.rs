//! CUDA tensors through the stream-ordered device API (`candle-cuda`
//! feature): the collective runs on the tensor's own `CudaSlice`,
//! enqueued on the stream of the tensor's candle device, so it is ordered
//! after the kernels that produced the tensor and before those that read
//! it, with no host synchronization. Errors found later surface through
//! the communicator's [`check`](crate::device::DeviceCommunicator::check)
//! and [`synchronize`](crate::device::DeviceCommunicator::synchronize).
//!
//! The tensor must be contiguous: gathering a strided device view would
//! need a kernel of its own (call `.contiguous()` and use the result).

use std::cell::RefCell;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{CpuStorage, CudaStorage, InplaceOp1, Layout, Tensor};
use cudarc::driver::{CudaSlice, CudaStream};

use super::CandleError;
use crate::device::DeviceCommunicator;
use crate::{Element, Rank, ReduceOp};

/// Reduce a CUDA `tensor` across the ranks, in place, on its stream.
pub fn all_reduce<D>(comm: &mut D, tensor: &Tensor, op: ReduceOp) -> Result<(), CandleError>
where
    D: DeviceCommunicator,
    D::Error: Send + Sync + 'static,
{
    on_device(comm, tensor, Kind::AllReduce(op))
}

/// Copy `root`'s CUDA `tensor` into every rank's, in place, on its stream.
pub fn broadcast<D>(comm: &mut D, tensor: &Tensor, root: Rank) -> Result<(), CandleError>
where
    D: DeviceCommunicator,
    D::Error: Send + Sync + 'static,
{
    on_device(comm, tensor, Kind::Broadcast(root))
}

#[derive(Clone, Copy)]
enum Kind {
    AllReduce(ReduceOp),
    Broadcast(Rank),
}

fn on_device<D>(comm: &mut D, tensor: &Tensor, kind: Kind) -> Result<(), CandleError>
where
    D: DeviceCommunicator,
    D::Error: Send + Sync + 'static,
{
    if !tensor.device().is_cuda() {
        return Err(CandleError::Unsupported(format!(
            "the tensor is on {:?}: `ferrocoll::candle::cuda` takes CUDA tensors; CPU tensors go through `ferrocoll::candle`",
            tensor.device().location()
        )));
    }
    if !tensor.is_contiguous() {
        return Err(CandleError::Unsupported(
            "the device API takes contiguous CUDA tensors; call `.contiguous()` first".into(),
        ));
    }
    let op = OnDevice {
        comm: RefCell::new(comm),
        kind,
        failed: RefCell::new(None),
    };
    match tensor.inplace_op1(&op) {
        Ok(()) => Ok(()),
        Err(e) => Err(op.failed.into_inner().unwrap_or(CandleError::Tensor(e))),
    }
}

struct OnDevice<'a, D> {
    comm: RefCell<&'a mut D>,
    kind: Kind,
    failed: RefCell<Option<CandleError>>,
}

impl<D> OnDevice<'_, D>
where
    D: DeviceCommunicator,
    D::Error: Send + Sync + 'static,
{
    fn run<T: Element>(
        &self,
        slice: &mut CudaSlice<T>,
        range: (usize, usize),
        stream: &CudaStream,
    ) -> Result<(), CandleError> {
        let mut view = slice.slice_mut(range.0..range.1);
        let mut comm = self.comm.borrow_mut();
        let r = match self.kind {
            Kind::AllReduce(op) => comm.all_reduce_in_place(&mut view, op, stream),
            Kind::Broadcast(root) => comm.broadcast(&mut view, root, stream),
        };
        r.map_err(|e| CandleError::Device(Box::new(e)))
    }
}

impl<D> InplaceOp1 for OnDevice<'_, D>
where
    D: DeviceCommunicator,
    D::Error: Send + Sync + 'static,
{
    fn name(&self) -> &'static str {
        "ferrocoll-device-collective"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("ferrocoll::candle::cuda takes CUDA tensors")
    }

    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
        let Some(range) = layout.contiguous_offsets() else {
            candle_core::bail!("the device API takes contiguous CUDA tensors")
        };
        let stream = storage.device.cuda_stream();
        let dtype = storage.dtype();
        let r = match &mut storage.slice {
            CudaStorageSlice::F32(s) => self.run(s, range, &stream),
            CudaStorageSlice::F64(s) => self.run(s, range, &stream),
            CudaStorageSlice::F16(s) => self.run(s, range, &stream),
            CudaStorageSlice::BF16(s) => self.run(s, range, &stream),
            CudaStorageSlice::U8(s) => self.run(s, range, &stream),
            CudaStorageSlice::U32(s) => self.run(s, range, &stream),
            CudaStorageSlice::I32(s) => self.run(s, range, &stream),
            CudaStorageSlice::I64(s) => self.run(s, range, &stream),
            _ => Err(super::storage::unsupported_dtype(dtype)),
        };
        r.map_err(|e| {
            let message = e.to_string();
            *self.failed.borrow_mut() = Some(e);
            candle_core::Error::Msg(message)
        })
    }
}
