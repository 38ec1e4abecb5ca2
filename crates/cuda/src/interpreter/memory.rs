//! Device memory a group sets up once (each rank's window and private
//! state), freed when the group is dropped after every launch that could
//! still touch it has stopped; and the guard that restores the caller's
//! current context.

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
