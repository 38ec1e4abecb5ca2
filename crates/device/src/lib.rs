//! # ferrocoll-device
//!
//! The stream-ordered device API: collectives on device buffers (cudarc's
//! [`CudaSlice`] and its views) that are
//! *enqueued* on the caller's [`CudaStream`] and return at once, the way
//! `ncclAllReduce` does — so a training loop overlaps communication with
//! compute, orders it against its own kernels by the stream, and can
//! capture it in a CUDA graph.
//!
//! [`DeviceCommunicator`] is the one interface both GPU backends
//! implement: NCCL (`ferrocoll-nccl`) and ferrocoll's own CUDA executor
//! (`ferrocoll-cuda`'s device interpreter).
//! A backend implements four things — [`enqueue`](DeviceCommunicator::enqueue)
//! on raw device pointers, the non-blocking error
//! [`check`](DeviceCommunicator::check), a bounded
//! [`synchronize`](DeviceCommunicator::synchronize) and
//! [`abort`](DeviceCommunicator::abort) — and gets the typed calls.
//!
//! Invariants every backend keeps:
//! - a call's arguments are checked before anything is enqueued: buffer
//!   lengths against the call's shape ([`block_count`]), the stream and
//!   every buffer in the communicator's CUDA context, a stream that means
//!   the same on every thread (not the per-thread default stream), a root
//!   inside the communicator, out-of-place buffers disjoint; a refused
//!   call ([`ArgumentError`]) enqueues nothing — but its peers may have
//!   enqueued theirs, so unless every rank refused it, the group is out of
//!   step: [`abort`](DeviceCommunicator::abort) it;
//! - a call does no host synchronization, no allocation and no stream
//!   query but whether the stream is being captured, so it is legal while
//!   it is; a capture while cudarc tracks the buffers is refused (waiting
//!   on their earlier events would invalidate it), and errors cudarc
//!   stored in drops are reported by the call they happened around;
//! - a failure found after the call returned (a peer died, the network
//!   failed) surfaces through `check` or `synchronize`, which abort the
//!   communicator; every later call on it fails.
//!
//! The buffers' reads and writes are recorded with cudarc's stream
//! tracking ([`DevicePtr::device_ptr`], [`DevicePtrMut::device_ptr_mut`]),
//! so a buffer used on another stream is waited for. Where cudarc does not
//! track (a context in single-stream mode, as candle's, or with tracking
//! disabled for graph capture, as cudarc's own graph tests do), nothing
//! would order another stream against the buffer's, so the call must run
//! on each buffer's own stream and is refused otherwise.

mod error;
pub mod poll;
mod shape;

use cudarc::driver::sys::CUdeviceptr;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use ferrocoll_core::comm::check_disjoint;
use ferrocoll_core::{Collective, DataType, Element, Rank, ReduceOp};

pub use error::ArgumentError;
pub use poll::Poller;
pub use shape::block_count;

/// Whether the CUDA driver library (`libcuda`) can be loaded — asked
/// before anything touches the driver, because cudarc panics when it calls
/// into a library that is not there. Built without `dynamic-loading`,
/// cudarc links the library, so a running program has it.
pub fn driver_present() -> bool {
    #[cfg(feature = "dynamic-loading")]
    // SAFETY: only tries to open the library by its usual names; it calls
    // nothing in it.
    return unsafe { cudarc::driver::sys::is_culib_present() };
    #[cfg(not(feature = "dynamic-loading"))]
    true
}

/// One collective on raw device pointers, checked by the caller: what a
/// backend's [`enqueue`](DeviceCommunicator::enqueue) receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCall {
    /// The collective (and its root).
    pub collective: Collective,
    /// The element type.
    pub dtype: DataType,
    /// Elements per block ([`block_count`]).
    pub count: usize,
    /// The input, or `None` in place.
    pub input: Option<CUdeviceptr>,
    /// The output (in place: the one buffer).
    pub output: CUdeviceptr,
    /// The reduction (ignored by collectives that do not reduce).
    pub op: ReduceOp,
}

/// A rank of a communicator whose collectives are enqueued on the
/// caller's stream. Every call returns once its work is enqueued; the
/// buffers must stay alive and untouched by other streams until the
/// stream has run it (cudarc's tracking sees to the latter by default).
///
/// # Safety
/// The typed calls check buffers against [`size`](Self::size) and
/// [`context`](Self::context) and then call [`enqueue`](Self::enqueue):
/// an implementation must report its true size and context, and
/// `enqueue` must touch no memory beyond what its contract names.
pub unsafe trait DeviceCommunicator {
    /// The backend's error; argument errors convert into it.
    type Error: std::error::Error + From<ArgumentError>;

