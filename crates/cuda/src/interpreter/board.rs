//! The failure board: one word per rank in page-locked host memory that
//! every GPU maps. Blocks write their rank's reason there and poll the
//! others'; the host reads it without waiting for a stream, and writes it
//! to stop a rank's blocks.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cudarc::driver::{CudaContext, result, sys};
use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use super::memory::Current;
use crate::error::CudaError;
use crate::program::params::Failure;

/// Bytes of one rank's word (`u64 *board` in `cuda/interpret.cu`).
const WORD: usize = 8;

/// The failure board: one word per rank in page-locked host memory that
/// every GPU maps. Blocks write their rank's reason there and poll the
/// others'; the host reads it without waiting for a stream, and writes it
/// to stop a rank's blocks.
pub struct Board {
    host: *mut c_void,
    /// The address kernels use.
    pub device: u64,
    ranks: usize,
    backing: Backing,
    /// The context it was registered or allocated in (bound to undo it).
    ctx: Arc<CudaContext>,
}

/// Where a board's words live.
enum Backing {
    /// Page-locked memory of this process (every rank is a thread here).
    Pinned,
    /// A shared-memory file every process of the group maps, registered
    /// with CUDA (`len` bytes mapped).
    Mapped { len: usize },
}

// SAFETY: the board is plain shared memory whose words are only accessed
// atomically (`AtomicU64` on the host, atomics and volatile loads on the
// device); the pointer is owned by the board and freed once.
unsafe impl Send for Board {}
// SAFETY: as above.
unsafe impl Sync for Board {}

impl Board {
    /// A zeroed board for `ranks` ranks, mapped into every context
    /// (portable and device-mapped).
    pub fn new(ctx: &Arc<CudaContext>, ranks: usize) -> Result<Board, CudaError> {
        let _current = Current::bind(ctx)?;
        let bytes = WORD * ranks.max(1);
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
            backing: Backing::Pinned,
            ctx: ctx.clone(),
        };
        let mut device = 0;
        // SAFETY: `host` was allocated device-mapped; the out-pointer is a
        // live local.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0).result()? };
        board.device = device;
        Ok(board)
    }

    fn word(&self, rank: usize) -> &AtomicU64 {
        assert!(rank < self.ranks, "rank {rank} of {}", self.ranks);
        // SAFETY: in bounds (asserted), 8-byte aligned (page-locked
        // allocations and mappings are page aligned), and only ever
        // accessed atomically.
        unsafe { &*self.host.cast::<AtomicU64>().add(rank) }
    }

    /// Rank `rank`'s word.
    pub fn read(&self, rank: usize) -> u64 {
        self.word(rank).load(Ordering::Acquire)
    }

    /// What `me` reports when the board is set: the failure that started
    /// it — a mismatch or a timeout, this rank's own first — rather than
    /// the "a peer failed" and "aborted" words that follow from it.
    /// `issued` is `me`'s count of calls issued: it widens the device's
    /// 32-bit call number, and names the call of words the host wrote.
    /// Calls are numbered from 0, as on every executor.
    pub fn verdict(&self, me: Rank, issued: u64, timeout: Duration) -> Option<CommError> {
        let words: Vec<(Rank, Failure, u32)> = (0..self.ranks)
            .filter_map(|r| Failure::decode(self.read(r)).map(|(f, c)| (r as Rank, f, c)))
            .collect();
        let (rank, failure, device_call) = *pick(&words, me)?;
        // The device counts calls from 1, the host's count is the calls
        // issued: either less one is the call's index.
        let call = match failure {
            Failure::Aborted => issued,
            _ => widen(device_call, issued),
        }
        .saturating_sub(1);
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
    pub fn fail(&self, rank: usize, word: u64) {
        let _ = self
            .word(rank)
            .compare_exchange(0, word, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        let current = Current::bind(&self.ctx);
        if let Err(e) = &current {
            tracing::warn!("releasing the failure board: {e}");
        }
        match self.backing {
            Backing::Pinned => {
                // SAFETY: allocated by `malloc_host` in `ctx` (bound above)
                // and freed once; the group drops the board only after its
                // launches stopped.
                if let Err(e) = unsafe { result::free_host(self.host) } {
                    tracing::warn!("freeing the failure board: {e}");
                }
            }
            Backing::Mapped { len } => {
                // SAFETY: registered (in `ctx`, bound above) and mapped by
                // `mapped`, undone once, after this process's launches
                // stopped.
                unsafe {
                    if let Err(e) = sys::cuMemHostUnregister(self.host).result() {
                        tracing::warn!("unregistering the failure board: {e}");
                    }
                    unmap(self.host, len);
                }
            }
        }
    }
}

/// A fresh name for a group's board file, in tmpfs where the system has
/// it; under a launcher's job id (`FERROCOLL_JOB_ID`) it carries the
/// prefix the launcher removes after a job, should a process die in the
/// moment between creating the file and unlinking it.
pub fn file_for_new_group(job: Option<&str>) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let nonce: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let pid = std::process::id();
    match job {
        Some(job) => dir.join(format!("ferrocoll-{job}.board-{pid}-{nonce:x}")),
        None => dir.join(format!("ferrocoll-board-{pid}-{nonce:x}")),
    }
}

impl Board {
    /// A board in the shared-memory file at `path` (created here when
    /// `create`, which must then not exist; opened otherwise), mapped and
    /// registered with CUDA so this process's kernels reach it.
    pub fn mapped(
        ctx: &Arc<CudaContext>,
        ranks: usize,
        path: &Path,
        create: bool,
    ) -> Result<Board, CudaError> {
        let len = (WORD * ranks.max(1)).next_multiple_of(page_size());
        let io = |e: std::io::Error| CudaError::Invalid(format!("board {}: {e}", path.display()));
        let mut options = std::fs::OpenOptions::new();
        options.read(true).write(true).create_new(create);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(path).map_err(io)?;
        let made = Board::map_file(ctx, ranks, path, create, &file, len);
        if made.is_err() && create {
            let _ = std::fs::remove_file(path);
        }
        made
    }

