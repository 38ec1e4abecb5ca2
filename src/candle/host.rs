//! Collectives on CPU tensors through the host API.

use std::cell::RefCell;

use candle_core::{CpuStorage, Device, InplaceOp1, Layout, Shape, Storage, Tensor, WithDType};

use super::CandleError;
use super::storage::{OnSlice, OnSliceMut, on_elements, on_elements_mut};
use crate::comm::{CommError, Communicator, CommunicatorExt};
use crate::{Rank, Reduce, ReduceOp};

/// Reduce `tensor` across the ranks, in place: every rank's tensor ends
/// holding the reduction (with [`ReduceOp::Avg`], the mean — DDP's
/// gradient average). Clones of the tensor share its storage and see the
/// result too.
pub fn all_reduce<C: Communicator + ?Sized>(
    comm: &mut C,
    tensor: &Tensor,
    op: ReduceOp,
) -> Result<(), CandleError> {
    in_place(comm, tensor, Kind::AllReduce(op))
}

/// Copy `root`'s `tensor` into every rank's, in place (DDP's start: every
/// replica takes rank 0's parameters).
pub fn broadcast<C: Communicator + ?Sized>(
    comm: &mut C,
    tensor: &Tensor,
    root: Rank,
) -> Result<(), CandleError> {
    in_place(comm, tensor, Kind::Broadcast(root))
}

/// Every rank's `tensor`, concatenated along the first dimension in rank
/// order (`torch.distributed.all_gather_into_tensor`); a scalar becomes a
/// vector of one element per rank.
pub fn all_gather<C: Communicator + ?Sized>(
    comm: &mut C,
    tensor: &Tensor,
) -> Result<Tensor, CandleError> {
    let n = comm.world_size() as usize;
    let mut dims = tensor.dims().to_vec();
    match dims.first_mut() {
        Some(d0) => *d0 *= n,
        None => dims.push(n),
    }
    let (storage, layout) = host_storage(tensor)?;
    let Storage::Cpu(cpu) = &*storage else {
        unreachable!("host_storage checked the device")
    };
    on_elements(cpu, layout, Gather { comm, dims })
}

/// Reduce `tensor` across the ranks and keep this rank's share: its
/// first dimension splits into one block per rank, and rank r gets the
/// reduction of block r (`torch.distributed.reduce_scatter_tensor`).
pub fn reduce_scatter<C: Communicator + ?Sized>(
    comm: &mut C,
    tensor: &Tensor,
    op: ReduceOp,
) -> Result<Tensor, CandleError> {
    let n = comm.world_size() as usize;
    let mut dims = tensor.dims().to_vec();
    match dims.first_mut() {
        Some(d0) if *d0 % n == 0 => *d0 /= n,
        _ => {
            return Err(CandleError::Unsupported(format!(
                "reduce-scatter over {n} ranks needs a first dimension that splits into {n} equal blocks; the tensor's shape is {:?}",
                tensor.dims()
            )));
        }
    }
    let (storage, layout) = host_storage(tensor)?;
    let Storage::Cpu(cpu) = &*storage else {
        unreachable!("host_storage checked the device")
    };
    on_elements(cpu, layout, Scatter { comm, dims, op })
}

/// The tensor's storage, refused unless it is on the CPU.
fn host_storage(tensor: &Tensor) -> Result<(candle_core::StorageRef<'_>, &Layout), CandleError> {
    let (storage, layout) = tensor.storage_and_layout();
    if !matches!(&*storage, Storage::Cpu(_)) {
        return Err(not_on_the_cpu(tensor));
    }
    Ok((storage, layout))
}

fn not_on_the_cpu(tensor: &Tensor) -> CandleError {
    CandleError::Unsupported(format!(
        "the tensor is on {:?}: the host API takes CPU tensors; CUDA tensors go through `ferrocoll::candle::cuda` (the `candle-cuda` feature) on a device communicator",
        tensor.device().location()
    ))
}

/// An in-place collective.
#[derive(Clone, Copy)]
enum Kind {
    AllReduce(ReduceOp),
    Broadcast(Rank),
}

/// Run `kind` on the tensor's storage under candle's write lock.
fn in_place<C: Communicator + ?Sized>(
    comm: &mut C,
    tensor: &Tensor,
    kind: Kind,
) -> Result<(), CandleError> {
    if !tensor.device().is_cpu() {
        return Err(not_on_the_cpu(tensor));
    }
    let op = InPlace {
        comm: RefCell::new(comm),
        kind,
        failed: RefCell::new(None),
    };
    match tensor.inplace_op1(&op) {
        Ok(()) => Ok(()),
        // Ours, kept typed beside the message candle carried.
        Err(e) => Err(op.failed.into_inner().unwrap_or(CandleError::Tensor(e))),
    }
}

/// candle's hook for in-place work on a tensor's storage.
struct InPlace<'a, C: ?Sized> {
    comm: RefCell<&'a mut C>,
    kind: Kind,
    failed: RefCell<Option<CandleError>>,
}

impl<C: Communicator + ?Sized> InplaceOp1 for InPlace<'_, C> {
    fn name(&self) -> &'static str {
        "ferrocoll-collective"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let mut comm = self.comm.borrow_mut();
        let run = Run {
            comm: &mut **comm,
            kind: self.kind,
        };
        on_elements_mut(storage, layout, run).map_err(|e| {
            let message = e.to_string();
            *self.failed.borrow_mut() = Some(e);
            candle_core::Error::Msg(message)
        })
    }
}

struct Run<'a, C: ?Sized> {
    comm: &'a mut C,
    kind: Kind,
}

impl<C: Communicator + ?Sized> OnSliceMut for Run<'_, C> {
    type Out = ();

    fn run<T: Reduce + WithDType>(self, elements: &mut [T]) -> Result<(), CommError> {
        match self.kind {
            Kind::AllReduce(op) => self.comm.all_reduce_in_place(elements, op),
            Kind::Broadcast(root) => self.comm.broadcast_in_place(elements, root),
        }
    }
}

struct Gather<'a, C: ?Sized> {
    comm: &'a mut C,
    dims: Vec<usize>,
}

impl<C: Communicator + ?Sized> OnSlice for Gather<'_, C> {
    type Out = Tensor;

    fn run<T: Reduce + WithDType>(self, elements: &[T]) -> Result<Tensor, CandleError> {
        let n = self.comm.world_size() as usize;
        let mut out = vec![T::from_f64(0.0); elements.len() * n];
        self.comm.all_gather(elements, &mut out)?;
        Ok(Tensor::from_vec(out, Shape::from(self.dims), &Device::Cpu)?)
    }
}

struct Scatter<'a, C: ?Sized> {
    comm: &'a mut C,
    dims: Vec<usize>,
    op: ReduceOp,
}

impl<C: Communicator + ?Sized> OnSlice for Scatter<'_, C> {
    type Out = Tensor;

    fn run<T: Reduce + WithDType>(self, elements: &[T]) -> Result<Tensor, CandleError> {
        let n = self.comm.world_size() as usize;
        let mut out = vec![T::from_f64(0.0); elements.len() / n];
        self.comm.reduce_scatter(elements, &mut out, self.op)?;
        Ok(Tensor::from_vec(out, Shape::from(self.dims), &Device::Cpu)?)
    }
}
