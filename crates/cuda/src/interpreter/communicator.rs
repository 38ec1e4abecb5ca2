//! A rank of a device-interpreter group: the stream-ordered device API
//! ([`DeviceCommunicator`]). A call plans (once per shape), finds its
//! program's tables already in device memory (uploaded on the shape's
//! first call), and enqueues one launch on the caller's stream — no
//! allocation, no host synchronization and no per-chunk host work.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, result, sys};
use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;
use ferrocoll_core::types::CallShape;
use ferrocoll_device::{DeviceCall, DeviceCommunicator};

use super::error::InterpreterError;
use super::loaded::Programs;
use super::memory::{Current, Pool};
use super::setup::Group;
use crate::error::CudaError;
use crate::program::Params;
use crate::program::abi::ABORTED;
use crate::program::params::Addresses;
use ferrocoll_device::Poller;

/// How long launches stopped by a failure get to end before `synchronize`
/// and drop give up on them (they poll the board every 1024 spins).
const GRACE: Duration = Duration::from_secs(5);

/// `after` from now, or as far as an `Instant` goes.
fn deadline(after: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(1 << 30))
}

/// One rank of a device-interpreter group.
pub struct CudaCommunicator {
    rank: Rank,
    group: Arc<Group>,
    programs: Programs,
    /// Recorded after each launch, and waited for by the next: calls of
    /// this rank run in order whichever streams they are issued on (two
    /// launches of one rank at once would share its counters).
    last: sys::CUevent,
    /// A stream of the rank's own (non-blocking), for callers that have
    /// none, and where the rank's memory is released.
    stream: Arc<CudaStream>,
    /// Owns `last` (destroyed after this rank's drop has waited for it)
    /// and the rank's memory pool.
    own: Own,
    calls: u64,
    failed: Option<CommError>,
}

// SAFETY: the raw event belongs to this communicator alone and is used by
// the thread that holds `&mut self` (or drops it).
unsafe impl Send for CudaCommunicator {}

/// A rank's ordering event, own stream and memory pool, made before the
/// rank joins a group (so that a failure to make them is one the ranks
/// agree on).
pub(super) struct Own {
    ctx: Arc<CudaContext>,
    last: sys::CUevent,
    stream: Arc<CudaStream>,
    pub(super) pool: Arc<Pool>,
}

// SAFETY: the raw event is used only by the communicator that holds it,
// one thread at a time (`&mut self`), and destroyed once.
unsafe impl Send for Own {}

impl Own {
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Result<Own, CudaError> {
        let _current = Current::bind(ctx)?;
        let stream = ctx.new_stream()?;
        let pool = Arc::new(Pool::new(ctx)?);
        let last = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
        Ok(Own {
            ctx: ctx.clone(),
            last,
            stream,
            pool,
        })
    }
}

impl Drop for Own {
    fn drop(&mut self) {
        if let Ok(_current) = Current::bind(&self.ctx) {
            // SAFETY: created in `new`, destroyed once, after its last use
            // (the communicator's drop waited for it).
            let _ = unsafe { result::event::destroy(self.last) };
        }
    }
}

impl CudaCommunicator {
    pub(super) fn new(rank: Rank, group: Arc<Group>) -> Result<Self, CudaError> {
        let own = Own::new(&group.engine(rank as usize).ctx)?;
        Ok(CudaCommunicator::with(rank, group, own))
    }

    pub(super) fn with(rank: Rank, group: Arc<Group>, own: Own) -> Self {
        group.lasts.register(rank as usize, own.last);
        CudaCommunicator {
            rank,
            group,
            programs: Programs::default(),
            last: own.last,
            stream: own.stream.clone(),
            own,
            calls: 0,
            failed: None,
        }
    }

    /// The rank's own stream (each rank of a group has a different one,
    /// which ranks sharing a GPU need: their launches must run at once).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The rank's own pool for stream-ordered allocations.
    pub(super) fn pool(&self) -> Arc<Pool> {
        self.own.pool.clone()
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

    fn board_error(&self) -> Option<CommError> {
        let timeout = self.group.config.planning.timeout;
        self.group.board.verdict(self.rank, self.calls, timeout)
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
            purpose: Default::default(),
        };
        let planned = self.group.plan(&shape)?;
        let engine = self.group.engine(rank).clone();
        let _current = Current::bind(&engine.ctx)?;
        let s = stream.cu_stream();
        // Under capture the ordering event becomes an external node, so it
        // still orders (and can be waited on) when the graph replays.
        // SAFETY: the caller's live stream.
        let capturing = unsafe { result::stream::is_capturing(s) }.map_err(CudaError::from)?
            != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let release = (self.stream.cu_stream(), self.last);
        let loaded = self.programs.get(
            &self.group,
            rank,
            &planned,
            (stream, &self.own.pool),
            capturing,
            release,
        )?;
        let program = loaded.program.clone();
        let buffers = [
            call.input.unwrap_or(call.output),
            call.output,
            loaded.scratch,
        ];
        let params = Params::new(
            &program,
            self.rank,
            &loaded.packed,
            &Addresses {
                tables: loaded.tables,
                windows: self.group.window_addresses(),
                buffers,
                state: self.group.state(rank),
                board: self.group.board.device,
            },
            self.group.config.planning.timeout,
            self.group.scope,
        );
        let me = &program.ranks[rank];
        let (wait, record) = if capturing {
            (
                sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL,
                sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
            )
        } else {
            (sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT, 0)
        };
        // SAFETY: the event and stream are this device's; the tables,
        // windows, state, scratch and board outlive the launch (the group
        // and the programs are released only after `last`); the caller
        // vouches for the buffers (`enqueue`).
        unsafe {
            result::stream::wait_event(s, self.last, wait).map_err(CudaError::from)?;
            if !me.channels.is_empty() {
                engine.interpret(s, program.dtype, call.op, me.channels.len() as u32, &params)?;
            }
            sys::cuEventRecordWithFlags(self.last, s, record)
                .result()
                .map_err(CudaError::from)?;
        }
        self.calls += 1;
        tracing::debug!(rank = self.rank, protocol = ?program.protocol, "{}", planned.describe());
        Ok(())
    }