    fn map_file(
        ctx: &Arc<CudaContext>,
        ranks: usize,
        path: &Path,
        create: bool,
        file: &std::fs::File,
        len: usize,
    ) -> Result<Board, CudaError> {
        let io = |e: std::io::Error| CudaError::Invalid(format!("board {}: {e}", path.display()));
        if create {
            file.set_len(len as u64).map_err(io)?;
        } else if file.metadata().map_err(io)?.len() != len as u64 {
            return Err(CudaError::Invalid(format!(
                "board {} is not sized for {ranks} ranks",
                path.display()
            )));
        }
        let host = map(file, len).map_err(io)?;
        let _current = Current::bind(ctx)?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: `host` is a fresh page-aligned mapping of `len` bytes
        // (a multiple of the page size), unregistered in `drop`.
        let registered = unsafe { sys::cuMemHostRegister_v2(host, len, flags) }.result();
        let mut device = 0;
        let mapped = registered.and_then(|()| {
            // SAFETY: `host` was just registered device-mapped; the
            // out-pointer is a live local.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) }.result()
        });
        if let Err(e) = mapped {
            // SAFETY: undoing what this function did, once.
            unsafe {
                if registered.is_ok() {
                    let _ = sys::cuMemHostUnregister(host);
                }
                unmap(host, len);
            }
            return Err(e.into());
        }
        Ok(Board {
            host,
            device,
            ranks,
            backing: Backing::Mapped { len },
            ctx: ctx.clone(),
        })
    }
}

/// The host's page size: what a registered mapping is rounded to.
fn page_size() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: sysconf reads a system constant.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            return p as usize;
        }
    }
    4096
}

/// Map `len` bytes of `file` shared.
#[cfg(unix)]
fn map(file: &std::fs::File, len: usize) -> std::io::Result<*mut c_void> {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared read-write mapping of `len` bytes of an open
    // file of that length; the kernel picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p.cast())
}

#[cfg(not(unix))]
fn map(_: &std::fs::File, _: usize) -> std::io::Result<*mut c_void> {
    Err(std::io::Error::other(
        "a shared board needs a Unix shared mapping",
    ))
}

/// # Safety
/// `p` and `len` are a mapping made by [`map`], unmapped once.
unsafe fn unmap(p: *mut c_void, len: usize) {
    #[cfg(unix)]
    // SAFETY: forwarded from the caller.
    unsafe {
        libc::munmap(p.cast(), len);
    }
    #[cfg(not(unix))]
    let _ = (p, len);
}

/// The full number of a call the device counts modulo 2³²: the one
/// nearest the host's count of calls issued (a captured graph's replays
/// run calls the host never issued, so the device may be ahead of it).
fn widen(device: u32, issued: u64) -> u64 {
    const WRAP: u64 = 1 << 32;
    let n = (issued & !(WRAP - 1)) | u64::from(device);
    if n > issued.saturating_add(WRAP / 2) && n >= WRAP {
        n - WRAP
    } else if issued > n.saturating_add(WRAP / 2) {
        n.checked_add(WRAP).unwrap_or(n)
    } else {
        n
    }
}

/// The word that started a failure: a mismatch or timeout (`me`'s own
/// first), else `me`'s word, else the first set.
fn pick<W>(words: &[(Rank, Failure, W)], me: Rank) -> Option<&(Rank, Failure, W)> {
    let cause =
        |w: &&(Rank, Failure, W)| matches!(w.1, Failure::Mismatch { .. } | Failure::Timeout { .. });
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
            (0, Failure::Aborted, 0),
            (1, Failure::PeerFailed { peer: 2 }, 0),
            (2, Failure::Timeout { peer: 3 }, 0),
            (3, Failure::Mismatch { peer: 2 }, 0),
        ];
        // Rank 1 (which only saw a peer fail) reports rank 2's timeout.
        assert_eq!(pick(&words, 1).map(|w| w.0), Some(2));
        // Rank 3's own mismatch comes first for rank 3.
        assert_eq!(pick(&words, 3).map(|w| w.0), Some(3));
        let quiet = [
            (0, Failure::Aborted, 0),
            (4, Failure::PeerFailed { peer: 0 }, 0),
        ];
        assert_eq!(pick(&quiet, 4).map(|w| w.0), Some(4));
        assert_eq!(pick(&quiet, 2).map(|w| w.0), Some(0));
        assert!(pick::<u32>(&[], 0).is_none());
    }

    /// The device's 32-bit call number names the call nearest the host's
    /// count: equal without graphs, ahead of it under graph replay, and
    /// right across the wrap either way.
    #[test]
    fn the_device_call_number_widens_to_the_nearest_call() {
        const WRAP: u64 = 1 << 32;
        assert_eq!(widen(5, 5), 5);
        assert_eq!(widen(1_000, 3), 1_000, "replays ran past the host's count");
        assert_eq!(widen(3, 1_000), 3);
        assert_eq!(widen(u32::MAX - 1, WRAP + 1), WRAP - 2);
        assert_eq!(widen(1, WRAP - 1), WRAP + 1);
        assert_eq!(widen(7, 5 * WRAP + 7), 5 * WRAP + 7);
        assert_eq!(widen(u32::MAX, u64::MAX), u64::MAX);
    }
}
