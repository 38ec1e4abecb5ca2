//! Is CUDA here? Asked before anything touches the driver, because cudarc
//! panics when it calls into a library that is not installed.

use cudarc::driver::result;

use crate::error::CudaError;

/// Whether the CUDA driver library (`libcuda`) can be loaded.
#[cfg(feature = "dynamic-loading")]
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by its usual names; it calls
    // nothing in it.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Linked (without `dynamic-loading`), the library was there for the
/// program to start.
#[cfg(not(feature = "dynamic-loading"))]
pub fn driver_present() -> bool {
    true
}

/// Whether NVRTC (`libnvrtc`) can be loaded.
#[cfg(feature = "dynamic-loading")]
pub fn nvrtc_present() -> bool {
    // SAFETY: as for the driver: opening the library only.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Linked, as for the driver.
#[cfg(not(feature = "dynamic-loading"))]
pub fn nvrtc_present() -> bool {
    true
}

/// The driver is loadable, initialises, and sees at least one device;
/// returns the device count.
pub fn devices() -> Result<usize, CudaError> {
    if !driver_present() {
        return Err(CudaError::BackendUnavailable {
            reason: "libcuda is not installed (no NVIDIA driver on this machine)".into(),
        });
    }
    result::init().map_err(|e| CudaError::BackendUnavailable {
        reason: format!("the CUDA driver is installed but does not initialise: {e}"),
    })?;
    let count = result::device::get_count().map_err(CudaError::from)?;
    if count <= 0 {
        return Err(CudaError::BackendUnavailable {
            reason: "the CUDA driver sees no device".into(),
        });
    }
    Ok(count as usize)
}

/// Everything the executor needs: a driver with devices, and NVRTC.
pub fn available() -> Result<usize, CudaError> {
    let count = devices()?;
    if !nvrtc_present() {
        return Err(CudaError::BackendUnavailable {
            reason: "libnvrtc is not installed or not on LD_LIBRARY_PATH (the CUDA toolkit, or \
                     the NVRTC Python wheel's nvidia/cu13/lib)"
                .into(),
        });
    }
    Ok(count)
}
