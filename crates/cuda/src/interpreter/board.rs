//! The failure board: one word per rank in page-locked host memory that
//! every GPU maps. Blocks write their rank's reason there and poll the
//! others'; the host reads it without waiting for a stream, and writes it
//! to stop a rank's blocks.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
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
        let len = (4 * ranks.max(1)).next_multiple_of(page_size());
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
