//! One process per GPU: a rank joins a group whose other ranks are other
//! processes. They agree on the layout and on being on distinct GPUs,
//! share the failure board through a shared-memory file every process
//! registers with CUDA, and map each other's windows through CUDA IPC
//! handles. What travels between the processes goes through an
//! [`Exchange`] (the facade's env:// store).
//!
//! Every step is agreed: each rank publishes its step's outcome, and if any
//! rank failed, every rank returns the error — none is left waiting for a
//! peer that gave up.

use std::sync::Arc;

use cudarc::driver::{CudaContext, sys};
use ferrocoll_core::Rank;

use super::board::Board;
use super::communicator::InterpreterCommunicator;
use super::engine::Engine;
use super::memory::{Current, DeviceBlock};
use super::residency;
use super::setup::{self, Group};
use crate::config::CudaConfig;
use crate::error::CudaError;
use crate::probe;
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
    ctx: Arc<CudaContext>,
    ptr: u64,
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

const KEY: &str = "ferrocoll-interpreter";

/// Publish this rank's outcome of a step; every rank's payload if all
/// succeeded, else the first failure (the same error on every rank).
fn agree(
    exchange: &mut dyn Exchange,
    step: &str,
    mine: Result<Vec<u8>, String>,
) -> Result<Vec<Vec<u8>>, CudaError> {
    let tagged = match &mine {
        Ok(bytes) => [b"ok:".as_slice(), bytes].concat(),
        Err(why) => format!("!!:{why}").into_bytes(),
    };
    let all = exchange
        .all_gather(&format!("{KEY}/{step}"), &tagged)
        .map_err(|e| CudaError::Invalid(format!("joining the device group ({step}): {e}")))?;
    let mut out = Vec::with_capacity(all.len());
    for (r, blob) in all.into_iter().enumerate() {
        match blob.strip_prefix(b"ok:") {
            Some(bytes) => out.push(bytes.to_vec()),
            None => {
                let why = String::from_utf8_lossy(blob.get(3..).unwrap_or_default());
                return Err(CudaError::Invalid(format!(
                    "rank {r} could not join the device group ({step}): {why}"
                )));
            }
        }
    }
    Ok(out)
}

/// What ranks must have in common, as bytes: the layout.
fn describe(layout: &Layout) -> String {
    format!(
        "{} ranks, {} channels, {} slots of {} B, LL slots of {} B",
        layout.world_size,
        layout.max_channels,
        layout.slots,
        layout.slot_bytes,
        layout.ll_slot_bytes
    )
}

/// Check what every rank published at the hello step: the same layout,
/// and no two ranks on one GPU (processes time-slice a GPU, and the
/// interpreter's blocks spin on each other).
pub(super) fn check_hello(me: usize, hello: &[Vec<u8>]) -> Result<(), CudaError> {
    let split = |b: &[u8]| {
        let s = String::from_utf8_lossy(b).into_owned();
        match s.split_once('|') {
            Some((gpu, layout)) => (gpu.to_owned(), layout.to_owned()),
            None => (String::new(), s),
        }
    };
    let (gpu, layout) = split(&hello[me]);
    for (r, h) in hello.iter().enumerate() {
        let (their_gpu, their_layout) = split(h);
        if their_layout != layout {
            return Err(CudaError::Invalid(format!(
                "rank {r} set up {their_layout}, rank {me} {layout}: every rank of a device group \
                 needs the same channels, slots and sizes"
            )));
        }
        if r != me && their_gpu == gpu {
            return Err(CudaError::Invalid(format!(
                "ranks {me} and {r} are both on GPU {gpu}: ranks sharing a GPU must be threads of \
                 one process (`interpreter::group`), since processes take turns on a GPU and the \
                 interpreter's blocks wait on each other"
            )));
        }
    }
    Ok(())
}

/// The PCI bus id of `engine`'s GPU: what tells two processes' GPUs apart
/// whatever each one's `CUDA_VISIBLE_DEVICES`.
fn bus_id(engine: &Engine) -> Result<String, CudaError> {
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: a live device; the buffer's length is passed.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, engine.ctx.cu_device()) }
        .result()?;
    // SAFETY: the driver wrote a NUL-terminated string into `buf`.
    let id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(id.to_string_lossy().into_owned())
}

