//! A rank of a device-interpreter group: the stream-ordered device API
//! ([`DeviceCommunicator`]). A call plans (once per shape), finds its
//! program's tables already in device memory (uploaded on the shape's
//! first call), and enqueues one launch on the caller's stream — no
//! allocation, no host synchronization and no per-chunk host work.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, result, sys};
use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;
use ferrocoll_core::plan::{CallShape, Planned};
use ferrocoll_device::{DeviceCall, DeviceCommunicator};

use super::error::InterpreterError;
use super::memory::{Current, DeviceBlock};
use super::setup::Group;
use crate::error::CudaError;
use crate::program::DeviceProgram;
use crate::program::params::{ABORTED, Addresses, Failure, Packed, Params, pack};

/// A program's tables for this rank, in its device's memory, with the
/// scratch its plan needs.
struct Loaded {
    program: Arc<DeviceProgram>,
    packed: Packed,
    tables: DeviceBlock,
    scratch: DeviceBlock,
}

/// One rank of a device-interpreter group.
pub struct InterpreterCommunicator {
    rank: Rank,
    group: Arc<Group>,
    loaded: HashMap<u64, Loaded>,
    /// Recorded after each launch; a launch on another stream than the
    /// last call's waits for it, so calls of this rank run in order
    /// whichever streams they are issued on.
    last: sys::CUevent,
    last_stream: sys::CUstream,
    /// A stream of the rank's own (non-blocking), for callers that have
    /// none.
    stream: Arc<CudaStream>,
    calls: u64,
    failed: Option<CommError>,
}

// SAFETY: the raw event belongs to this communicator alone and is used by
// the thread that holds `&mut self` (or drops it).
unsafe impl Send for InterpreterCommunicator {}

impl InterpreterCommunicator {
    pub(super) fn new(rank: Rank, group: Arc<Group>) -> Result<Self, CudaError> {
        let engine = &group.engines[rank as usize];
        let _current = Current::bind(&engine.ctx)?;
        let last = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
        let stream = engine.ctx.new_stream()?;
        Ok(InterpreterCommunicator {
            rank,
            group,
            loaded: HashMap::new(),
            last,
            last_stream: std::ptr::null_mut(),
            stream,
            calls: 0,
            failed: None,
        })
    }

