//! One GPU as the interpreter sees it: its primary context, the
//! interpreter's module (compiled for its compute capability, loaded once)
//! and the launches — the interpreter itself and avg's division.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, result, sys};
use ferrocoll_core::{DataType, ReduceOp};

use crate::error::CudaError;
use crate::kernels;
use crate::program::params::Params;

/// Threads per interpreter block: every thread moves 16 bytes per access,
/// so 512 keep an SM's loads in flight (NCCL's Simple protocol uses as
/// many).
pub const THREADS: u32 = 512;

/// A device: context and the interpreter's kernels.
pub struct Engine {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Its primary context.
    pub ctx: Arc<CudaContext>,
    /// Streaming multiprocessors.
    pub sms: u32,
    module: Arc<CudaModule>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

impl Engine {
    /// Device `ordinal`, opened once per process (loading the module JIT
    /// compiles its PTX: groups opened one after another reuse it).
    pub fn shared(ordinal: usize) -> Result<Arc<Engine>, CudaError> {
        static OPENED: OnceLock<Mutex<HashMap<usize, Arc<Engine>>>> = OnceLock::new();
        let opened = OPENED.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = opened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get(&ordinal) {
            return Ok(e.clone());
        }
        let e = Arc::new(Engine::open(ordinal)?);
        map.insert(ordinal, e.clone());
        Ok(e)
    }

    /// Open device `ordinal`; call [`crate::probe::available`] first.
    fn open(ordinal: usize) -> Result<Engine, CudaError> {
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        let module =
            ctx.load_module(kernels::interpreter_ptx(kernels::arch_name(major, minor)?)?)?;
        let sms =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(Engine {
            ordinal,
            ctx,
            sms: sms.max(0) as u32,
            module,
            functions: Mutex::new(HashMap::new()),
        })
    }

    fn function(&self, name: &str) -> Result<CudaFunction, CudaError> {
        let mut map = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = map.get(name) {
            return Ok(f.clone());
        }
        let f = self.module.load_function(name)?;
        map.insert(name.to_owned(), f.clone());
        Ok(f)
    }

    /// Interpreter blocks of [`THREADS`] one SM holds at once: the least
    /// over every entry point (they differ in registers).
    pub fn blocks_per_sm(&self) -> Result<u32, CudaError> {
        let mut least = u32::MAX;
        for name in kernels::interpreter_kernels() {
            let f = self.function(&name)?;
            least = least.min(f.occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)?);
        }
        Ok(least)
    }

    /// Enqueue the interpreter for `dtype` and `op` (avg: its sum) with
    /// one block per channel.
    ///
    /// # Safety
    /// Every address in `params` is live device memory of the shape the
    /// program describes, until the launch completes; the context is
    /// current; `stream` is this device's.
    pub unsafe fn interpret(
        &self,
        stream: sys::CUstream,
        dtype: DataType,
        op: ReduceOp,
        channels: u32,
        params: &Params,
    ) -> Result<(), CudaError> {
        let name = kernels::interpreter_kernel(dtype, op);
        let f = self.function(&name)?;
        let mut p = *params;
        let mut args: [*mut c_void; 1] = [(&mut p as *mut Params).cast()];
        // SAFETY: the one parameter is `FcCall` by value, which `Params`
        // mirrors (its layout is tested against the source); the driver
        // copies it before returning; the rest is the caller's.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (channels, 1, 1),
                (THREADS, 1, 1),
                0,
                stream,
                &mut args,
            )?
        };
        Ok(())
    }

    /// Enqueue avg's division of `n` elements at `data` by `divisor`.
    ///
    /// # Safety
    /// `data` addresses `n` elements of `dtype` on this device, live until
    /// the launch completes; the context is current.
    pub unsafe fn divide(
        &self,
        stream: sys::CUstream,
        dtype: DataType,
        data: u64,
        n: u64,
        divisor: u64,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let f = self.function(&kernels::divide_kernel(dtype))?;
        // SAFETY: forwarded from the caller.
        unsafe { crate::device::launch_divide(f.cu_function(), stream, data, n, divisor) }
    }
}
