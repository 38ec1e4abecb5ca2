//! Memory a group sets up once (each rank's window, in device memory or
//! in pinned host memory every GPU maps, and its private state), freed
//! when the group is dropped after every launch that could still touch it
//! has stopped; each rank's own pool for what calls allocate in stream
//! order; and the guard that restores the caller's current context.

use std::sync::Arc;

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
    /// initialised. A plain allocation (and its free) can keep the GPU
    /// from running other streams' work beside work already running, so
    /// this is for opening a group, before any of its launches exists;
    /// calls allocate stream-ordered (`loaded.rs`, `host.rs`).
    fn alloc(ctx: &Arc<CudaContext>, bytes: u64) -> Result<DeviceBlock, CudaError> {
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
            // once; its owner (the group) drops it only after stopping and
            // waiting for every launch of its ranks.
            if let Err(e) = unsafe { result::free_sync(self.ptr) } {
                tracing::warn!("freeing interpreter memory: {e}");
            }
        }
    }
}

/// Page-locked host memory every context maps (portable, device-mapped):
/// where windows go when some pair of GPUs has no peer access — the
/// seed article's relay through host memory, as a place rather than a
/// copy. Freed on drop.
pub struct HostBlock {
    ctx: Arc<CudaContext>,
    host: *mut std::ffi::c_void,
    /// Its address on every device.
    pub ptr: u64,
}

// SAFETY: plain memory owned by the block and freed once; every access to
// its bytes by kernels is ordered by the protocol's counters.
unsafe impl Send for HostBlock {}
// SAFETY: as above; the block itself is never written through `&self`.
unsafe impl Sync for HostBlock {}

impl HostBlock {
    /// `bytes` of zeroed pinned memory mapped into every context.
    pub fn zeroed(ctx: &Arc<CudaContext>, bytes: u64) -> Result<HostBlock, CudaError> {
        let _current = Current::bind(ctx)?;
        let bytes = bytes.max(1) as usize;
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: the context is current; freed once, in `drop`.
        let host = unsafe { result::malloc_host(bytes, flags)? };
        let mut block = HostBlock {
            ctx: ctx.clone(),
            host,
            ptr: 0,
        };
        // SAFETY: `host` holds `bytes` bytes just allocated.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
        // SAFETY: allocated device-mapped; the out-pointer is a live field.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut block.ptr, host, 0).result()? };
        Ok(block)
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        if let Ok(_current) = Current::bind(&self.ctx) {
            // SAFETY: allocated by `malloc_host` and freed once, after
            // every launch that used it (the group's drop waits for them).
            if let Err(e) = unsafe { result::free_host(self.host) } {
                tracing::warn!("freeing a host window: {e}");
            }
        }
    }
}

/// A rank's own pool for stream-ordered allocations (its programs'
/// tables and scratch, staged host slices). Ranks sharing a GPU would
/// otherwise share the device's default pool, whose reuse of a block
/// freed on one rank's stream for another's inserts a dependency between
/// their streams — and their launches wait on each other.
pub struct Pool {
    ctx: Arc<CudaContext>,
    pool: sys::CUmemoryPool,
}

// SAFETY: a driver handle owned by the pool and destroyed once; the
// driver's pool calls are thread-safe.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

impl Pool {
    /// A new pool on `ctx`'s device.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Pool, CudaError> {
        let _current = Current::bind(ctx)?;
        // SAFETY: all-zero is a valid bit pattern of the props (integers
        // and a null pointer); the fields that matter are set below.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ctx.ordinal() as i32;
        let mut pool = std::ptr::null_mut();
        // SAFETY: live props and out-pointer; destroyed once, in `drop`.
        unsafe { sys::cuMemPoolCreate(&mut pool, &props).result()? };
        Ok(Pool {
            ctx: ctx.clone(),
            pool,
        })
    }

    /// `bytes` (at least one) on `stream`, in stream order.
    ///
    /// # Safety
    /// The pool's context is current and `stream` is its device's; the
    /// block is freed with [`Pool::free`] on a stream ordered after its
    /// last use.
    pub unsafe fn alloc(&self, bytes: usize, stream: sys::CUstream) -> Result<u64, CudaError> {
        let mut ptr = 0;
        // SAFETY: forwarded from the caller; a live out-pointer.
        unsafe {
            sys::cuMemAllocFromPoolAsync(&mut ptr, bytes.max(1), self.pool, stream).result()?
        };
        Ok(ptr)
    }

    /// Free a block of this pool on `stream`, in stream order.
    ///
    /// # Safety
    /// `ptr` came from [`Pool::alloc`] and is freed once, on a stream
    /// ordered after its last use.
    pub unsafe fn free(ptr: u64, stream: sys::CUstream) {
        // SAFETY: forwarded from the caller.
        let _ = unsafe { result::free_async(ptr, stream) };
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Ok(_current) = Current::bind(&self.ctx) {
            // SAFETY: created in `new`, destroyed once; blocks still
            // outstanding keep the pool's memory until they are freed
            // (the driver releases it then).
            let _ = unsafe { sys::cuMemPoolDestroy(self.pool) };
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
