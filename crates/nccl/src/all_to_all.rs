//! All-to-all on an NCCL without `ncclAlltoAll`: one grouped send and
//! receive per peer.

use std::ffi::c_void;

use nccl_rs_sys::{NcclLib, cudaStream_t, ncclComm_t, ncclDataType_t, ncclResult_t};

use crate::{NcclError, check};

/// Enqueue the exchange as one group: the first failing send or receive,
/// else the group's end. Every symbol is resolved before the group opens
/// (`Err`: one is missing, nothing enqueued), and the group is closed
/// whatever happens inside it — a group left open would swallow every
/// later call.
///
/// # Safety
/// `send` and `recv` are device addresses of `n` blocks of `block` bytes
/// (`count` elements of `t`) on `comm`'s device; `stream` is live.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn grouped(
    lib: &NcclLib,
    [send, recv]: [u64; 2],
    block: u64,
    count: usize,
    t: ncclDataType_t,
    n: u32,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<ncclResult_t, NcclError> {
    let missing = |name| move |_: &_| NcclError::MissingSymbol(name);
    let start = lib
        .ncclGroupStart
        .as_ref()
        .map_err(missing("ncclGroupStart"))?;
    let send_fn = lib.ncclSend.as_ref().map_err(missing("ncclSend"))?;
    let recv_fn = lib.ncclRecv.as_ref().map_err(missing("ncclRecv"))?;
    let end = lib.ncclGroupEnd.as_ref().map_err(missing("ncclGroupEnd"))?;
    let p = |x: u64| x as *mut c_void;
    // SAFETY: each block lies inside the n-block buffers (caller); the
    // group opened here is closed below on every path.
    unsafe {
        check(start())?;
        let mut first_error = None;
        for peer in 0..u64::from(n) {
            let at = peer * block;
            let sent = send_fn(p(send + at), count, t, peer as i32, comm, stream);
            let received = recv_fn(p(recv + at), count, t, peer as i32, comm, stream);
            first_error = [sent, received]
                .into_iter()
                .find(|&r| r != ncclResult_t::ncclSuccess);
            if first_error.is_some() {
                break;
            }
        }
        let ended = end();
        Ok(first_error.unwrap_or(ended))
    }
}