    /// This rank.
    fn rank(&self) -> Rank;

    /// Ranks in the communicator.
    fn size(&self) -> u32;

    /// This rank's CUDA context (its GPU's primary context).
    fn context(&self) -> &Arc<CudaContext>;

    /// Enqueue `call` on `stream` without waiting for it.
    ///
    /// # Safety
    /// `call`'s pointers address buffers of its shape on this rank's GPU
    /// (input `input_blocks` · `count` elements, output `output_blocks` ·
    /// `count`; in place `size_blocks` · `count`) that outlive the
    /// stream's work and are not written by other work meanwhile;
    /// `stream` belongs to this rank's GPU.
    unsafe fn enqueue(&mut self, call: &DeviceCall, stream: &CudaStream)
    -> Result<(), Self::Error>;

    /// Whether anything enqueued so far has failed, without waiting; a
    /// failure aborts the communicator.
    fn check(&mut self) -> Result<(), Self::Error>;

    /// Wait until `stream` has run everything enqueued on it, watching
    /// for failures, within the communicator's timeout; a failure or the
    /// timeout aborts the communicator.
    fn synchronize(&mut self, stream: &CudaStream) -> Result<(), Self::Error>;

    /// Abort the communicator: work in flight ends, later calls fail.
    fn abort(&mut self);

    /// Reduce `input` over the ranks into `output`.
    fn all_reduce<T: Element>(
        &mut self,
        input: &impl DevicePtr<T>,
        output: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), Self::Error> {
        let call = Collective::AllReduce;
        run(self, call, op, Some(input), output, stream)
    }

    /// Reduce `buffer` over the ranks, in place.
    fn all_reduce_in_place<T: Element>(
        &mut self,
        buffer: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), Self::Error> {
        run(
            self,
            Collective::AllReduce,
            op,
            None::<&CudaSlice<T>>,
            buffer,
            stream,
        )
    }

    /// Copy `root`'s `buffer` into every rank's.
    fn broadcast<T: Element>(
        &mut self,
        buffer: &mut impl DevicePtrMut<T>,
        root: Rank,
        stream: &CudaStream,
    ) -> Result<(), Self::Error> {
        let call = Collective::Broadcast { root };
        run(
            self,
            call,
            ReduceOp::Sum,
            None::<&CudaSlice<T>>,
            buffer,
            stream,
        )
    }

    /// Reduce every rank's `input` into `root`'s `output` (the others'
    /// outputs are not written).
    fn reduce<T: Element>(
        &mut self,
        input: &impl DevicePtr<T>,
        output: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        root: Rank,
        stream: &CudaStream,
    ) -> Result<(), Self::Error> {
        let call = Collective::Reduce { root };
        run(self, call, op, Some(input), output, stream)
    }