/// Join rank `rank` of `world`, this process's, on GPU `device`; the other
/// ranks are other processes joining through the same `exchange`. `job`
/// (a launcher's job id) names the board's file so the launcher can
/// remove it after a crash.
pub fn join(
    rank: Rank,
    world: u32,
    device: usize,
    config: &CudaConfig,
    mut exchange: Box<dyn Exchange + Send>,
    job: Option<&str>,
) -> Result<InterpreterCommunicator, CudaError> {
    if rank >= world {
        return Err(CudaError::Invalid(format!("rank {rank} of {world}")));
    }
    let me = rank as usize;
    let ex = exchange.as_mut();
    // Everything this process can find wrong on its own, agreed first.
    let local = (|| {
        let layout = setup::layout(world, config)?;
        let count = probe::available()?;
        if device >= count {
            return Err(CudaError::Invalid(format!(
                "device {device} does not exist; this process sees {count}"
            )));
        }
        let engine = Engine::shared(device)?;
        let blocks = u64::from(layout.max_channels);
        residency::check(device, blocks, engine.blocks_per_sm()?, engine.sms)?;
        let hello = format!("{}|{}", bus_id(&engine)?, describe(&layout));
        Ok((layout, engine, hello))
    })();
    let mine = local.as_ref().map(|l| l.2.clone().into_bytes());
    let hello = agree(ex, "hello", mine.map_err(|e| e.to_string()));
    // This rank's own failure keeps its type; a peer's arrives as text.
    let (layout, engine, _) = local?;
    check_hello(me, &hello?)?;
    let board = share_board(ex, me, &engine, world, job)?;
    let (window, windows, opened) = share_windows(ex, me, &engine, &layout)?;
    let state = setup::state_block(&engine, &layout)?;
    let parts = Parts {
        rank: me,
        layout,
        engine,
        window,
        state,
        windows,
        opened,
        board,
        exchange,
    };
    tracing::debug!(
        rank,
        world,
        device,
        "device interpreter rank joined across processes"
    );
    InterpreterCommunicator::new(rank, Arc::new(Group::across_processes(config, parts)))
}

/// Rank 0 creates the board's file; every rank maps and registers it; once
/// all have, rank 0 removes the name (the mappings stay), so no file
/// outlives the group even if a process is killed later.
fn share_board(
    ex: &mut dyn Exchange,
    me: usize,
    engine: &Engine,
    world: u32,
    job: Option<&str>,
) -> Result<Board, CudaError> {
    let path = super::board::file_for_new_group(job);
    let created = (me == 0).then(|| Board::mapped(&engine.ctx, world as usize, &path, true));
    let named = match &created {
        Some(Err(e)) => Err(e.to_string()),
        _ => Ok(path.to_string_lossy().into_owned().into_bytes()),
    };
    let names = agree(ex, "board", named)?;
    let path = std::path::PathBuf::from(String::from_utf8_lossy(&names[0]).into_owned());
    let board = match created {
        Some(made) => made,
        None => Board::mapped(&engine.ctx, world as usize, &path, false),
    };
    let mapped = agree(
        ex,
        "board-mapped",
        board
            .as_ref()
            .map(|_| Vec::new())
            .map_err(|e| e.to_string()),
    );
    if me == 0 {
        let _ = std::fs::remove_file(&path);
    }
    mapped?;
    board
}