    /// After a failure, wait (at most [`GRACE`]) for the peers' launches
    /// that may still read or store into this rank's buffers in place
    /// (see `lasts`); staged messages never touch them.
    fn wait_for_peers(&self) -> Result<(), InterpreterError> {
        if !self.group.layout.zero_copy {
            return Ok(());
        }
        let _current = Current::bind(self.context())?;
        if self.group.lasts.wait_all(deadline(GRACE))? {
            return Ok(());
        }
        Err(CommError::Timeout {
            rank: self.rank,
            timeout: GRACE,
            what: "the peers' launches to end after a failure (this rank's buffers may still be \
                   in use)"
                .into(),
        }
        .into())
    }

    /// Wait for this rank's last launch; `false` if it did not end by
    /// `deadline`.
    fn wait_last(&self, deadline: Instant) -> Result<bool, CudaError> {
        let _current = Current::bind(&self.group.engine(self.rank as usize).ctx)?;
        let mut poller = Poller::new();
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
            poller.pause();
        }
    }
}

// SAFETY: `size` and `context` are the group's and the rank's device's;
// `enqueue` touches the call's buffers as its collective defines and
// nothing else of the caller's.
unsafe impl DeviceCommunicator for CudaCommunicator {
    type Error = InterpreterError;

    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> u32 {
        self.group.layout.world_size
    }

    fn context(&self) -> &Arc<CudaContext> {
        &self.group.engine(self.rank as usize).ctx
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

    /// Waits for the stream even when the communicator has failed —
    /// launches queued behind a failure return at once — so that the
    /// caller may free the call's buffers once this returns (unless the
    /// stream would not drain within the grace period: then it says so).
    fn synchronize(&mut self, stream: &CudaStream) -> Result<(), InterpreterError> {
        let timeout = self.group.config.planning.timeout;
        // The kernels give up after the timeout themselves; the host
        // allows them a little longer to notice.
        let mut until = match self.failed {
            Some(_) => deadline(GRACE),
            None => deadline(timeout.saturating_add(Duration::from_secs(1))),
        };
        let _current = Current::bind(self.context())?;
        let mut poller = Poller::new();
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
            let now = Instant::now();
            if self.failed.is_none() {
                if let Some(e) = self.board_error() {
                    self.fail(e.into());
                    until = until.min(deadline(GRACE));
                } else if now >= until {
                    let what = "the stream's collectives".into();
                    let rank = self.rank;
                    self.fail(
                        CommError::Timeout {
                            rank,
                            timeout,
                            what,
                        }
                        .into(),
                    );
                    until = deadline(GRACE);
                }
            } else if now >= until {
                let e = CommError::Timeout {
                    rank: self.rank,
                    timeout: GRACE,
                    what: "the stream to drain after a failure (its buffers may still be in use)"
                        .into(),
                };
                return Err(e.into());
            }
            poller.pause();
        }
        if self.failed.is_some() {
            self.wait_for_peers()?;
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

impl Drop for CudaCommunicator {
    fn drop(&mut self) {
        // Wait for the last launch (it ends by its timeout at the latest;
        // stopped sooner if it has not), then release the programs in
        // stream order behind it.
        let stuck = !matches!(
            self.wait_last(deadline(self.group.config.planning.timeout)),
            Ok(true)
        );
        if stuck {
            self.group.board.fail(self.rank as usize, ABORTED);
            let _ = self.wait_last(deadline(GRACE));
        }
        // The scratch the programs hold may be a peer's to read in place.
        if stuck || self.failed.is_some() {
            let _ = self.wait_for_peers();
        }
        if let Ok(_current) = Current::bind(&self.group.engine(self.rank as usize).ctx) {
            self.programs
                .release_all((self.stream.cu_stream(), self.last));
        }
        self.group.lasts.unregister(self.rank as usize);
    }
}
