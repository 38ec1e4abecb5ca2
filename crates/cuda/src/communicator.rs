//! The CUDA communicator: collectives on device buffers, and the
//! [`Communicator`] trait on host slices (staged through the device) so the
//! conformance kit and the bench drive it like every other executor.
//!
//! Calls are blocking: a call returns once its work on the device has
//! completed, or errors after the configured timeout (and then the group is
//! failed, so no rank waits forever).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, result, sys};
use ferrocoll_core::comm::{
    Call, Checked, CommError, Communicator, HostSlice, HostSliceMut, send_recv_by_pairs,
};
use ferrocoll_core::plan::{CallShape, ExecutionPlan, Planned};
use ferrocoll_core::{Collective, DataType, Rank, Reduce, ReduceOp};

use crate::config::CudaConfig;
use crate::device;
use crate::enqueue::{self, CallSpec, Devices, RankBuffers};
use crate::error::CudaError;
use crate::group::{self, CallState, Outcome, Parcel, Shared};

/// An element type the CUDA executor moves and reduces.
pub trait CudaElement: Reduce + DeviceRepr {}
impl<T: Reduce + DeviceRepr> CudaElement for T {}

/// One rank of a CUDA group.
pub struct CudaCommunicator {
    rank: Rank,
    shared: Arc<Shared>,
    calls: u64,
}

/// Open a group with one rank per entry of `devices` (a device may appear
/// several times: ranks then share the GPU with their own buffers and
/// streams). Fails with [`CudaError::BackendUnavailable`] when CUDA is not
/// there.
pub fn group(devices: &[usize], config: &CudaConfig) -> Result<Vec<CudaCommunicator>, CudaError> {
    let shared = Arc::new(Shared::new(devices, config.clone())?);
    Ok((0..devices.len() as Rank)
        .map(|rank| CudaCommunicator {
            rank,
            shared: shared.clone(),
            calls: 0,
        })
        .collect())
}

/// Run `f` on every rank of a new group, one thread per rank; a rank that
/// errors or panics fails the group, so the others return errors too.
pub fn run<R, F>(
    devices: &[usize],
    config: &CudaConfig,
    f: F,
) -> Result<Vec<Result<R, CommError>>, CudaError>
where
    R: Send,
    F: Fn(&mut CudaCommunicator) -> Result<R, CommError> + Sync,
{
    let comms = group(devices, config)?;
    Ok(crate::threads::run_ranks(
        comms,
        |c| c.rank,
        &f,
        |c, e| {
            if !matches!(e, CommError::PeerFailed { .. }) {
                c.shared.fail(c.rank, &e.to_string());
            }
        },
    ))
}

fn size_error(what: &'static str, got: usize, needed: usize) -> CommError {
    CommError::BufferSize { what, got, needed }
}

