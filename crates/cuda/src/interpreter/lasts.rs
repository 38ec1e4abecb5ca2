//! Each in-process rank's last-launch event, so that a rank whose call
//! failed can wait for its peers' launches before it hands the call's
//! buffers back.
//!
//! Why: with zero copy a peer reads this rank's input in place and stores
//! into its output. On success the protocol itself orders that (a rank
//! drains what it keeps in place, and a receive completes only after the
//! sender's stores), but after a failure this rank's kernel returns at
//! once while a peer may be mid-way through a data pass, until it next
//! polls its alarm. Zero copy is only used by ranks that are threads of
//! one process on one GPU (one context), so their events are all here and
//! any of them may query the others'.
//!
//! Invariant: a rank unregisters its event before destroying it; queries
//! hold the lock, so none races the destruction.

use std::sync::Mutex;
use std::time::Instant;

use cudarc::driver::sys;
use ferrocoll_device::Poller;

use crate::error::CudaError;

/// The registry: one slot per rank of the group, 0 where none.
pub(super) struct Lasts {
    events: Mutex<Vec<usize>>,
}

impl Lasts {
    pub(super) fn new(ranks: usize) -> Lasts {
        Lasts {
            events: Mutex::new(vec![0; ranks]),
        }
    }

    /// `rank`'s event, alive until [`Lasts::unregister`].
    pub(super) fn register(&self, rank: usize, event: sys::CUevent) {
        self.with(|v| v[rank] = event as usize);
    }

    pub(super) fn unregister(&self, rank: usize) {
        self.with(|v| v[rank] = 0);
    }

    /// Wait until every registered rank's last launch has ended; `false`
    /// if some had not by `deadline`. The caller has the ranks' context
    /// current.
    pub(super) fn wait_all(&self, deadline: Instant) -> Result<bool, CudaError> {
        let mut poller = Poller::new();
        loop {
            if self.all_ended()? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            poller.pause();
        }
    }

    fn all_ended(&self) -> Result<bool, CudaError> {
        self.with(|v| {
            for &e in v.iter().filter(|&&e| e != 0) {
                // SAFETY: registered events are alive while they are in
                // the registry, and the lock is held.
                match unsafe { sys::cuEventQuery(e as sys::CUevent) } {
                    sys::CUresult::CUDA_SUCCESS => {}
                    sys::CUresult::CUDA_ERROR_NOT_READY => return Ok(false),
                    other => return Err(CudaError::Driver(format!("{other:?}"))),
                }
            }
            Ok(true)
        })
    }

    fn with<R>(&self, f: impl FnOnce(&mut Vec<usize>) -> R) -> R {
        f(&mut self.events.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
