//! One GPU as the executor sees it: its primary context, its kernels
//! (compiled for its compute capability and loaded once), and raw memory
//! and launch helpers over the driver API.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, result, sys};
use ferrocoll_core::{DataType, ReduceOp};

use crate::error::CudaError;
use crate::kernels::{self, MAX_POINTERS};

/// Threads per block of every launch.
const THREADS: u32 = 256;
/// Blocks per launch at most: enough to fill an H100's 132 SMs several
/// times over; each thread then loops over the rest.
const MAX_BLOCKS: u64 = 1024;

/// The pointer lists the kernels take by value (`Inputs<T>`/`Outputs<T>`
/// in `cuda/reduce.cu`: eight pointers and a count).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Pointers {
    p: [u64; MAX_POINTERS],
    count: i32,
}

/// A device: context and kernels.
pub struct Device {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Its primary context.
    pub ctx: Arc<CudaContext>,
    module: Arc<CudaModule>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// Open device `ordinal` and load the kernels, compiled for its compute
    /// capability. Call [`crate::probe::available`] first.
    pub fn open(ordinal: usize) -> Result<Device, CudaError> {
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        let arch = kernels::arch_name(major, minor)?;
        let module = ctx.load_module(kernels::ptx(arch)?)?;
        Ok(Device {
            ordinal,
            ctx,
            module,
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// Make this device's context current on the calling thread.
    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread()?;
        Ok(())
    }

    fn function(&self, name: &str) -> Result<sys::CUfunction, CudaError> {
        let mut map = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = map.get(name) {
            return Ok(f.cu_function());
        }
        let f = self.module.load_function(name)?;
        let raw = f.cu_function();
        map.insert(name.to_owned(), f);
        Ok(raw)
    }

    /// Device memory of `bytes` (at least one byte), freed with [`free`].
    pub fn alloc(&self, bytes: usize) -> Result<u64, CudaError> {
        self.bind()?;
        // SAFETY: the context is current; the memory is freed by its owner
        // once every use of it has completed (CallResources).
        Ok(unsafe { result::malloc_sync(bytes.max(1)) }?)
    }

    /// Enqueue `outputs[k] = inputs[0] op inputs[1] op …` over `n` elements
    /// of `dtype` on `stream`. Any number of inputs and outputs: beyond
    /// [`MAX_POINTERS`] the first output accumulates the rest and is then
    /// copied to the remaining outputs.
    ///
    /// # Safety
    /// Every pointer addresses `n` elements of `dtype` that this device can
    /// access, valid until the launch completes; the context is current.
    pub unsafe fn reduce_copy(
        &self,
        stream: sys::CUstream,
        dtype: DataType,
        op: ReduceOp,
        inputs: &[u64],
        outputs: &[u64],
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 || outputs.is_empty() {
            return Ok(());
        }
        if inputs.is_empty() {
            return Err(CudaError::Invalid(
                "a step with outputs has no input".into(),
            ));
        }
        let f = self.function(&kernels::reduce_kernel(dtype, op))?;
        let first_outputs = &outputs[..outputs.len().min(MAX_POINTERS)];
        // First pass: up to eight inputs into up to eight outputs.
        let head = &inputs[..inputs.len().min(MAX_POINTERS)];
        // SAFETY: forwarded from the caller.
        unsafe { self.launch(f, stream, dtype, head, first_outputs, n)? };
        // Further inputs fold into the first output, seven at a time.
        let acc = outputs[0];
        for rest in inputs[head.len()..].chunks(MAX_POINTERS - 1) {
            let mut ins = vec![acc];
            ins.extend_from_slice(rest);
            // SAFETY: elementwise in place (`acc` is read and written at the
            // same index by the same thread); the rest as above.
            unsafe { self.launch(f, stream, dtype, &ins, &[acc], n)? };
        }
        if inputs.len() > MAX_POINTERS {
            // The other first-pass outputs missed the folded inputs.
            for group in first_outputs[1..].chunks(MAX_POINTERS) {
                // SAFETY: as above; a one-input launch is a copy.
                unsafe { self.launch(f, stream, dtype, &[acc], group, n)? };
            }
        }
        for group in outputs[first_outputs.len()..].chunks(MAX_POINTERS) {
            // SAFETY: as above.
            unsafe { self.launch(f, stream, dtype, &[acc], group, n)? };
        }
        Ok(())
    }

    /// Enqueue avg's last pass: divide `n` elements at `data` by `divisor`.
    ///
    /// # Safety
    /// `data` addresses `n` elements of `dtype` on this device; the context
    /// is current.
    pub unsafe fn divide(
        &self,
        stream: sys::CUstream,
        dtype: DataType,
        data: u64,
        n: usize,
        divisor: u64,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let f = self.function(&kernels::divide_kernel(dtype))?;
        // SAFETY: forwarded from the caller.
        unsafe { launch_divide(f, stream, data, n as u64, divisor) }
    }

    /// # Safety
    /// As [`Device::reduce_copy`], with at most eight inputs and outputs.
    unsafe fn launch(
        &self,
        f: sys::CUfunction,
        stream: sys::CUstream,
        dtype: DataType,
        inputs: &[u64],
        outputs: &[u64],
        n: usize,
    ) -> Result<(), CudaError> {
        let mut ins = Pointers::default();
        ins.p[..inputs.len()].copy_from_slice(inputs);
        ins.count = inputs.len() as i32;
        let mut outs = Pointers::default();
        outs.p[..outputs.len()].copy_from_slice(outputs);
        outs.count = outputs.len() as i32;
        let mut len = n as u64;
        let per_thread = (16 / dtype.size_bytes()) as u64;
        let blocks = (n as u64)
            .div_ceil(u64::from(THREADS) * per_thread)
            .clamp(1, MAX_BLOCKS) as u32;
        let mut params: [*mut c_void; 3] = [
            (&mut outs as *mut Pointers).cast(),
            (&mut ins as *mut Pointers).cast(),
            (&mut len as *mut u64).cast(),
        ];
        // SAFETY: the parameters match `ferrocoll_<op>_<type>(Outputs<T>,
        // Inputs<T>, u64)` (`Pointers` has the kernel's layout) and live
        // until the call returns; the pointers are the caller's.
        unsafe {
            result::launch_kernel(f, (blocks, 1, 1), (THREADS, 1, 1), 0, stream, &mut params)?
        };
        Ok(())
    }
}

/// Free device memory from [`Device::alloc`].
///
/// # Safety
/// `ptr` came from `alloc` on `device`, and no work using it is pending.
pub unsafe fn free(device: &Device, ptr: u64) {
    if device.bind().is_ok() {
        // SAFETY: forwarded from the caller.
        let _ = unsafe { result::free_sync(ptr) };
    }
}

/// Enqueue `ferrocoll_div_*` (`f`) over `n` elements at `data`.
///
/// # Safety
/// `f` is a division kernel of the elements' type; `data` addresses `n`
/// of them on the current context's device, live until the launch
/// completes.
pub(crate) unsafe fn launch_divide(
    f: sys::CUfunction,
    stream: sys::CUstream,
    data: u64,
    n: u64,
    divisor: u64,
) -> Result<(), CudaError> {
    let (mut ptr, mut len, mut d) = (data, n, divisor);
    let mut params: [*mut c_void; 3] = [
        (&mut ptr as *mut u64).cast(),
        (&mut len as *mut u64).cast(),
        (&mut d as *mut u64).cast(),
    ];
    let blocks = n.div_ceil(u64::from(THREADS)).clamp(1, MAX_BLOCKS) as u32;
    // SAFETY: the parameters match `ferrocoll_div_*(T*, u64, u64)` and
    // live until the call returns (the driver copies them); the pointer
    // is the caller's.
    unsafe { result::launch_kernel(f, (blocks, 1, 1), (THREADS, 1, 1), 0, stream, &mut params)? };
    Ok(())
}
