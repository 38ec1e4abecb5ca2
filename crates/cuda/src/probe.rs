//! Is CUDA here? Asked before anything touches the driver or NVRTC,
//! because cudarc panics when it calls into a library that is not
//! installed — or that lacks one function (it resolves each on first
//! call). So the probe opens the libraries as cudarc would and checks
//! every function the executor can reach before any is called.

use cudarc::driver::{result, sys};
use cudarc::nvrtc::sys as nvrtc_sys;

use crate::error::CudaError;

/// The driver functions the executor calls, directly or through
/// cudarc's safe layer. Each name is also a path into cudarc's bindings,
/// so a misspelt one does not compile.
macro_rules! symbols {
    ($module:ident: $($name:ident),* $(,)?) => {
        vec![$({
            let _resolved_by_cudarc = $module::$name;
            stringify!($name)
        }),*]
    };
}

/// Every driver function the executor may call.
pub fn driver_symbols() -> Vec<&'static str> {
    symbols![sys:
        cuInit, cuDriverGetVersion, cuDeviceGet, cuDeviceGetCount, cuDeviceGetName,
        cuDeviceGetAttribute, cuDeviceTotalMem_v2, cuDeviceGetPCIBusId, cuDeviceCanAccessPeer,
        cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease_v2, cuCtxSetCurrent, cuCtxGetCurrent,
        cuCtxSynchronize, cuCtxEnablePeerAccess, cuCtxDisablePeerAccess, cuModuleLoadData, cuModuleGetFunction,
        cuModuleUnload, cuFuncGetAttribute, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
        cuLaunchKernel, cuStreamCreate, cuStreamDestroy_v2, cuStreamQuery, cuStreamSynchronize,
        cuStreamWaitEvent, cuStreamIsCapturing, cuEventCreate, cuEventRecord,
        cuEventRecordWithFlags, cuEventQuery, cuEventSynchronize, cuEventElapsedTime_v2,
        cuEventDestroy_v2, cuMemAlloc_v2, cuMemFree_v2, cuMemAllocAsync, cuMemFreeAsync,
        cuMemPoolCreate, cuMemPoolDestroy, cuMemAllocFromPoolAsync, cuMemsetD8_v2,
        cuMemsetD8Async, cuMemcpyHtoDAsync_v2, cuMemcpyDtoHAsync_v2, cuMemcpyPeerAsync,
        cuMemHostAlloc, cuMemFreeHost, cuMemHostGetDevicePointer_v2, cuMemHostRegister_v2,
        cuMemHostUnregister, cuIpcGetMemHandle, cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle,
        cuGetErrorName, cuGetErrorString,
    ]
}

/// Every NVRTC function the executor may call.
pub fn nvrtc_symbols_used() -> Vec<&'static str> {
    symbols![nvrtc_sys:
        nvrtcVersion, nvrtcCreateProgram, nvrtcCompileProgram, nvrtcDestroyProgram,
        nvrtcGetProgramLogSize, nvrtcGetProgramLog, nvrtcGetCUBINSize, nvrtcGetCUBIN,
        nvrtcGetErrorString,
    ]
}