/// Allocate this rank's window, publish its IPC handle, open every peer's.
fn share_windows(
    ex: &mut dyn Exchange,
    me: usize,
    engine: &Engine,
    layout: &Layout,
) -> Result<(DeviceBlock, Vec<u64>, Vec<Opened>), CudaError> {
    let exported = DeviceBlock::zeroed(&engine.ctx, layout.window().bytes).and_then(|w| {
        let _current = Current::bind(&engine.ctx)?;
        let mut handle = sys::CUipcMemHandle_st { reserved: [0; 64] };
        // SAFETY: `w.ptr` is a `cuMemAlloc` allocation of this context;
        // the out-pointer is a live local.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, w.ptr) }.result()?;
        let bytes: Vec<u8> = handle.reserved.iter().map(|&c| c as u8).collect();
        Ok((w, bytes))
    });
    let handles = agree(
        ex,
        "windows",
        exported
            .as_ref()
            .map(|(_, h)| h.clone())
            .map_err(|e| e.to_string()),
    )?;
    let (window, _) = exported?;
    let mut windows = Vec::with_capacity(handles.len());
    let mut opened = Vec::new();
    let opening = (|| {
        let _current = Current::bind(&engine.ctx)?;
        for (r, h) in handles.iter().enumerate() {
            if r == me {
                windows.push(window.ptr);
                continue;
            }
            let mut handle = sys::CUipcMemHandle_st { reserved: [0; 64] };
            if h.len() != 64 {
                return Err(CudaError::Invalid(format!(
                    "rank {r}'s window handle is {} bytes",
                    h.len()
                )));
            }
            for (d, &b) in handle.reserved.iter_mut().zip(h) {
                *d = b as std::ffi::c_char;
            }
            let mut ptr = 0;
            let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
            // SAFETY: a handle another process of the group exported for a
            // live allocation; the out-pointer is a live local.
            unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, flags) }.result()?;
            opened.push(Opened {
                ctx: engine.ctx.clone(),
                ptr,
            });
            windows.push(ptr);
        }
        Ok(())
    })();
    agree(
        ex,
        "windows-opened",
        opening.map(|()| Vec::new()).map_err(|e| e.to_string()),
    )?;
    Ok((window, windows, opened))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank's bytes, by key.
    type Published = std::collections::HashMap<String, Vec<Option<Vec<u8>>>>;

    /// Threads standing in for processes.
    struct Threads {
        rank: usize,
        shared: Arc<std::sync::Mutex<Published>>,
        world: usize,
    }

    impl Exchange for Threads {
        fn all_gather(&mut self, key: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>, String> {
            {
                let mut map = self.shared.lock().unwrap();
                let slot = map
                    .entry(key.to_owned())
                    .or_insert_with(|| vec![None; self.world]);
                slot[self.rank] = Some(mine.to_vec());
            }
            let start = std::time::Instant::now();
            loop {
                let map = self.shared.lock().unwrap();
                let all = &map[key];
                if all.iter().all(Option::is_some) {
                    return Ok(all.iter().map(|b| b.clone().unwrap()).collect());
                }
                drop(map);
                if start.elapsed() > std::time::Duration::from_secs(10) {
                    return Err(format!("{key}: timed out"));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    /// `f` on `world` ranks, each with its exchange.
    fn ranks<T: Send>(world: usize, f: impl Fn(usize, &mut dyn Exchange) -> T + Sync) -> Vec<T> {
        let shared = Arc::default();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..world)
                .map(|rank| {
                    let (f, shared) = (&f, Arc::clone(&shared));
                    s.spawn(move || {
                        f(
                            rank,
                            &mut Threads {
                                rank,
                                shared,
                                world,
                            },
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn a_rank_that_fails_a_step_fails_it_for_every_rank() {
        let out = ranks(3, |rank, ex| {
            let mine = if rank == 2 {
                Err("no GPU here".to_owned())
            } else {
                Ok(vec![rank as u8])
            };
            agree(ex, "step", mine)
        });
        for r in &out {
            let e = r.as_ref().unwrap_err().to_string();
            assert!(e.contains("rank 2") && e.contains("no GPU here"), "{e}");
        }
        let out = ranks(3, |rank, ex| agree(ex, "step", Ok(vec![rank as u8; rank])));
        for r in out {
            assert_eq!(r.unwrap(), vec![vec![], vec![1], vec![2, 2]]);
        }
    }

    #[test]
    fn ranks_must_share_a_layout_and_not_a_gpu() {
        let hello = |gpu: &str, layout: &str| format!("{gpu}|{layout}").into_bytes();
        let fine = [hello("0000:1b:00.0", "L"), hello("0000:43:00.0", "L")];
        assert!(check_hello(0, &fine).is_ok());
        let two_on_one = [hello("0000:1b:00.0", "L"), hello("0000:1b:00.0", "L")];
        let e = check_hello(1, &two_on_one).unwrap_err().to_string();
        assert!(e.contains("both on GPU 0000:1b:00.0"), "{e}");
        let other_layout = [hello("0000:1b:00.0", "L"), hello("0000:43:00.0", "M")];
        let e = check_hello(0, &other_layout).unwrap_err().to_string();
        assert!(e.contains("rank 1 set up M"), "{e}");
    }
}
