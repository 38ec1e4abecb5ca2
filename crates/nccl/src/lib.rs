//! # ferrocoll-nccl
//!
//! A thin safe NCCL communicator behind ferrocoll's
//! [`Communicator`](ferrocoll_core::comm::Communicator) trait, so the bench and the conformance kit can put NCCL beside
//! ferrocoll's own schedules.
//!
//! NCCL is loaded at run time ([`nccl_rs_sys::library`]); without it every
//! entry point returns [`NcclError::NotFound`]. Communicators are created
//! non-blocking (`blocking = 0`) and every wait — initialisation, a
//! collective — polls `ncclCommGetAsyncError` and the stream against the
//! configured timeout, aborting the communicator on timeout or error, so a
//! dead peer is an error and never a hang. Dropping a communicator never
//! panics: finalisation errors are logged.

mod all_to_all;
mod communicator;
mod device;
mod enqueue;
mod error;
mod group;
mod split;

pub use communicator::{NcclCommunicator, NcclConfig, UniqueId, unique_id};
pub use error::NcclError;
pub use ferrocoll_device::{ArgumentError, DeviceCall, DeviceCommunicator};
pub use group::run;

use nccl_rs_sys::{library, ncclResult_t};

/// Run an NCCL function by name, or return [`NcclError::MissingSymbol`]
/// when the loaded library lacks it.
macro_rules! call {
    ($lib:expr, $name:ident ( $($arg:expr),* $(,)? )) => {{
        let f = $lib
            .$name
            .as_ref()
            .map_err(|_| $crate::NcclError::MissingSymbol(stringify!($name)))?;
        f($($arg),*)
    }};
}
pub(crate) use call;

/// The version of the loaded NCCL: (major, minor, patch).
pub fn version() -> Result<(u32, u32, u32), NcclError> {
    let lib = library()?;
    let mut code = 0;
    // SAFETY: a valid out-pointer; the function only writes it.
    let r = unsafe { call!(lib, ncclGetVersion(&mut code)) };
    check(r)?;
    let code = code as u32;
    // NCCL 2.9 and later encode major·10000 + minor·100 + patch.
    Ok((code / 10000, (code / 100) % 100, code % 100))
}

/// NCCL's description of a result code.
pub fn error_string(code: ncclResult_t) -> Result<String, NcclError> {
    let lib = library()?;
    // SAFETY: returns a pointer to a static string (or null).
    let ptr = unsafe { call!(lib, ncclGetErrorString(code)) };
    if ptr.is_null() {
        return Ok(format!("{code:?}"));
    }
    // SAFETY: a NUL-terminated static string from NCCL.
    Ok(unsafe { std::ffi::CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned())
}

/// Every result code NCCL defines, for tests and error tables.
pub const RESULT_CODES: [ncclResult_t; 9] = [
    ncclResult_t::ncclSuccess,
    ncclResult_t::ncclUnhandledCudaError,
    ncclResult_t::ncclSystemError,
    ncclResult_t::ncclInternalError,
    ncclResult_t::ncclInvalidArgument,
    ncclResult_t::ncclInvalidUsage,
    ncclResult_t::ncclRemoteError,
    ncclResult_t::ncclInProgress,
    ncclResult_t::ncclTimeout,
];

/// `Ok` for success, the typed error otherwise.
pub(crate) fn check(r: ncclResult_t) -> Result<(), NcclError> {
    if r == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    Err(NcclError::Nccl {
        code: r,
        message: error_string(r).unwrap_or_else(|_| format!("{r:?}")),
    })
}
