//! What a rank of a group across processes holds of the others, shared
//! by the join (`ipc.rs`) and the group (`setup.rs`): the exchange it
//! agrees through, the peers' windows mapped here, and the parts a join
//! hands the group.

use std::sync::Arc;

use cudarc::driver::{CudaContext, sys};

use super::board::Board;
use super::engine::Engine;
use super::memory::{Current, DeviceBlock};
use crate::program::Layout;

/// How the processes of a group swap bytes while they set up.
pub trait Exchange {
    /// Publish `mine` under `key` and return every rank's, by rank, once
    /// all have published (bounded by the exchange's own timeout).
    fn all_gather(&mut self, key: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>, String>;
}

/// What a joining rank set up, for [`Group::across_processes`].
pub(super) struct Parts {
    pub rank: usize,
    pub layout: Layout,
    pub engine: Arc<Engine>,
    pub window: DeviceBlock,
    pub state: DeviceBlock,
    pub windows: Vec<u64>,
    pub opened: Vec<Opened>,
    pub board: Board,
    pub exchange: Box<dyn Exchange + Send>,
}

/// Another process's window mapped here, unmapped on drop.
pub(super) struct Opened {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) ptr: u64,
}

impl Drop for Opened {
    fn drop(&mut self) {
        if let Ok(_current) = Current::bind(&self.ctx) {
            // SAFETY: opened by `cuIpcOpenMemHandle` in this context and
            // closed once; the group drops it after its launches ended.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}
