//! The failure board: one word per rank in page-locked host memory that
//! every GPU maps. Blocks write their rank's reason there and poll the
//! others'; the host reads it without waiting for a stream, and writes it
//! to stop a rank's blocks.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use cudarc::driver::{CudaContext, result, sys};
use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use super::memory::Current;
use crate::error::CudaError;
use crate::program::params::Failure;

/// The failure board: one word per rank in page-locked host memory that
/// every GPU maps. Blocks write their rank's reason there and poll the
/// others'; the host reads it without waiting for a stream, and writes it
/// to stop a rank's blocks.
pub struct Board {
    host: *mut c_void,
    /// The address kernels use.
    pub device: u64,
    ranks: usize,
}

// SAFETY: the board is plain shared memory whose words are only accessed
// atomically (`AtomicI32` on the host, atomics and volatile loads on the
// device); the pointer is owned by the board and freed once.
unsafe impl Send for Board {}
// SAFETY: as above.
unsafe impl Sync for Board {}

impl Board {
    /// A zeroed board for `ranks` ranks, mapped into every context
    /// (portable and device-mapped).
    pub fn new(ctx: &Arc<CudaContext>, ranks: usize) -> Result<Board, CudaError> {
        let _current = Current::bind(ctx)?;
        let bytes = 4 * ranks.max(1);
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: the context is current; the memory is zeroed below
        // before any kernel sees it and freed once, in `drop`.
        let host = unsafe { result::malloc_host(bytes, flags)? };
        // SAFETY: `host` addresses `bytes` bytes just allocated.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
        let mut board = Board {
            host,
            device: 0,
            ranks,
        };
        let mut device = 0;
        // SAFETY: `host` was allocated device-mapped; the out-pointer is a
        // live local.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0).result()? };
        board.device = device;
        Ok(board)
    }

    fn word(&self, rank: usize) -> &AtomicI32 {
        assert!(rank < self.ranks, "rank {rank} of {}", self.ranks);
        // SAFETY: in bounds (asserted), 4-byte aligned (page-locked
        // allocations are page aligned), and only ever accessed atomically.
        unsafe { &*self.host.cast::<AtomicI32>().add(rank) }
    }

    /// Rank `rank`'s word.
    pub fn read(&self, rank: usize) -> i32 {
        self.word(rank).load(Ordering::Acquire)
    }

    /// What `me` reports when the board is set: the failure that started
    /// it — a mismatch or a timeout, this rank's own first — rather than
    /// the "a peer failed" and "aborted" words that follow from it.
    pub fn verdict(&self, me: Rank, call: u64, timeout: Duration) -> Option<CommError> {
        let words: Vec<(Rank, Failure)> = (0..self.ranks)
            .filter_map(|r| Failure::decode(self.read(r)).map(|f| (r as Rank, f)))
            .collect();
        let (rank, failure) = *pick(&words, me)?;
        let error = failure.error(rank, call, timeout);
        if rank == me {
            return Some(error);
        }
        Some(CommError::PeerFailed {
            rank,
            reason: error.to_string(),
        })
    }

    /// Set `rank`'s word unless it already holds a reason.
    pub fn fail(&self, rank: usize, word: i32) {
        let _ = self
            .word(rank)
            .compare_exchange(0, word, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_host` and freed once; the group
        // drops the board only after every launch has stopped.
        if let Err(e) = unsafe { result::free_host(self.host) } {
            tracing::warn!("freeing the failure board: {e}");
        }
    }
}

/// The word that started a failure: a mismatch or timeout (`me`'s own
/// first), else `me`'s word, else the first set.
fn pick(words: &[(Rank, Failure)], me: Rank) -> Option<&(Rank, Failure)> {
    let cause =
        |w: &&(Rank, Failure)| matches!(w.1, Failure::Mismatch { .. } | Failure::Timeout { .. });
    words
        .iter()
        .filter(cause)
        .find(|w| w.0 == me)
        .or_else(|| words.iter().find(cause))
        .or_else(|| words.iter().find(|w| w.0 == me))
        .or_else(|| words.first())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_names_the_failure_that_started_it() {
        let words = [
            (0, Failure::Aborted),
            (1, Failure::PeerFailed { peer: 2 }),
            (2, Failure::Timeout { peer: 3 }),
            (3, Failure::Mismatch { peer: 2 }),
        ];
        // Rank 1 (which only saw a peer fail) reports rank 2's timeout.
        assert_eq!(pick(&words, 1).map(|w| w.0), Some(2));
        // Rank 3's own mismatch comes first for rank 3.
        assert_eq!(pick(&words, 3).map(|w| w.0), Some(3));
        let quiet = [(0, Failure::Aborted), (4, Failure::PeerFailed { peer: 0 })];
        assert_eq!(pick(&quiet, 4).map(|w| w.0), Some(4));
        assert_eq!(pick(&quiet, 2).map(|w| w.0), Some(0));
        assert!(pick(&[], 0).is_none());
    }
}
