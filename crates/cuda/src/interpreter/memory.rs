//! The memory a group sets up once: each rank's window and private state
//! in its GPU's memory, and the failure board in host memory mapped into
//! every GPU. Freed when the group is dropped, after every launch that
//! could still touch it has stopped.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use cudarc::driver::{CudaContext, result, sys};

use crate::error::CudaError;

/// Device memory of one context, zeroed, freed on drop.
pub struct DeviceBlock {
    ctx: Arc<CudaContext>,
    /// Its device address.
    pub ptr: u64,
}

impl DeviceBlock {
    /// `bytes` (at least one) of device memory on `ctx`'s device, not
    /// initialised. Allocation does not wait for the device (unlike a
    /// free), so it is safe while peers' launches spin; still set-up
    /// work, never in a call's steady path.
    pub fn alloc(ctx: &Arc<CudaContext>, bytes: u64) -> Result<DeviceBlock, CudaError> {
        let _current = Current::bind(ctx)?;
        // SAFETY: the context is current; the memory is freed once, in
        // `drop`; its owner writes it before any kernel reads it.
        let ptr = unsafe { result::malloc_sync(bytes.max(1) as usize)? };
        Ok(DeviceBlock {
            ctx: ctx.clone(),
            ptr,
        })
    }

    /// `bytes` of zeroed device memory, waiting for the zeroing: for
    /// opening a group, before any of its launches exists.
    pub fn zeroed(ctx: &Arc<CudaContext>, bytes: u64) -> Result<DeviceBlock, CudaError> {
        let block = DeviceBlock::alloc(ctx, bytes)?;
        let _current = Current::bind(ctx)?;
        // SAFETY: the block holds at least `bytes.max(1)` bytes.
        unsafe { result::memset_d8_sync(block.ptr, 0, bytes.max(1) as usize)? };
        Ok(block)
    }
}

impl Drop for DeviceBlock {
    fn drop(&mut self) {
        if let Ok(_current) = Current::bind(&self.ctx) {
            // SAFETY: allocated by `malloc_sync` in this context and freed
            // once; its owners drop it only after the launches using it
            // (a free waits for the device: never while peers spin).
            if let Err(e) = unsafe { result::free_sync(self.ptr) } {
                tracing::warn!("freeing interpreter memory: {e}");
            }
        }
    }
}

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

    /// The first rank whose word is set, with the word.
    pub fn first_failed(&self) -> Option<(usize, i32)> {
        (0..self.ranks)
            .map(|r| (r, self.read(r)))
            .find(|&(_, w)| w != 0)
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

/// The calling thread's current context, restored on drop: the caller's
/// binding survives a call into the executor.
pub struct Current {
    previous: sys::CUcontext,
}

impl Current {
    /// Make `ctx` current until the guard drops.
    pub fn bind(ctx: &Arc<CudaContext>) -> Result<Current, CudaError> {
        let mut previous = std::ptr::null_mut();
        // SAFETY: a live out-pointer; the driver was loaded (a context
        // exists).
        unsafe { sys::cuCtxGetCurrent(&mut previous).result()? };
        ctx.bind_to_thread()?;
        Ok(Current { previous })
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        // SAFETY: `previous` was current on this thread (or null: none),
        // and contexts outlive the calls that bind them.
        let _ = unsafe { sys::cuCtxSetCurrent(self.previous) };
    }
}
