//! The CUDA communicator: collectives on device buffers, and the
//! [`Communicator`] trait on host slices (staged through the device) so the
//! conformance kit and the bench drive it like every other executor.
//!
//! Calls are blocking: a call returns once its work on the device has
//! completed, or errors after the configured timeout (and then the group is
//! failed, so no rank waits forever).

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, result, sys};
use ferrocoll_core::comm::CommError;
use ferrocoll_core::cpu::Reduce;
use ferrocoll_core::schedule::layout::Layout;
use ferrocoll_core::{Collective, DataType, Rank, ReduceOp};

use crate::config::{CudaConfig, auto_algorithm};
use crate::device;
use crate::enqueue::{self, CallSpec, Fabric, RankBuffers};
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
    let f = &f;
    Ok(std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                scope.spawn(move || {
                    let shared = comm.shared.clone();
                    let rank = comm.rank;
                    let out =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut comm)));
                    let out = out.unwrap_or_else(|_| {
                        Err(CommError::Backend {
                            message: format!("rank {rank} panicked"),
                        })
                    });
                    if let Err(e) = &out
                        && !matches!(e, CommError::PeerFailed { .. })
                    {
                        shared.fail(rank, &e.to_string());
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(CommError::Backend {
                        message: "a rank thread died".into(),
                    })
                })
            })
            .collect()
    }))
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
            Err(CommError::Backend {
                message: format!(
                    "rank {}'s buffers must be on its device {ordinal}",
                    self.rank
                ),
            })
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
        let call = self.calls;
        self.calls += 1;
        let signature =
            format!("{collective} count={count} type={dtype} op={op} in_place={in_place}");
        let buffers = RankBuffers {
            input: input.unwrap_or(output),
            output,
        };
        // Meet the other ranks; the last to arrive enqueues everything.
        let rank = self.rank;
        let last = {
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
            (state.arrived == n).then(|| {
                state
                    .buffers
                    .iter()
                    .map(|b| b.expect("all arrived"))
                    .collect::<Vec<_>>()
            })
        };
        if let Some(all) = last {
            let outcome = self.enqueue(collective, dtype, count, in_place, op, all);
            let mut board = self.shared.lock();
            if let Some(state) = board.calls.get_mut(&call) {
                state.outcome = Some(outcome.map_err(|e| e.to_string()));
            }
            drop(board);
            self.shared.changed.notify_all();
        }
        let outcome = self
            .shared
            .wait_until(rank, "the other ranks to join the call", |b| {
                b.calls.get(&call).and_then(|s| s.outcome.clone())
            })?;
        let outcome = outcome.map_err(|message| CommError::Backend { message })?;
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
                what: format!("the device to finish {collective}"),
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

    /// Plan and enqueue a call for every rank (run by the last to arrive).
    fn enqueue(
        &self,
        collective: Collective,
        dtype: DataType,
        count: usize,
        in_place: bool,
        op: ReduceOp,
        buffers: Vec<RankBuffers>,
    ) -> Result<Arc<Outcome>, CudaError> {
        let sh = &self.shared;
        let cfg = &sh.config;
        let n = sh.n;
        let elem = dtype.size_bytes();
        let blocks = collective.input_blocks(n).max(collective.output_blocks(n)) as usize;
        let (verified, chunk, why): (Arc<ferrocoll_core::Verified>, usize, Cow<'static, str>) =
            match &cfg.schedule {
                Some(v)
                    if v.schedule().collective == collective && v.schedule().world_size == n =>
                {
                    (
                        v.clone(),
                        cfg.max_chunk_bytes,
                        "the configured schedule".into(),
                    )
                }
                _ => {
                    let choice = ferrocoll_core::choose::decide(
                        cfg.algorithm,
                        cfg.chooser.as_ref(),
                        cfg.channels,
                        collective,
                        n,
                        count * elem * blocks,
                        || auto_algorithm(collective.kind(), n),
                    );
                    let (a, params) = (choice.algorithm, choice.params);
                    let chunk = choice.max_chunk_bytes.unwrap_or(cfg.max_chunk_bytes);
                    let why = Cow::Owned(choice.why);
                    let plan = sh
                        .plan(collective, a, &params)
                        .map_err(|e| CudaError::Invalid(e.to_string()))?;
                    (plan, chunk, why)
                }
            };
        let schedule = verified.schedule();
        if in_place && !verified.supports_in_place() {
            return Err(CudaError::Invalid(format!(
                "schedule `{}` is not proven in place",
                schedule.name
            )));
        }
        let layout = Layout::with_max_chunk_bytes(count, schedule.chunks_per_block, elem, chunk);
        tracing::debug!(
            "{collective} {} B {dtype} on CUDA: algorithm={} channels={} segments={} in_place={in_place} ({why})",
            count * elem * blocks,
            schedule.name,
            schedule.channel_count(),
            layout.segments(),
        );
        let channels: Vec<usize> = schedule.ranks.iter().map(|p| p.channels.len()).collect();
        let fabric = Fabric {
            devices: sh.rank_devices.iter().collect(),
            streams: sh.streams(&channels)?,
            p2p: sh.p2p.clone(),
        };
        let spec = CallSpec {
            schedule,
            in_place,
            count,
            layout,
            dtype,
            op,
            slots: cfg.slots_per_link,
            buffers,
        };
        let done = enqueue::enqueue(&fabric, &spec)?;
        Ok(Arc::new(Outcome {
            completion: done.completion.iter().map(|&e| e as usize).collect(),
            resources: Mutex::new(done.resources),
        }))
    }

    /// Stage host data through this rank's device and run the collective.
    fn host_call<T: Reduce>(
        &mut self,
        collective: Collective,
        input: Option<&[T]>,
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let result = self.host_call_inner(collective, input, output, op);
        self.fail_on(&result);
        result
    }

    /// A failed rank fails the group, so no other rank waits out its timeout.
    fn fail_on<R>(&self, result: &Result<R, CommError>) {
        if let Err(e) = result
            && !matches!(e, CommError::PeerFailed { .. })
        {
            self.shared.fail(self.rank, &e.to_string());
        }
    }

    fn host_call_inner<T: Reduce>(
        &mut self,
        collective: Collective,
        input: Option<&[T]>,
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let n = self.shared.n as usize;
        let count =
            ferrocoll_core::comm::block_count(collective, n, input.map(<[T]>::len), output.len())?;
        let device = self.shared.rank_devices[self.rank as usize].clone();
        let staged = Staged::new(&device, input, output).map_err(CommError::from)?;
        // SAFETY: the staged buffers hold the host slices' lengths, checked
        // against `count` above, on this rank's device.
        unsafe {
            self.collective_raw(
                collective,
                T::DATA_TYPE,
                count,
                staged.input,
                staged.output,
                op,
            )?
        };
        staged.finish(&device, output).map_err(CommError::from)
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

ferrocoll_core::communicator_via_host_call!(CudaCommunicator);

impl CudaCommunicator {
    fn comm_rank(&self) -> Rank {
        self.rank
    }

    fn comm_size(&self) -> u32 {
        self.shared.n
    }

    pub(crate) fn host_send<T: Reduce>(&mut self, data: &[T], peer: Rank) -> Result<(), CommError> {
        self.check_peer(peer)?;
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
            let mut scratch: Vec<T> = Vec::new();
            staged
                .finish(&device, &mut scratch)
                .map_err(CommError::from)?;
        }
        // On failure the parcel may still be read: its memory is leaked.
        self.fail_on(&waited);
        waited
    }

    pub(crate) fn host_recv<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        peer: Rank,
    ) -> Result<(), CommError> {
        self.check_peer(peer)?;
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

    pub(crate) fn host_barrier(&mut self) -> Result<(), CommError> {
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
    fn check_peer(&self, peer: Rank) -> Result<(), CommError> {
        ferrocoll_core::comm::check_peer(peer, self.rank, self.shared.n)
    }

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