impl CudaCommunicator {
    /// This rank's device context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.shared.rank_devices[self.rank as usize].ctx
    }

    /// Run `collective` on device buffers: out of place with `input`, in
    /// place (as the collective defines it) without. Waits for the slices'
    /// streams first and returns once the result is in `output`.
    pub fn collective_on_device<T: CudaElement>(
        &mut self,
        collective: Collective,
        input: Option<&CudaSlice<T>>,
        output: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let n = self.shared.n as usize;
        let ordinal = self.shared.rank_devices[self.rank as usize].ordinal;
        let elsewhere = std::iter::once(output.ordinal())
            .chain(input.map(CudaSlice::ordinal))
            .any(|o| o != ordinal);
        let checked = if elsewhere {
            Err(CudaError::Invalid(format!(
                "rank {}'s buffers must be on its device {ordinal}",
                self.rank
            ))
            .into())
        } else {
            ferrocoll_core::comm::block_count(
                collective,
                n,
                input.map(CudaSlice::len),
                output.len(),
            )
        };
        self.fail_on(&checked);
        let count = checked?;
        let out_stream = output.stream().clone();
        out_stream.synchronize().map_err(CudaError::from)?;
        let (out_ptr, _out_sync) = output.device_ptr_mut(&out_stream);
        let in_ptr = match input {
            Some(i) => {
                i.stream().synchronize().map_err(CudaError::from)?;
                Some(i.device_ptr(i.stream()).0)
            }
            None => None,
        };
        // SAFETY: both pointers address the slices' full lengths, checked
        // against `count` above, and the slices outlive the call, which
        // returns only after the device is done with them.
        unsafe { self.collective_raw(collective, T::DATA_TYPE, count, in_ptr, out_ptr, op) }
    }

    /// [`collective_on_device`](Self::collective_on_device) on raw device
    /// pointers of this rank's device, `count` elements per block.
    ///
    /// # Safety
    /// `output` (and `input`) address buffers of the collective's shape for
    /// `count`, on this rank's device, untouched by other work until the
    /// call returns. Overlapping `input` and `output` are refused
    /// ([`CommError::Overlap`]); pass `None` to run in place.
    pub unsafe fn collective_raw(
        &mut self,
        collective: Collective,
        dtype: DataType,
        count: usize,
        input: Option<u64>,
        output: u64,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let result = self.call(collective, dtype, count, input, output, op);
        self.fail_on(&result);
        result
    }

    fn call(
        &mut self,
        collective: Collective,
        dtype: DataType,
        count: usize,
        input: Option<u64>,
        output: u64,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let n = self.shared.n;
        ferrocoll_core::comm::check_root(collective, n)?;
        if let Some(i) = input {
            let bytes = |blocks: u32| blocks as usize * count * dtype.size_bytes();
            ferrocoll_core::comm::check_disjoint(
                i,
                bytes(collective.input_blocks(n)),
                output,
                bytes(collective.output_blocks(n)),
            )?;
        }
        let in_place = input.is_none();
        if in_place && collective.in_place_alias(self.rank).is_none() {
            return Err(CommError::InPlaceUnsupported {
                collective: collective.to_string(),
            });
        }
        let shape = CallShape {
            collective,
            count,
            dtype,
            op,
            in_place,
        };
        let planned = self.shared.plan(&shape)?;
        let call = self.calls;
        self.calls += 1;
        let signature = planned.plan.signature();
        let buffers = RankBuffers {
            input: input.unwrap_or(output),
            output,
        };
        // Meet the other ranks; the last to arrive enqueues everything.
        if let Some(all) = self.meet(call, signature, buffers)? {
            let outcome = self.enqueue(&planned, all);
            let mut board = self.shared.lock();
            if let Some(state) = board.calls.get_mut(&call) {
                state.outcome = Some(outcome);
            }
            drop(board);
            self.shared.changed.notify_all();
        }
        self.complete(call, &collective.to_string())
    }

    /// Put this rank's buffers on the call's board, checking its
    /// signature against the first rank's; the last rank to arrive gets
    /// every rank's buffers back.
    fn meet(
        &self,
        call: u64,
        signature: String,
        buffers: RankBuffers,
    ) -> Result<Option<Vec<RankBuffers>>, CommError> {
        let (rank, n) = (self.rank, self.shared.n);
        let mut board = self.shared.lock();
        if let Some((who, why)) = &board.failed {
            return Err(CommError::PeerFailed {
                rank: *who,
                reason: why.clone(),
            });
        }
        let state = board.calls.entry(call).or_insert_with(|| CallState {
            signature: signature.clone(),
            first: rank,
            buffers: vec![None; n as usize],
            arrived: 0,
            observed: 0,
            outcome: None,
        });
        if state.signature != signature {
            return Err(CommError::Mismatch {
                call,
                rank,
                other: state.first,
                expected: state.signature.clone(),
                got: signature,
            });
        }
        state.buffers[rank as usize] = Some(buffers);
        state.arrived += 1;
        Ok((state.arrived == n).then(|| {
            state
                .buffers
                .iter()
                .map(|b| b.expect("all arrived"))
                .collect()
        }))
    }

    /// Wait for the call's work on this rank's device, bounded by the
    /// timeout (after which its memory is leaked, never freed under the
    /// device's feet).
    fn complete(&self, call: u64, what: &str) -> Result<(), CommError> {
        let (rank, n) = (self.rank, self.shared.n);
        let outcome = self
            .shared
            .wait_until(rank, "the other ranks to join the call", |b| {
                b.calls.get(&call).and_then(|s| s.outcome.clone())
            })?;
        let outcome = outcome.map_err(|e| CommError::backend("cuda", e))?;
        let device = &self.shared.rank_devices[rank as usize];
        let deadline = Instant::now() + self.shared.config.timeout;
        let done = group::wait_event(
            device,
            outcome.completion[rank as usize] as sys::CUevent,
            deadline,
        )?;
        if !done {
            outcome
                .resources
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .leak = true;
            return Err(CommError::Timeout {
                rank,
                timeout: self.shared.config.timeout,
                what: format!("the device to finish {what}"),
            });
        }
        let mut board = self.shared.lock();
        if let Some(state) = board.calls.get_mut(&call) {
            state.observed += 1;
            if state.observed == n {
                board.calls.remove(&call);
            }
        }
        Ok(())
    }

    /// Enqueue a call's plan for every rank (run by the last to arrive).
    fn enqueue(
        &self,
        planned: &Planned,
        buffers: Vec<RankBuffers>,
    ) -> Result<Arc<Outcome>, CudaError> {
        let sh = &self.shared;
        let plan: &ExecutionPlan = &planned.plan;
        tracing::debug!("on CUDA: {}", planned.describe());
        let channels: Vec<usize> = plan.ranks.iter().map(|r| r.channels.len()).collect();
        let devices = Devices {
            devices: sh.rank_devices.iter().collect(),
            streams: sh.streams(&channels)?,
            p2p: sh.p2p.clone(),
        };
        let done = enqueue::enqueue(&devices, &CallSpec { plan, buffers })?;
        Ok(Arc::new(Outcome {
            completion: done.completion.iter().map(|&e| e as usize).collect(),
            resources: Mutex::new(done.resources),
        }))
    }

    /// Stage host data through this rank's device and run the collective.
    fn host_collective(
        &mut self,
        shape: &CallShape,
        input: Option<HostSlice<'_>>,
        mut output: HostSliceMut<'_>,
    ) -> Result<(), CommError> {
        if shape.collective == Collective::SendRecv {
            return send_recv_by_pairs(
                self,
                input.expect("send-recv has no in-place form"),
                output,
            );
        }
        let device = self.shared.rank_devices[self.rank as usize].clone();
        let staged = Staged::new(&device, input.map(|i| i.as_bytes()), output.as_bytes_mut())
            .map_err(CommError::from)?;
        // SAFETY: the staged buffers hold the host slices' lengths, which
        // `shape` checked against the collective's shape, on this rank's device.
        unsafe {
            self.collective_raw(
                shape.collective,
                shape.dtype,
                shape.count,
                staged.input,
                staged.output,
                shape.op,
            )?
        };
        staged
            .finish(&device, output.as_bytes_mut())
            .map_err(CommError::from)
    }

    /// A failed rank fails the group, so no other rank waits out its timeout.
    fn fail_on<R>(&self, result: &Result<R, CommError>) {
        if let Err(e) = result
            && !matches!(e, CommError::PeerFailed { .. })
        {
            self.shared.fail(self.rank, &e.to_string());
        }
    }
}

