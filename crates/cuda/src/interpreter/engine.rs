//! One GPU as the interpreter sees it: its primary context, the
//! interpreter's entry points (each its own module, compiled for the
//! device's architecture on first use and loaded once per process) and
//! the launch.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, result, sys};
use cudarc::nvrtc::Ptx;
use ferrocoll_core::{DataType, ReduceOp};

use crate::error::CudaError;
use crate::kernels::{self, Resources};
use crate::program::Params;
use crate::program::abi::{MIN_BLOCKS_PER_SM, RECORDS_SHARED_MAX};

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
    arch: String,
    /// The driver's CUDA major version (a cubin loads on any of it).
    driver_major: i32,
    cache: Option<PathBuf>,
    /// Entry points loaded so far, with their modules and ptxas's report.
    loaded: Mutex<HashMap<String, Loaded>>,
}

/// An entry point's module, loaded.
struct Loaded {
    _module: Arc<CudaModule>,
    function: CudaFunction,
    resources: Resources,
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
        let sms =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(Engine {
            ordinal,
            ctx,
            sms: sms.max(0) as u32,
            arch: kernels::arch_name(major, minor)?,
            driver_major: driver / 1000,
            cache: cache.map(Path::to_path_buf),
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// The entry point for `(t, op)`, compiled and loaded on first use.
    fn function(&self, t: DataType, op: ReduceOp) -> Result<CudaFunction, CudaError> {
        Ok(self.load(t, op)?.0)
    }

    fn load(&self, t: DataType, op: ReduceOp) -> Result<(CudaFunction, Resources), CudaError> {
        let name = kernels::interpreter_kernel(t, op);
        let mut map = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = map.get(&name) {
            return Ok((l.function.clone(), l.resources));
        }
        let compiled = kernels::entry(
            &self.arch,
            (t, op),
            self.driver_major,
            self.cache.as_deref(),
        )?;
        let resources = compiled.resources.get(&name).copied().unwrap_or_default();
        let module = self.ctx.load_module(Ptx::from_binary(compiled.image))?;
        let function = module.load_function(&name)?;
        map.insert(
            name,
            Loaded {
                _module: module,
                function: function.clone(),
                resources,
            },
        );
        Ok((function, resources))
    }

    /// Interpreter blocks one SM holds at once, whichever entry point a
    /// call launches: `__launch_bounds__` makes every one fit
    /// [`MIN_BLOCKS_PER_SM`] of [`THREADS`] threads (its registers; a test
    /// holds them to it without spills), and a block's shared memory —
    /// the static part and at most [`RECORDS_SHARED_MAX`] of records — is
    /// far below an SM's. So no entry point need be compiled to know.
    pub fn blocks_per_sm(&self) -> u32 {
        MIN_BLOCKS_PER_SM
    }

    /// What the driver says of the entry point for `(t, op)` on this
    /// device (compiling it if it was not yet).
    pub fn kernel(&self, t: DataType, op: ReduceOp) -> Result<KernelFacts, CudaError> {
        let f = self.function(t, op)?;
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
        let f = self.function(dtype, op)?;
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