    /// The rank's own stream (each rank of a group has a different one,
    /// which ranks sharing a GPU need: their launches must run at once).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn live(&self) -> Result<(), InterpreterError> {
        match &self.failed {
            Some(e) => Err(e.clone().into()),
            None => Ok(()),
        }
    }

    /// Record `e` as the rank's failure and stop its blocks (and, through
    /// the board, every peer's).
    fn fail(&mut self, e: InterpreterError) -> InterpreterError {
        self.group.board.fail(self.rank as usize, ABORTED);
        if self.failed.is_none() {
            self.failed = Some(CommError::from(e.clone()));
        }
        e
    }

    /// The board's verdict: this rank's word, else the first peer's.
    fn board_error(&self) -> Option<CommError> {
        let board = &self.group.board;
        let timeout = self.group.config.timeout;
        if let Some(f) = Failure::decode(board.read(self.rank as usize)) {
            return Some(f.error(self.rank, self.calls, timeout));
        }
        let (peer, word) = board.first_failed()?;
        let reason = match Failure::decode(word) {
            Some(Failure::Aborted) => "aborted".to_owned(),
            Some(f) => f.error(peer as Rank, self.calls, timeout).to_string(),
            None => "failed".to_owned(),
        };
        Some(CommError::PeerFailed {
            rank: peer as Rank,
            reason,
        })
    }

    fn issue(&mut self, call: &DeviceCall, stream: &CudaStream) -> Result<(), InterpreterError> {
        let rank = self.rank as usize;
        if stream.cu_stream().is_null() && self.group.shares_device(rank) {
            return Err(CudaError::Invalid(
                "ranks sharing a GPU need streams of their own: the legacy default stream \
                 would serialise their launches, which wait for each other"
                    .into(),
            )
            .into());
        }
        let shape = CallShape {
            collective: call.collective,
            count: call.count,
            dtype: call.dtype,
            op: call.op,
            in_place: call.input.is_none(),
        };
        let planned = self.group.plan(&shape)?;
        self.load(&planned, stream)?;
        let loaded = &self.loaded[&planned.signature];
        let program = &loaded.program;
        let engine = &self.group.engines[rank];
        let windows = self.group.window_addresses();
        let buffers = [
            call.input.unwrap_or(call.output),
            call.output,
            loaded.scratch.ptr,
        ];
        let params = Params::new(
            program,
            self.rank,
            &loaded.packed,
            &Addresses {
                tables: loaded.tables.ptr,
                windows: &windows,
                buffers,
                state: self.group.states[rank].ptr,
                board: self.group.board.device,
            },
            self.group.config.timeout,
        );
        let me = &program.ranks[rank];
        let s = stream.cu_stream();
        let _current = Current::bind(&engine.ctx)?;
        // Under capture the ordering event becomes an external node, so it
        // still orders (and can be waited on) when the graph replays.
        // SAFETY: the caller's live stream.
        let capturing = unsafe { result::stream::is_capturing(s) }.map_err(CudaError::from)?
            != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let (wait, record) = if capturing {
            (
                sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL,
                sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
            )
        } else {
            (sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT, 0)
        };
        // SAFETY: the event and stream are this device's; the tables,
        // windows, state, scratch and board live as long as the group and
        // this communicator, which outlive the launch (drop waits for
        // `last`); the caller vouches for the buffers (`enqueue`).
        unsafe {
            if s != self.last_stream {
                result::stream::wait_event(s, self.last, wait).map_err(CudaError::from)?;
            }
            if !me.channels.is_empty() {
                engine.interpret(s, program.dtype, call.op, me.channels.len() as u32, &params)?;
            }
            if let Some(d) = &me.divide {
                let size = program.dtype.size_bytes() as u64;
                let base = buffers[d.buffer as usize];
                let pieces = &me.pieces[d.pieces.first as usize..][..d.pieces.count as usize];
                for p in pieces {
                    let n = u64::from(program.layout.world_size);
                    engine.divide(s, program.dtype, base + p.offset, p.bytes / size, n)?;
                }
            }
            sys::cuEventRecordWithFlags(self.last, s, record)
                .result()
                .map_err(CudaError::from)?;
        }
        self.last_stream = s;
        self.calls += 1;
        tracing::debug!(rank = self.rank, protocol = ?program.protocol, "{}", planned.describe());
        Ok(())
    }

    /// The program's tables and scratch in device memory, set up on the
    /// shape's first call (which therefore must not be under capture).
    fn load(&mut self, planned: &Planned, stream: &CudaStream) -> Result<(), InterpreterError> {
        if self.loaded.contains_key(&planned.signature) {
            return Ok(());
        }
        // SAFETY: the stream is live (the caller's).
        let capture =
            unsafe { result::stream::is_capturing(stream.cu_stream()) }.map_err(CudaError::from)?;
        if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(CudaError::Invalid(
                "this call's shape has not run before: its plan must be uploaded outside a graph \
                 capture (run it once before capturing)"
                    .into(),
            )
            .into());
        }
        let program = self.group.program(planned)?;
        let (blob, packed) = pack(&program.ranks[self.rank as usize]);
        let ctx: &Arc<CudaContext> = &self.group.engines[self.rank as usize].ctx;
        let loaded = Loaded {
            tables: DeviceBlock::alloc(ctx, blob.len() as u64)?,
            scratch: DeviceBlock::alloc(ctx, program.scratch_bytes)?,
            packed,
            program,
        };
        let _current = Current::bind(ctx)?;
        let s = stream.cu_stream();
        // SAFETY: the blocks hold the blob's and the scratch's bytes; the
        // copy is ordered before this call's launch on the same stream
        // and, from pageable memory, returns once the blob is staged, so
        // the blob may go. Nothing here waits for the device (peers on
        // this GPU may be spinning in their launches of this call).
        unsafe {
            result::memcpy_htod_async(loaded.tables.ptr, &blob, s).map_err(CudaError::from)?;
            let scratch = loaded.program.scratch_bytes.max(1) as usize;
            result::memset_d8_async(loaded.scratch.ptr, 0, scratch, s).map_err(CudaError::from)?;
        }
        self.loaded.insert(planned.signature, loaded);
        Ok(())
    }

    /// Wait for this rank's last launch, watching the board; `false` if
    /// it did not end by `deadline`.
    fn wait_last(&self, deadline: Instant) -> Result<bool, CudaError> {
        let _current = Current::bind(&self.group.engines[self.rank as usize].ctx)?;
        let mut pause = Duration::from_micros(20);
        loop {
            // SAFETY: the event is this communicator's and alive.
            match unsafe { sys::cuEventQuery(self.last) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(true),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => return Err(CudaError::Driver(format!("{other:?}"))),
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
}

// SAFETY: `size` and `context` are the group's and the rank's device's;
// `enqueue` touches the call's buffers as its collective defines and
// nothing else of the caller's.
unsafe impl DeviceCommunicator for InterpreterCommunicator {
    type Error = InterpreterError;

    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> u32 {
        self.group.layout.world_size
    }

    fn context(&self) -> &Arc<CudaContext> {
        &self.group.engines[self.rank as usize].ctx
    }

    unsafe fn enqueue(
        &mut self,
        call: &DeviceCall,
        stream: &CudaStream,
    ) -> Result<(), InterpreterError> {
        self.live()?;
        if let Some(e) = self.board_error() {
            return Err(self.fail(e.into()));
        }
        self.issue(call, stream).map_err(|e| self.fail(e))
    }

    fn check(&mut self) -> Result<(), InterpreterError> {
        self.live()?;
        match self.board_error() {
            Some(e) => Err(self.fail(e.into())),
            None => Ok(()),
        }
    }

    fn synchronize(&mut self, stream: &CudaStream) -> Result<(), InterpreterError> {
        self.live()?;
        // The kernels give up after the timeout themselves; the host
        // allows them a little longer to notice.
        let deadline = Instant::now() + self.group.config.timeout + Duration::from_secs(1);
        let _current = Current::bind(self.context())?;
        let mut pause = Duration::from_micros(10);
        loop {
            // SAFETY: the caller's live stream.
            match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
                sys::CUresult::CUDA_SUCCESS => break,
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => {
                    let e = CudaError::Driver(format!("the stream failed: {other:?}"));
                    return Err(self.fail(e.into()));
                }
            }
            if let Some(e) = self.board_error() {
                return Err(self.fail(e.into()));
            }
            if Instant::now() >= deadline {
                let e = CommError::Timeout {
                    rank: self.rank,
                    timeout: self.group.config.timeout,
                    what: "the stream's collectives".into(),
                };
                return Err(self.fail(e.into()));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        self.check()
    }

    fn abort(&mut self) {
        let e = CommError::PeerFailed {
            rank: self.rank,
            reason: "aborted".into(),
        };
        self.fail(e.into());
    }
}

impl Drop for InterpreterCommunicator {
    fn drop(&mut self) {
        // The tables and scratch may still be in use by the last launch:
        // wait for it (it ends by its timeout at the latest; stopped
        // sooner if it has not).
        let deadline = Instant::now() + self.group.config.timeout;
        if !matches!(self.wait_last(deadline), Ok(true)) {
            self.group.board.fail(self.rank as usize, ABORTED);
            let _ = self.wait_last(Instant::now() + Duration::from_secs(5));
        }
        if let Ok(_current) = Current::bind(&self.group.engines[self.rank as usize].ctx) {
            // SAFETY: created in `new`, destroyed once, after its last use.
            let _ = unsafe { result::event::destroy(self.last) };
        }
    }
}