/// Host slices copied to this rank's device for a call, and back.
struct Staged {
    input: Option<u64>,
    output: u64,
    owned: Vec<u64>,
}

impl Staged {
    fn new<T>(
        device: &device::Device,
        input: Option<&[T]>,
        output: &[T],
    ) -> Result<Staged, CudaError> {
        let mut owned = Vec::new();
        let mut put = |data: &[T]| -> Result<u64, CudaError> {
            let ptr = device.alloc(std::mem::size_of_val(data))?;
            owned.push(ptr);
            if !data.is_empty() {
                // SAFETY: `ptr` holds `size_of_val(data)` bytes; the copy
                // is synchronous.
                unsafe { result::memcpy_htod_sync(ptr, data) }?;
            }
            Ok(ptr)
        };
        let input = input.map(&mut put).transpose()?;
        let output = put(output)?;
        // A synchronous copy from pageable memory may return before the
        // data reaches the device, and the executor's streams do not wait
        // for the default stream: wait here.
        device.ctx.synchronize()?;
        Ok(Staged {
            input,
            output,
            owned,
        })
    }

    fn finish<T>(self, device: &device::Device, output: &mut [T]) -> Result<(), CudaError> {
        device.bind()?;
        if !output.is_empty() {
            // SAFETY: the device buffer holds `size_of_val(output)` bytes
            // and the call has completed.
            unsafe { result::memcpy_dtoh_sync(output, self.output) }?;
        }
        for ptr in &self.owned {
            // SAFETY: allocated in `new`, no longer used.
            unsafe { device::free(device, *ptr) };
        }
        Ok(())
    }
}