    /// Gather every rank's `input` into `output`, in rank order.
    fn all_gather<T: Element>(
        &mut self,
        input: &impl DevicePtr<T>,
        output: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<(), Self::Error> {
        let call = Collective::AllGather;
        run(self, call, ReduceOp::Sum, Some(input), output, stream)
    }

    /// Reduce `input` (one block per rank) over the ranks; rank r's
    /// `output` gets block r.
    fn reduce_scatter<T: Element>(
        &mut self,
        input: &impl DevicePtr<T>,
        output: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), Self::Error> {
        let call = Collective::ReduceScatter;
        run(self, call, op, Some(input), output, stream)
    }

    /// Block j of rank i's `input` becomes block i of rank j's `output`.
    fn all_to_all<T: Element>(
        &mut self,
        input: &impl DevicePtr<T>,
        output: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<(), Self::Error> {
        let call = Collective::AllToAll;
        run(self, call, ReduceOp::Sum, Some(input), output, stream)
    }
}

/// Check a typed call and enqueue it.
fn run<C, T, I>(
    comm: &mut C,
    collective: Collective,
    op: ReduceOp,
    input: Option<&I>,
    output: &mut (impl DevicePtrMut<T> + ?Sized),
    stream: &CudaStream,
) -> Result<(), C::Error>
where
    C: DeviceCommunicator + ?Sized,
    T: Element,
    I: DevicePtr<T> + ?Sized,
{
    let n = comm.size();
    if let Some(root) = collective.root()
        && root >= n
    {
        return Err(ArgumentError::Root { root, size: n }.into());
    }
    let ctx = comm.context().clone();
    let ctx = &ctx;
    usable_stream(stream)?;
    same_context("the stream", stream, ctx)?;
    if let Some(i) = input {
        same_context("the input", i.stream(), ctx)?;
        ordered("the input", i.stream(), stream)?;
    }
    same_context("the output", output.stream(), ctx)?;
    ordered("the output", output.stream(), stream)?;
    capturable(stream)?;
    // An error cudarc stored from earlier work (its drops cannot return
    // one) is reported here, before anything is enqueued, rather than by
    // some later call on another thread.
    deferred(ctx, "before")?;
    let count = block_count(collective, n, input.map(|i| i.len()), output.len())?;
    let bytes = |len: usize| len * T::DATA_TYPE.size_bytes();
    let called = {
        let read = input.map(|i| (i.device_ptr(stream), bytes(i.len())));
        let out_bytes = bytes(output.len());
        let (out_ptr, _written) = output.device_ptr_mut(stream);
        if let Some(((in_ptr, _), in_bytes)) = &read {
            check_disjoint(*in_ptr, *in_bytes, out_ptr, out_bytes)
                .map_err(|e| ArgumentError::Overlap(e.to_string()))?;
        }
        let call = DeviceCall {
            collective,
            dtype: T::DATA_TYPE,
            count,
            input: read.as_ref().map(|((p, _), _)| *p),
            output: out_ptr,
            op,
        };
        // SAFETY: the lengths fit the shape (`block_count`) of the size
        // the (unsafe) trait promises true; the buffers and the stream are
        // in this rank's context; out-of-place buffers are disjoint; other
        // streams' use of the buffers is ordered by cudarc's events, or the
        // call runs on the buffers' own stream (`ordered`).
        unsafe { comm.enqueue(&call, stream) }
        // The buffers' guards record their events here, on drop.
    };
    called?;
    Ok(deferred(ctx, "after")?)
}

/// Whether the stream is being captured (legal to ask during a capture).
fn is_capturing(stream: &CudaStream) -> Result<bool, ArgumentError> {
    let mut status = cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream; a live out-pointer.
    unsafe { cudarc::driver::sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) }
        .result()
        .map_err(|e| {
            ArgumentError::Tracking(format!("asking whether the stream is captured: {e}"))
        })?;
    Ok(status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// `Err` for a capture while cudarc tracks the context's buffers: it would
/// make the stream wait on events recorded before the capture began,
/// which invalidates the capture (and its error would surface later, on
/// whichever thread touches the context next).
fn capturable(stream: &CudaStream) -> Result<(), ArgumentError> {
    if stream.context().is_managing_stream_synchronization() && is_capturing(stream)? {
        return Err(ArgumentError::Tracking(
            "the stream is being captured while cudarc tracks this context's buffers: waiting on their earlier events would invalidate the capture; turn tracking off while capturing (`CudaContext::disable_event_tracking`, as cudarc's graph tests do)".into(),
        ));
    }
    Ok(())
}

/// cudarc's stored error of the context, if any, as this call's.
fn deferred(ctx: &CudaContext, when: &str) -> Result<(), ArgumentError> {
    ctx.check_err().map_err(|e| {
        ArgumentError::Tracking(format!(
            "cudarc's stream tracking failed {when} the call (an event its drop recorded): {e}"
        ))
    })
}

/// `Err` when `stream` is not in the communicator's context.
fn same_context(
    what: &'static str,
    stream: &CudaStream,
    ctx: &CudaContext,
) -> Result<(), ArgumentError> {
    if stream.context().cu_ctx() == ctx.cu_ctx() {
        return Ok(());
    }
    Err(ArgumentError::Device {
        what,
        found: stream.context().ordinal(),
        device: ctx.ordinal(),
    })
}

/// `CU_STREAM_PER_THREAD`: names each calling thread's own default stream.
const PER_THREAD_STREAM: usize = 0x2;

/// `Err` for the per-thread default stream: a non-blocking NCCL
/// communicator may launch from a helper thread, where the same handle
/// names another stream (NVIDIA/nccl#1976).
fn usable_stream(stream: &CudaStream) -> Result<(), ArgumentError> {
    if stream.cu_stream() as usize == PER_THREAD_STREAM {
        return Err(ArgumentError::Stream(
            "the per-thread default stream means another stream on NCCL's helper threads; enqueue on a stream of your own (candle: `CudaDevice::new_with_stream`)".into(),
        ));
    }
    Ok(())
}

/// `Err` when cudarc does not order `buffer`'s stream against `stream`
/// (it tracks no events for the buffer) and they differ.
fn ordered(
    what: &'static str,
    buffer: &CudaStream,
    stream: &CudaStream,
) -> Result<(), ArgumentError> {
    if buffer.context().is_managing_stream_synchronization()
        || buffer.cu_stream() == stream.cu_stream()
    {
        return Ok(());
    }
    Err(ArgumentError::Stream(format!(
        "{what} belongs to another stream and cudarc does not track its use (single-stream mode or tracking disabled): enqueue on the buffer's own stream"
    )))
}