/// The symbols of `names` that `library` (opened the way cudarc opens
/// it: the first of its names that loads) lacks; `None` when it does not
/// load at all.
fn missing_in(candidates: &[String], names: &[&'static str]) -> Option<Vec<&'static str>> {
    // SAFETY: opening a system library by name runs its initialisers,
    // which is what cudarc does with the same names; nothing in it is
    // called here.
    let lib = candidates
        .iter()
        .find_map(|c| unsafe { libloading::Library::new(c) }.ok())?;
    Some(missing_symbols(&lib, names))
}

/// The symbols of `names` that `lib` lacks.
pub fn missing_symbols(lib: &libloading::Library, names: &[&'static str]) -> Vec<&'static str> {
    names
        .iter()
        .copied()
        // SAFETY: only looks the symbol up; the pointer is never used.
        .filter(|name| unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err())
        .collect()
}

/// A typed error for a library that lacks functions.
fn lacking(library: &str, missing: &[&str], hint: &str) -> CudaError {
    let shown: Vec<&str> = missing.iter().copied().take(6).collect();
    CudaError::BackendUnavailable {
        reason: format!(
            "{library} lacks {} function(s) ferrocoll calls ({}{}): {hint}",
            missing.len(),
            shown.join(", "),
            if missing.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        ),
    }
}

/// Whether the CUDA driver library (`libcuda`) can be loaded.
#[cfg(feature = "dynamic-loading")]
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by its usual names; it calls
    // nothing in it.
    unsafe { sys::is_culib_present() }
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
    unsafe { nvrtc_sys::is_culib_present() }
}

/// Linked, as for the driver.
#[cfg(not(feature = "dynamic-loading"))]
pub fn nvrtc_present() -> bool {
    true
}

/// The file names cudarc tries for `lib`.
#[cfg(feature = "dynamic-loading")]
fn candidates(lib: &str) -> Vec<String> {
    cudarc::get_lib_name_candidates(lib)
}

/// Linked, there is no library to open by name.
#[cfg(not(feature = "dynamic-loading"))]
fn candidates(_lib: &str) -> Vec<String> {
    Vec::new()
}

/// The driver library has every function the executor calls.
pub fn driver_symbols_present() -> Result<(), CudaError> {
    if !cfg!(feature = "dynamic-loading") {
        return Ok(());
    }
    let names = candidates("cuda");
    match missing_in(&names, &driver_symbols()) {
        Some(missing) if !missing.is_empty() => Err(lacking(
            "libcuda",
            &missing,
            "the NVIDIA driver is older than CUDA 13.0, which ferrocoll is built for",
        )),
        _ => Ok(()),
    }
}

/// NVRTC has every function the executor calls.
pub fn nvrtc_symbols() -> Result<(), CudaError> {
    if !cfg!(feature = "dynamic-loading") {
        return Ok(());
    }
    let names = candidates("nvrtc");
    match missing_in(&names, &nvrtc_symbols_used()) {
        Some(missing) if !missing.is_empty() => Err(lacking(
            "libnvrtc",
            &missing,
            "install NVRTC 13 (the CUDA toolkit, or the nvidia-cuda-nvrtc wheel)",
        )),
        _ => Ok(()),
    }
}

/// The driver is loadable, has what the executor calls, initialises,
/// and sees at least one device; returns the device count.
pub fn devices() -> Result<usize, CudaError> {
    if !driver_present() {
        return Err(CudaError::BackendUnavailable {
            reason: "libcuda is not installed (no NVIDIA driver on this machine)".into(),
        });
    }
    driver_symbols_present()?;
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
    nvrtc_symbols()?;
    Ok(count)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// A driver library that has some functions and not others is a
    /// typed error naming what it lacks — checked on a stub built here
    /// (it needs a C compiler; CI has one).
    #[test]
    fn a_library_missing_a_function_is_named_not_a_panic() {
        let dir = std::env::temp_dir().join(format!("ferrocoll-stub-cuda-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("stub.c");
        std::fs::write(
            &src,
            "int cuInit(unsigned f) { return 0; }\nint cuDriverGetVersion(int *v) { *v = 13000; return 0; }\n",
        )
        .unwrap();
        let lib = dir.join("libcuda.so.1");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let built = std::process::Command::new(&cc)
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&src)
            .status();
        if !built.is_ok_and(|s| s.success()) {
            if std::env::var("FERROCOLL_REQUIRE_HOST_KERNEL").is_ok_and(|v| v == "1") {
                panic!("no C compiler `{cc}` to build the stub driver");
            }
            eprintln!("SKIPPED: no C compiler to build a stub driver");
            return;
        }
        let missing = missing_in(&[lib.to_string_lossy().into_owned()], &driver_symbols())
            .expect("the stub loads");
        assert!(!missing.contains(&"cuInit") && !missing.contains(&"cuDriverGetVersion"));
        assert!(missing.contains(&"cuLaunchKernel") && missing.contains(&"cuMemPoolCreate"));
        let e = lacking("libcuda", &missing, "too old");
        assert!(
            matches!(&e, CudaError::BackendUnavailable { reason } if reason.contains("cuDeviceGet")),
            "{e}"
        );
        assert!(missing_in(&["/no/such/libcuda.so".into()], &driver_symbols()).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every driver function this crate calls by name is in the list the
    /// probe checks (calls made through cudarc's safe layer are listed by
    /// hand beside them).
    #[test]
    fn every_driver_function_called_here_is_probed() {
        let listed = driver_symbols();
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut sources = vec![std::path::PathBuf::from(root)];
        let mut called = Vec::new();
        while let Some(p) = sources.pop() {
            if p.is_dir() {
                sources.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            } else if p.extension().is_some_and(|e| e == "rs") && !p.ends_with("probe.rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for (i, _) in text.match_indices("sys::cu") {
                    let name: String = text[i + 5..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    called.push((name, p.clone()));
                }
            }
        }
        for (name, file) in called {
            if name.starts_with("cuda") || name.starts_with("CU") {
                continue;
            }
            assert!(
                listed.contains(&name.as_str()),
                "{} calls {name}, which the probe does not check",
                file.display()
            );
        }
    }
}