impl Communicator for CudaCommunicator {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.shared.n
    }

    fn execute(&mut self, call: Call<'_>) -> Result<(), CommError> {
        match call.check(self.rank, self.shared.n)? {
            Checked::Collective {
                shape,
                input,
                output,
            } => {
                let result = self.host_collective(&shape, input, output);
                self.fail_on(&result);
                result
            }
            Checked::Send { data, peer } => self.host_send(data, peer),
            Checked::Recv { buffer, peer } => self.host_recv(buffer, peer),
            Checked::Barrier => self.host_barrier(),
        }
    }
}

impl CudaCommunicator {
    fn host_send(&mut self, data: HostSlice<'_>, peer: Rank) -> Result<(), CommError> {
        let data = data.as_bytes();
        let device = self.shared.rank_devices[self.rank as usize].clone();
        let staged = Staged::new(&device, None, data).map_err(CommError::from)?;
        let taken = Arc::new(AtomicBool::new(false));
        self.shared
            .lock()
            .parcels
            .entry((self.rank, peer))
            .or_default()
            .push_back(Parcel {
                ptr: staged.output,
                bytes: std::mem::size_of_val(data),
                ordinal: device.ordinal,
                taken: taken.clone(),
            });
        self.shared.changed.notify_all();
        let waited =
            self.shared
                .wait_until(self.rank, &format!("rank {peer} to receive a send"), |_| {
                    group::taken(&taken).then_some(())
                });
        if waited.is_ok() {
            let mut scratch: Vec<u8> = Vec::new();
            staged
                .finish(&device, &mut scratch)
                .map_err(CommError::from)?;
        }
        // On failure the parcel may still be read: its memory is leaked.
        self.fail_on(&waited);
        waited
    }

    fn host_recv(&mut self, mut buffer: HostSliceMut<'_>, peer: Rank) -> Result<(), CommError> {
        let buffer = buffer.as_bytes_mut();
        let parcel =
            self.shared
                .wait_until(self.rank, &format!("a send from rank {peer}"), |b| {
                    b.parcels
                        .get_mut(&(peer, self.rank))
                        .and_then(|q| q.pop_front())
                })?;
        let bytes = std::mem::size_of_val(buffer);
        let result = if parcel.bytes != bytes {
            Err(size_error("receive buffer (bytes)", bytes, parcel.bytes))
        } else {
            self.take(&parcel, buffer).map_err(CommError::from)
        };
        parcel.taken.store(true, Ordering::Release);
        self.shared.changed.notify_all();
        result
    }

    fn host_barrier(&mut self) -> Result<(), CommError> {
        let n = self.shared.n;
        let generation = {
            let mut b = self.shared.lock();
            let g = b.barrier.0;
            b.barrier.1 += 1;
            if b.barrier.1 == n {
                b.barrier = (g + 1, 0);
                drop(b);
                self.shared.changed.notify_all();
                return Ok(());
            }
            g
        };
        self.shared
            .wait_until(self.rank, "every rank to reach the barrier", |b| {
                (b.barrier.0 > generation).then_some(())
            })
    }
}

impl CudaCommunicator {
    /// Copy a parcel from the sender's device into `buffer` on the host.
    fn take<T>(&self, parcel: &Parcel, buffer: &mut [T]) -> Result<(), CudaError> {
        if buffer.is_empty() {
            return Ok(());
        }
        let mine = self.shared.rank_devices[self.rank as usize].clone();
        let theirs = self
            .shared
            .rank_devices
            .iter()
            .find(|d| d.ordinal == parcel.ordinal)
            .cloned()
            .ok_or_else(|| CudaError::Invalid("a parcel from an unknown device".into()))?;
        let local = Staged::new(&mine, None, buffer)?;
        mine.bind()?;
        // SAFETY: both buffers hold `parcel.bytes`; the sender keeps its
        // buffer until `taken` is set, after this synchronous copy.
        unsafe {
            sys::cuMemcpyPeer(
                local.output,
                mine.ctx.cu_ctx(),
                parcel.ptr,
                theirs.ctx.cu_ctx(),
                parcel.bytes,
            )
            .result()?;
        }
        // The sender frees its buffer once the parcel is taken.
        mine.ctx.synchronize()?;
        theirs.ctx.synchronize()?;
        local.finish(&mine, buffer)
    }
}
