//! A rank's programs in its device's memory: each plan's packed tables and
//! scratch, set up on the plan's first call with stream-ordered
//! allocations and copies on the caller's stream (a plain allocation could
//! keep the GPU from running a peer's launch beside the one spinning for
//! it), kept for later calls, the least recently used released past
//! [`KEEP`] — except those a captured graph uses, which stay for the
//! communicator's life (the graph may replay at any time).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaStream, result, sys};
use ferrocoll_core::comm::Planned;

use super::error::InterpreterError;
use super::memory::Pool;
use super::setup::Group;
use crate::error::CudaError;
use crate::program::DeviceProgram;
use crate::program::params::{Packed, pack};

/// Programs a rank keeps in device memory.
pub const KEEP: usize = 64;

/// A program's tables for one rank and the scratch its plan needs.
pub struct Loaded {
    pub program: Arc<DeviceProgram>,
    pub packed: Packed,
    pub tables: u64,
    pub scratch: u64,
    used: u64,
    /// Called under graph capture: never released before the rank.
    pinned: bool,
}

/// A rank's loaded programs, by plan signature.
#[derive(Default)]
pub struct Programs {
    map: HashMap<u64, Loaded>,
    uses: u64,
}

impl Programs {
    /// `planned`'s program for `rank`, loaded on `stream` from the rank's
    /// `pool` if this is its first call (refused while `capturing`: the
    /// upload is not part of the call). The context must be current.
    pub fn get(
        &mut self,
        group: &Group,
        rank: usize,
        planned: &Planned,
        (stream, pool): (&CudaStream, &Pool),
        capturing: bool,
        release: (sys::CUstream, sys::CUevent),
    ) -> Result<&Loaded, InterpreterError> {
        self.uses += 1;
        if !self.map.contains_key(&planned.signature) {
            let s = stream.cu_stream();
            if capturing {
                return Err(CudaError::Invalid(
                    "this call's shape has not run before: its plan is uploaded on its first \
                     call, which must not be under graph capture (run it once before capturing)"
                        .into(),
                )
                .into());
            }
            if self.map.len() >= KEEP {
                self.evict(release);
            }
            let program = group.program(planned)?;
            let loaded = upload(program, rank, s, pool)?;
            self.map.insert(planned.signature, loaded);
        }
        let loaded = self
            .map
            .get_mut(&planned.signature)
            .expect("inserted above");
        loaded.used = self.uses;
        loaded.pinned |= capturing;
        Ok(loaded)
    }

    /// Release every program: on `own` stream after `last` (every launch
    /// of the rank), so none is freed while a launch reads it.
    pub fn release_all(&mut self, release: (sys::CUstream, sys::CUevent)) {
        for (_, l) in self.map.drain() {
            free(&l, release);
        }
    }

    fn evict(&mut self, release: (sys::CUstream, sys::CUevent)) {
        let oldest = self
            .map
            .iter()
            .filter(|(_, l)| !l.pinned)
            .min_by_key(|(_, l)| l.used)
            .map(|(&k, _)| k);
        if let Some(l) = oldest.and_then(|k| self.map.remove(&k)) {
            free(&l, release);
        }
    }
}

/// Allocate and fill a program's blocks on stream `s` from `pool`.
fn upload(
    program: Arc<DeviceProgram>,
    rank: usize,
    s: sys::CUstream,
    pool: &Pool,
) -> Result<Loaded, InterpreterError> {
    let (blob, packed) = pack(&program.ranks[rank]);
    let scratch_bytes = program.scratch_bytes.max(1) as usize;
    // SAFETY: the context is current and `s` its stream; the blocks are
    // used only by work ordered after these operations on `s` (or after
    // the rank's event, recorded behind them) and freed in stream order
    // after the rank's last launch. The copy from pageable memory returns
    // once the blob is staged, so the blob may go.
    unsafe {
        let tables = pool.alloc(blob.len(), s)?;
        let scratch = match pool.alloc(scratch_bytes, s) {
            Ok(p) => p,
            Err(e) => {
                Pool::free(tables, s);
                return Err(e.into());
            }
        };
        let loaded = Loaded {
            program,
            packed,
            tables,
            scratch,
            used: 0,
            pinned: false,
        };
        let filled = result::memcpy_htod_async(tables, &blob, s)
            .and_then(|()| result::memset_d8_async(scratch, 0, scratch_bytes, s));
        if let Err(e) = filled {
            free(&loaded, (s, std::ptr::null_mut()));
            return Err(CudaError::from(e).into());
        }
        Ok(loaded)
    }
}

/// Free a program's blocks on `stream` once `after` (if any) has fired.
fn free(l: &Loaded, (stream, after): (sys::CUstream, sys::CUevent)) {
    // SAFETY: the blocks came from `malloc_async` and are freed once; the
    // free waits, in stream order, for the rank's last launch.
    unsafe {
        if !after.is_null() {
            let _ = result::stream::wait_event(
                stream,
                after,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            );
        }
        let _ = result::free_async(l.tables, stream);
        let _ = result::free_async(l.scratch, stream);
    }
}
