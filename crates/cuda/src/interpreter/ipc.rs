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

use cudarc::driver::sys;
use ferrocoll_core::Rank;

use super::board::Board;
use super::communicator::{CudaCommunicator, Own};
use super::engine::Engine;
pub use super::mapped::Exchange;
use super::mapped::{Opened, Parts};
use super::memory::{Current, DeviceBlock};
use super::residency;
use super::setup::{self, Group};
use crate::config::CudaConfig;
use crate::error::CudaError;
use crate::probe;
use crate::program::Layout;

const KEY: &str = "ferrocoll-interpreter";

/// Publish this rank's outcome of a step; every rank's payload if all
/// succeeded, else the first failure (the same error on every rank).
fn agree(
    exchange: &mut dyn Exchange,
    world: usize,
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
    if all.len() != world {
        return Err(CudaError::Invalid(format!(
            "joining the device group ({step}): the exchange returned {} ranks' bytes for {world}",
            all.len()
        )));
    }
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

/// The format of what ranks read in each other's memory (windows, the
/// board): raised whenever it changes, so binaries of two formats refuse
/// to join rather than misread each other. 2: 64-bit board words that
/// carry the failed call's number. 3: windows publish each call's
/// buffers and carry an alarm; records carry transfers.
const FORMAT: u32 = 3;

/// What ranks must have in common, as bytes: the format and the layout.
fn describe(layout: &Layout) -> String {
    format!(
        "format {FORMAT}, {} ranks, {} channels, {} slots of {} B, LL slots of {} B",
        layout.world_size,
        layout.max_channels,
        layout.slots,
        layout.slot_bytes,
        layout.ll_slot_bytes
    )
}

/// What a rank says of itself at the hello step: its host, process and
/// GPU (PCI bus id), and its layout — `host|pid|gpu|layout`.
fn hello_of(gpu: &str, layout: &Layout) -> String {
    format!(
        "{}|{}|{gpu}|{}",
        ferrocoll_core::host::name(),
        std::process::id(),
        describe(layout)
    )
}

/// Check what every rank published at the hello step — every pair, so
/// every rank reaches the same verdict: the same layout; no two ranks in
/// one process (those are threads of one group: `ferrocoll_cuda::group`);
/// no two processes on one GPU (processes take turns on a GPU, and the
/// interpreter's blocks spin on each other).
pub(super) fn check_hello(hello: &[Vec<u8>]) -> Result<(), CudaError> {
    let parts: Vec<Vec<String>> = hello
        .iter()
        .map(|b| {
            String::from_utf8_lossy(b)
                .splitn(4, '|')
                .map(str::to_owned)
                .collect()
        })
        .collect();
    let field = |r: usize, i: usize| parts[r].get(i).map_or("", String::as_str);
    for a in 0..parts.len() {
        for b in a + 1..parts.len() {
            if field(a, 3) != field(b, 3) {
                return Err(CudaError::Invalid(format!(
                    "rank {a} set up {}, rank {b} {}: every rank of a device group needs the same \
                     format, channels, slots and sizes",
                    field(a, 3),
                    field(b, 3)
                )));
            }
            if field(a, 0) != field(b, 0) {
                continue;
            }
            if field(a, 1) == field(b, 1) {
                return Err(CudaError::Invalid(format!(
                    "ranks {a} and {b} are in one process: ranks of one process are threads of \
                     one group (`ferrocoll_cuda::group`)"
                )));
            }
            if field(a, 2) == field(b, 2) {
                return Err(CudaError::Invalid(format!(
                    "ranks {a} and {b} are both on GPU {}: ranks sharing a GPU must be threads of \
                     one process (`ferrocoll_cuda::group`), since processes take turns on a GPU and \
                     the interpreter's blocks wait on each other",
                    field(a, 2)
                )));
            }
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
) -> Result<CudaCommunicator, CudaError> {
    if rank >= world {
        return Err(CudaError::Invalid(format!("rank {rank} of {world}")));
    }
    let me = rank as usize;
    let n = world as usize;
    let ex = exchange.as_mut();
    // Everything this process can find wrong on its own, agreed first.
    let local = (|| {
        let count = probe::available()?;
        if device >= count {
            return Err(CudaError::Invalid(format!(
                "device {device} does not exist; this process sees {count}"
            )));
        }
        let engine = Engine::shared(device, config.kernel_cache.as_deref())?;
        let capacity = u64::from(engine.blocks_per_sm()) * u64::from(engine.sms);
        let channels = config
            .planning
            .channels
            .unwrap_or_else(|| setup::auto_channels(&[1], &[capacity]));
        // Each process sees only its own memory: every message is staged.
        let layout = setup::layout(world, channels, config, false)?;
        residency::check(device, u64::from(layout.max_channels), capacity)?;
        let state = setup::state_block(&engine, &layout)?;
        let own = Own::new(&engine.ctx)?;
        let hello = hello_of(&bus_id(&engine)?, &layout);
        Ok((layout, engine, state, own, hello))
    })();
    let mine = local.as_ref().map(|l| l.4.clone().into_bytes());
    let hello = agree(ex, n, "hello", mine.map_err(|e| e.to_string()));
    // This rank's own failure keeps its type; a peer's arrives as text.
    let (layout, engine, state, own, _) = local?;
    check_hello(&hello?)?;
    let board = share_board(ex, n, me, &engine, job)?;
    let (window, windows, opened) = share_windows(ex, n, me, &engine, &layout)?;
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
    // Nothing below can fail: every rank that got here, all did.
    let group = Arc::new(Group::across_processes(config, parts));
    Ok(CudaCommunicator::with(rank, group, own))
}

/// Rank 0 creates the board's file; every rank maps and registers it; once
/// all have, rank 0 removes the name (the mappings stay), so no file
/// outlives the group even if a process is killed later.
fn share_board(
    ex: &mut dyn Exchange,
    world: usize,
    me: usize,
    engine: &Engine,
    job: Option<&str>,
) -> Result<Board, CudaError> {
    let path = super::board::file_for_new_group(job);
    // Rank 0 removes the name however this ends: once every rank mapped
    // it, or on any failure.
    let _unlink = (me == 0).then(|| Unlink(path.clone()));
    let created = (me == 0).then(|| Board::mapped(&engine.ctx, world, &path, true));
    let named = match &created {
        Some(Err(e)) => Err(e.to_string()),
        _ => Ok(path.to_string_lossy().into_owned().into_bytes()),
    };
    let names = agree(ex, world, "board", named)?;
    let path = std::path::PathBuf::from(String::from_utf8_lossy(&names[0]).into_owned());
    let board = match created {
        Some(made) => made,
        None => Board::mapped(&engine.ctx, world, &path, false),
    };
    let mapped = board
        .as_ref()
        .map(|_| Vec::new())
        .map_err(|e| e.to_string());
    agree(ex, world, "board-mapped", mapped)?;
    board
}

/// Removes a file when dropped.
struct Unlink(std::path::PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Allocate this rank's window, publish its IPC handle, open every peer's.
fn share_windows(
    ex: &mut dyn Exchange,
    world: usize,
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
        world,
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
    let opened_all = opening.map(|()| Vec::new()).map_err(|e| e.to_string());
    agree(ex, world, "windows-opened", opened_all)?;
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
            agree(ex, 3, "step", mine)
        });
        for r in &out {
            let e = r.as_ref().unwrap_err().to_string();
            assert!(e.contains("rank 2") && e.contains("no GPU here"), "{e}");
        }
        let out = ranks(3, |rank, ex| {
            agree(ex, 3, "step", Ok(vec![rank as u8; rank]))
        });
        for r in out {
            assert_eq!(r.unwrap(), vec![vec![], vec![1], vec![2, 2]]);
        }
    }

    #[test]
    fn every_rank_reaches_the_same_verdict_on_the_hello() {
        let hello = |host: &str, pid: u32, gpu: &str, layout: &str| {
            format!("{host}|{pid}|{gpu}|{layout}").into_bytes()
        };
        let fine = [
            hello("a", 1, "0000:1b:00.0", "L"),
            hello("a", 2, "0000:43:00.0", "L"),
            // Another host may have a GPU at the same bus id.
            hello("b", 1, "0000:1b:00.0", "L"),
        ];
        assert!(check_hello(&fine).is_ok());
        // Ranks 1 and 2 share a GPU: every rank's check says so, rank 0's
        // included (it is not one of them).
        let shared = [
            hello("a", 1, "0000:1b:00.0", "L"),
            hello("a", 2, "0000:43:00.0", "L"),
            hello("a", 3, "0000:43:00.0", "L"),
        ];
        let e = check_hello(&shared).unwrap_err().to_string();
        assert!(
            e.contains("ranks 1 and 2 are both on GPU 0000:43:00.0"),
            "{e}"
        );
        let one_process = [hello("a", 7, "x", "L"), hello("a", 7, "y", "L")];
        let e = check_hello(&one_process).unwrap_err().to_string();
        assert!(e.contains("in one process"), "{e}");
        let other_layout = [hello("a", 1, "x", "L"), hello("a", 2, "y", "M")];
        let e = check_hello(&other_layout).unwrap_err().to_string();
        assert!(e.contains("rank 0 set up L, rank 1 M"), "{e}");
        assert!(check_hello(&[b"garbage".to_vec(), hello("a", 1, "x", "L")]).is_err());
        // A binary of another window or board format: same layout, still
        // refused, with the format named.
        let layout = Layout {
            world_size: 2,
            max_channels: 2,
            slots: 2,
            slot_bytes: 64,
            ll_slot_bytes: 32,
            zero_copy: false,
        };
        let ours = describe(&layout);
        let older = ours.replace(&format!("format {FORMAT},"), "format 1,");
        assert_ne!(ours, older);
        let mixed = [hello("a", 1, "x", &ours), hello("a", 2, "y", &older)];
        let e = check_hello(&mixed).unwrap_err().to_string();
        assert!(e.contains("format 1") && e.contains("same format"), "{e}");
    }

    #[test]
    fn an_exchange_that_returns_the_wrong_number_of_ranks_is_an_error() {
        struct Short;
        impl Exchange for Short {
            fn all_gather(&mut self, _: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>, String> {
                Ok(vec![mine.to_vec()])
            }
        }
        let e = agree(&mut Short, 2, "step", Ok(vec![]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("1 ranks' bytes for 2"), "{e}");
    }
}
