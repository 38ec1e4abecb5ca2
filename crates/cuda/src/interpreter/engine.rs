//! One GPU as the interpreter sees it: its primary context, the
//! interpreter's module (compiled for its architecture, loaded once per
//! process) and the launch.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, result, sys};
use cudarc::nvrtc::Ptx;
use ferrocoll_core::{DataType, ReduceOp};

use crate::error::CudaError;
use crate::kernels::{self, Resources};
use crate::program::Params;
use crate::program::abi::RECORDS_SHARED_MAX;

pub use crate::program::abi::THREADS;

/// An entry point of the interpreter on a device, as `ferrocoll info`
/// reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFacts {
    /// Registers per thread.
    pub registers: u32,
    /// Local memory (stack and spills) per thread, bytes.
    pub local_bytes: u32,
    /// Static shared memory per block, bytes (the records' dynamic share
    /// comes on top).
    pub static_shared_bytes: u32,
    /// Blocks of [`THREADS`] one SM holds at once, with the most dynamic
    /// shared memory a launch asks for.
    pub blocks_per_sm: u32,
}

/// A device: context and the interpreter's kernels.
pub struct Engine {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Its primary context.
    pub ctx: Arc<CudaContext>,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// What ptxas reported of each entry point for this device.
    pub resources: HashMap<String, Resources>,
    module: Arc<CudaModule>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

impl Engine {
    /// Device `ordinal`, opened once per process (the module is compiled
    /// once per process, or read from `cache`).
    pub fn shared(ordinal: usize, cache: Option<&Path>) -> Result<Arc<Engine>, CudaError> {
        static OPENED: OnceLock<Mutex<HashMap<usize, Arc<Engine>>>> = OnceLock::new();
        let opened = OPENED.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = opened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get(&ordinal) {
            return Ok(e.clone());
        }
        let e = Arc::new(Engine::open(ordinal, cache)?);
        map.insert(ordinal, e.clone());
        Ok(e)
    }

    /// Open device `ordinal`; call [`crate::probe::available`] first.
    fn open(ordinal: usize, cache: Option<&Path>) -> Result<Engine, CudaError> {
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        let mut driver = 0;
        // SAFETY: the driver is initialised (a context exists); the call
        // only writes the out-pointer.
        unsafe { sys::cuDriverGetVersion(&mut driver) }.result()?;
        let compiled = kernels::interpreter(&kernels::arch_name(major, minor)?, driver, cache)?;
        let module = ctx.load_module(Ptx::from_binary(compiled.image))?;
        let sms =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(Engine {
            ordinal,
            ctx,
            sms: sms.max(0) as u32,
            resources: compiled.resources,
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

    /// Interpreter blocks of [`THREADS`] (with the most shared memory a
    /// launch asks for) one SM holds at once: the least over every entry
    /// point.
    pub fn blocks_per_sm(&self) -> Result<u32, CudaError> {
        let mut least = u32::MAX;
        for name in kernels::interpreter_kernels() {
            least = least.min(self.kernel(&name)?.blocks_per_sm);
        }
        Ok(least)
    }

    /// What the driver says of an entry point on this device.
    pub fn kernel(&self, name: &str) -> Result<KernelFacts, CudaError> {
        let f = self.function(name)?;
        let get = |a| -> Result<u32, CudaError> {
            let mut v = 0;
            // SAFETY: a loaded function; a live out-pointer.
            unsafe { sys::cuFuncGetAttribute(&mut v, a, f.cu_function()) }.result()?;
            Ok(v.max(0) as u32)
        };
        use sys::CUfunction_attribute as A;
        Ok(KernelFacts {
            registers: get(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            local_bytes: get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            static_shared_bytes: get(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            blocks_per_sm: f.occupancy_max_active_blocks_per_multiprocessor(
                THREADS,
                RECORDS_SHARED_MAX as usize,
                None,
            )?,
        })
    }

    /// Enqueue the interpreter for `dtype` and `op` (avg: its sum, and the
    /// division the parameters carry) with one block per channel.
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
        // is (the generated header asserts every offset); the driver
        // copies it before returning; the dynamic shared memory is what
        // the parameters say the blocks may use; the rest is the caller's.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (channels, 1, 1),
                (THREADS, 1, 1),
                params.records_shared,
                stream,
                &mut args,
            )?
        };
        Ok(())
    }
}
