//! Opening a group: devices and peer access, channels from what the GPUs
//! hold, the residency check, the layout and the memory every call
//! reuses (windows on the devices, or in host memory where peer access is
//! missing), the planner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, sys};
use ferrocoll_core::comm::{CommError, Executor, Planned, Planner, PlannerSettings, Planning};

use super::board::Board;
use super::engine::Engine;
use super::lasts::Lasts;
use super::mapped::{Exchange, Opened, Parts};
use super::memory::{Current, DeviceBlock, HostBlock};
use super::residency;
use crate::config::CudaConfig;
use crate::error::CudaError;
use crate::probe;
use crate::program::abi::ABORTED;
use crate::program::{DeviceProgram, Layout, MAX_RANKS, Protocol, Scope};

/// Channels a group takes by default at most (what `--channels` accepts):
/// with few ranks on a GPU, every SM it can have is bandwidth — two ranks
/// of one H200 take 64 of its 132 SMs each.
pub const MAX_AUTO_CHANNELS: u32 = 64;

/// Bytes a rank's window may spend on bulk slots: 256 MiB whatever the
/// channels, ranks and slots (32 channels × 8 peers × 4 slots get 256 KiB
/// slots; a plan's messages are cut to fit). Zero-copy messages need no
/// slot at all.
pub const SLOT_BUDGET: u64 = 256 << 20;

/// Bytes a rank's window may spend on LL slots.
pub const LL_BUDGET: u64 = 32 << 20;

/// Where every rank's window lives.
pub(super) enum WindowBlock {
    /// Device memory (peers reach it by P2P/NVLink).
    Device(DeviceBlock),
    /// Pinned host memory every GPU maps (no peer access somewhere).
    Host(HostBlock),
}

impl WindowBlock {
    fn ptr(&self) -> u64 {
        match self {
            WindowBlock::Device(b) => b.ptr,
            WindowBlock::Host(b) => b.ptr,
        }
    }
}

/// What the ranks of a group in this process share; it outlives every
/// launch of theirs.
pub struct Group {
    /// The settings.
    pub config: CudaConfig,
    /// What every rank's window was set up for.
    pub layout: Layout,
    /// How launches order their flags and fences.
    pub scope: Scope,
    /// The device of each rank in this process (`None`: another process's).
    engines: Vec<Option<Arc<Engine>>>,
    /// Every rank's window as this process addresses it (one process:
    /// unified addressing; across processes: opened from the owner's IPC
    /// handle).
    windows: Vec<u64>,
    /// The windows allocated here.
    _owned: Vec<WindowBlock>,
    /// The windows of other processes' ranks, mapped here.
    _opened: Vec<Opened>,
    /// The private state of each rank in this process.
    states: Vec<Option<DeviceBlock>>,
    /// The failure board.
    pub board: Board,
    /// Across processes: where the ranks meet once more before their
    /// windows go (`None`: every rank is a thread of this process).
    closing: Option<Mutex<Box<dyn Exchange + Send>>>,
    planner: Mutex<Planner>,
    programs: Mutex<HashMap<u64, Arc<DeviceProgram>>>,
    /// The in-process ranks' last-launch events.
    pub(super) lasts: Lasts,
}

/// The layout a configuration asks for on `n` ranks with `channels`: a
/// ring of `slots_per_link` slots per (channel, sender) of
/// `max_chunk_bytes` (within [`SLOT_BUDGET`], rounded to 16), as many LL
/// slots carrying up to `ll_max_bytes` (within [`LL_BUDGET`], no more
/// than a slot); zero copy where ranks address each other's buffers.
pub fn layout(
    n: u32,
    channels: u32,
    config: &CudaConfig,
    zero_copy: bool,
) -> Result<Layout, CudaError> {
    if n == 0 || n > MAX_RANKS {
        return Err(CudaError::Invalid(format!(
            "the device interpreter runs 1..={MAX_RANKS} ranks, not {n}"
        )));
    }
    let too_large = || {
        CudaError::Invalid(format!(
            "max_chunk_bytes {} or ll_max_bytes {} is past what a device window can hold",
            config.max_chunk_bytes(),
            config.ll_max_bytes
        ))
    };
    let slots = ferrocoll_core::comm::link_slots(
        config.planning.slots_per_link,
        config.planning.schedule.as_deref(),
    );
    let links = u64::from(channels.max(1)) * u64::from(n) * u64::from(slots.max(1));
    let within = |budget: u64| (budget / links.max(1)) / 16 * 16;
    let slot_bytes = (config.max_chunk_bytes().max(16) as u64)
        .checked_next_multiple_of(16)
        .ok_or_else(too_large)?
        .min(within(SLOT_BUDGET).max(16));
    let ll_message = (config.ll_max_bytes as u64)
        .min(slot_bytes)
        .min(within(LL_BUDGET) / 2)
        / 8
        * 8;
    let layout = Layout {
        world_size: n,
        max_channels: channels.max(1),
        slots,
        slot_bytes,
        ll_slot_bytes: ll_message * 2,
        zero_copy,
    };
    layout
        .check()
        .map_err(|e| CudaError::Invalid(e.to_string()))?;
    Ok(layout)
}

/// Channels by default: every rank an equal share of the blocks its GPU
/// holds at once, at most [`MAX_AUTO_CHANNELS`]; `ranks_on[d]` and
/// `capacity[d]` are per device of the group.
pub fn auto_channels(ranks_on: &[u64], capacity: &[u64]) -> u32 {
    ranks_on
        .iter()
        .zip(capacity)
        .map(|(&ranks, &cap)| cap / ranks.max(1))
        .min()
        .unwrap_or(1)
        .clamp(1, u64::from(MAX_AUTO_CHANNELS)) as u32
}

/// How a call's messages travel: as the topology selector says when it
/// had a view (`planned.protocol`, from simulating both), else LL for
/// calls of up to `ll_max_bytes`; LL only where every message fits an LL
/// slot.
pub fn protocol(planned: &Planned, layout: &Layout, config: &CudaConfig) -> Protocol {
    let plan = &planned.plan;
    let fits = layout.ll_slot_bytes > 0
        && plan
            .links
            .iter()
            .all(|l| l.largest <= layout.ll_message_bytes());
    let wanted = match planned.protocol {
        Some(chosen) => chosen == Protocol::LowLatency,
        None => plan.size_bytes() <= config.ll_max_bytes as u64,
    };
    if fits && wanted {
        Protocol::LowLatency
    } else {
        Protocol::Simple
    }
}

/// How the group plans: messages cut to fit a slot (an LL slot where the
/// selector chose LL), selections no wider than the windows' channels,
/// and the rule for zero-copy windows or staged ones.
pub fn planner_settings(config: &CudaConfig, layout: &Layout) -> PlannerSettings {
    let planning = Planning {
        channels: Some(layout.max_channels),
        slots_per_link: layout.slots,
        ..config.planning.clone()
    };
    planning.settings(Executor {
        rule: if layout.zero_copy {
            crate::config::device_rule
        } else {
            crate::config::staged_rule
        },
        channels: layout.max_channels,
        max_chunk_bytes: config.max_chunk_bytes(),
        max_message_bytes: Some(layout.slot_bytes as usize),
        max_ll_message_bytes: (layout.ll_slot_bytes > 0)
            .then(|| layout.ll_message_bytes() as usize),
        max_channels: Some(layout.max_channels),
        one_shot_bytes: 0,
    })
}

/// Lowered programs a group keeps: as many as four ranks keep loaded on
/// their devices (`loaded.rs`), so a group's working set of calls is
/// lowered once.
const LOWERED_KEEP: usize = 256;

impl Group {
    /// Open `devices` (one entry per rank; a device may repeat) for
    /// `config`, or say why not.
    pub fn open(devices: &[usize], config: &CudaConfig) -> Result<Group, CudaError> {
        let n = devices.len() as u32;
        if n == 0 || n > MAX_RANKS {
            return Err(CudaError::Invalid(format!(
                "the device interpreter runs 1..={MAX_RANKS} ranks, not {n}"
            )));
        }
        let count = probe::available()?;
        if let Some(&bad) = devices.iter().find(|&&d| d >= count) {
            return Err(CudaError::Invalid(format!(
                "device {bad} does not exist; this machine has {count}"
            )));
        }
        let mut opened: HashMap<usize, Arc<Engine>> = HashMap::new();
        for &d in devices {
            if let std::collections::hash_map::Entry::Vacant(e) = opened.entry(d) {
                e.insert(Engine::shared(d, config.kernel_cache.as_deref())?);
            }
        }
        let p2p = config.p2p && connect(&opened)?;
        let mut ordinals: Vec<usize> = opened.keys().copied().collect();
        ordinals.sort_unstable();
        let ranks_on: Vec<u64> = ordinals
            .iter()
            .map(|d| devices.iter().filter(|&x| x == d).count() as u64)
            .collect();
        let capacity: Vec<u64> = ordinals
            .iter()
            .map(|d| {
                let e = &opened[d];
                u64::from(e.blocks_per_sm()) * u64::from(e.sms)
            })
            .collect();
        let channels = config
            .planning
            .channels
            .unwrap_or_else(|| auto_channels(&ranks_on, &capacity));
        for (i, &d) in ordinals.iter().enumerate() {
            let blocks = ranks_on[i] * u64::from(channels);
            residency::check(d, blocks, capacity[i])?;
        }
        // Zero copy reads and writes the callers' buffers across ranks. On
        // one GPU every buffer is reachable; across GPUs peer access covers
        // cuMemAlloc memory but not stream-ordered pool memory (cudarc's and
        // ours), which needs cuMemPoolSetAccess on pools we do not own, so
        // ranks on different GPUs move data through the windows.
        let zero_copy = p2p && ordinals.len() == 1;
        let layout = layout(n, channels, config, zero_copy)?;
        let engines: Vec<Arc<Engine>> = devices.iter().map(|d| opened[d].clone()).collect();
        let window = layout.window().bytes;
        let owned = engines
            .iter()
            .map(|e| {
                Ok(if p2p {
                    WindowBlock::Device(DeviceBlock::zeroed(&e.ctx, window)?)
                } else {
                    WindowBlock::Host(HostBlock::zeroed(&e.ctx, window)?)
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        let states = engines
            .iter()
            .map(|e| state_block(e, &layout).map(Some))
            .collect::<Result<Vec<_>, _>>()?;
        let board = Board::new(&engines[0].ctx, devices.len())?;
        let scope = if p2p && ordinals.len() == 1 {
            Scope::Gpu
        } else {
            Scope::System
        };
        tracing::debug!(?devices, ?layout, ?scope, window, "device group opened");
        Ok(Group {
            planner: Mutex::new(Planner::new(n, planner_settings(config, &layout))),
            config: config.clone(),
            layout,
            scope,
            windows: owned.iter().map(WindowBlock::ptr).collect(),
            engines: engines.into_iter().map(Some).collect(),
            _owned: owned,
            _opened: Vec::new(),
            states,
            board,
            closing: None,
            programs: Mutex::new(HashMap::new()),
            lasts: Lasts::new(n as usize),
        })
    }

    /// One rank of a group whose other ranks are other processes: `parts`
    /// is what the join (`ipc.rs`) set up.
    pub(super) fn across_processes(config: &CudaConfig, parts: Parts) -> Group {
        let Parts {
            rank,
            layout,
            engine,
            window,
            state,
            windows,
            opened,
            board,
            exchange,
        } = parts;
        let n = layout.world_size as usize;
        let mut engines = vec![None; n];
        engines[rank] = Some(engine);
        let mut states: Vec<Option<DeviceBlock>> = (0..n).map(|_| None).collect();
        states[rank] = Some(state);
        Group {
            planner: Mutex::new(Planner::new(n as u32, planner_settings(config, &layout))),
            config: config.clone(),
            layout,
            scope: Scope::System,
            engines,
            windows,
            _owned: vec![WindowBlock::Device(window)],
            _opened: opened,
            states,
            board,
            closing: Some(Mutex::new(exchange)),
            programs: Mutex::new(HashMap::new()),
            lasts: Lasts::new(n),
        }
    }

    /// The device of `rank`, a rank of this process.
    pub fn engine(&self, rank: usize) -> &Arc<Engine> {
        self.engines[rank]
            .as_ref()
            .expect("communicators exist only for ranks of this process")
    }

    /// The address of `rank`'s private state (a rank of this process).
    pub fn state(&self, rank: usize) -> u64 {
        self.states[rank]
            .as_ref()
            .expect("communicators exist only for ranks of this process")
            .ptr
    }

    /// The plan of a call.
    pub fn plan(&self, shape: &ferrocoll_core::types::CallShape) -> Result<Planned, CommError> {
        self.planner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .plan(shape)
    }

    /// The plan lowered for the group's layout, once per plan.
    pub fn program(&self, planned: &Planned) -> Result<Arc<DeviceProgram>, CommError> {
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = programs.get(&planned.signature) {
            return Ok(p.clone());
        }
        let protocol = protocol(planned, &self.layout, &self.config);
        let p = DeviceProgram::lower(&planned.plan, self.layout, protocol).map_err(|e| {
            CommError::Capacity {
                what: e.to_string(),
            }
        })?;
        let p = Arc::new(p);
        // Ranks hold the programs they use; the group's map only saves
        // lowering a plan once per rank.
        if programs.len() >= LOWERED_KEEP {
            programs.clear();
        }
        programs.insert(planned.signature, p.clone());
        Ok(p)
    }

    /// Every rank's window address.
    pub fn window_addresses(&self) -> &[u64] {
        &self.windows
    }

    /// Whether another rank of this process runs on `rank`'s device.
    pub fn shares_device(&self, rank: usize) -> bool {
        let d = self.engine(rank).ordinal;
        self.engines
            .iter()
            .flatten()
            .filter(|e| e.ordinal == d)
            .count()
            > 1
    }
}

/// A rank's zeroed private state.
pub(super) fn state_block(engine: &Engine, layout: &Layout) -> Result<DeviceBlock, CudaError> {
    DeviceBlock::zeroed(&engine.ctx, 8 * layout.state().words as u64)
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.closing.is_none() {
            // Every rank is here: stop whatever still runs (a failed
            // rank's peers may be spinning until their timeout).
            for r in 0..self.engines.len() {
                self.board.fail(r, ABORTED);
            }
        }
        // Wait for this process's devices, so no launch of ours still
        // reads a window when it goes.
        let mut seen = Vec::new();
        for e in self.engines.iter().flatten() {
            if seen.contains(&e.ordinal) {
                continue;
            }
            seen.push(e.ordinal);
            if let Ok(_current) = Current::bind(&e.ctx)
                && let Err(err) = e.ctx.synchronize()
            {
                tracing::warn!("device {} at group close: {err}", e.ordinal);
            }
        }
        if let Some(exchange) = &self.closing {
            // Other processes' ranks may still be finishing their last
            // call, reading this window: meet them once more (bounded by
            // the exchange's timeout) rather than stop them.
            let mut exchange = exchange.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = exchange.all_gather("ferrocoll-interpreter/closing", &[]) {
                tracing::warn!("closing the device group: {e}");
            }
        }
    }
}

/// Peer access between every pair of the group's devices; `false` when
/// some pair has none (the windows then go to host memory every GPU
/// maps, and messages are staged there).
fn connect(opened: &HashMap<usize, Arc<Engine>>) -> Result<bool, CudaError> {
    let mut ordinals: Vec<usize> = opened.keys().copied().collect();
    ordinals.sort_unstable();
    for (i, &a) in ordinals.iter().enumerate() {
        for &b in &ordinals[i + 1..] {
            if !enable_peer(&opened[&a].ctx, &opened[&b].ctx)? {
                tracing::debug!("devices {a} and {b} have no peer access: windows in host memory");
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Enable peer access both ways between two devices; `false` if the
/// hardware refuses it.
pub(crate) fn enable_peer(a: &Arc<CudaContext>, b: &Arc<CudaContext>) -> Result<bool, CudaError> {
    let mut can = 0;
    // SAFETY: both devices come from opened contexts; the out-pointer is a
    // live local.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.cu_device(), b.cu_device()).result()? };
    if can == 0 {
        return Ok(false);
    }
    for (from, to) in [(a, b), (b, a)] {
        // The caller's thread keeps the context it had.
        let _current = Current::bind(from)?;
        // SAFETY: `to`'s context is alive; enabling twice only reports
        // "already enabled", which is not an error here.
        let r = unsafe { sys::cuCtxEnablePeerAccess(to.cu_ctx(), 0) };
        if r != sys::CUresult::CUDA_SUCCESS
            && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        {
            tracing::debug!(
                "peer access {} -> {} refused: {r:?}",
                from.ordinal(),
                to.ordinal()
            );
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_by_default_share_what_each_gpu_holds() {
        // One H200 (132 SMs, a block each): 8 ranks get 16, 2 get 66,
        // capped at 64.
        assert_eq!(auto_channels(&[8], &[132]), 16);
        assert_eq!(auto_channels(&[2], &[132]), 64);
        // The most crowded GPU decides.
        assert_eq!(auto_channels(&[1, 4], &[132, 100]), 25);
        assert_eq!(auto_channels(&[64], &[10]), 1);
    }

    #[test]
    fn windows_stay_within_their_budget() {
        let config = CudaConfig::default();
        let l = layout(8, 32, &config, true).unwrap();
        assert!(l.inbox_bytes() <= SLOT_BUDGET, "{l:?}");
        assert!(l.ll_inbox_bytes() <= LL_BUDGET, "{l:?}");
        assert_eq!(l.slot_bytes % 16, 0);
        assert!(l.ll_message_bytes() > 0);
        // Few channels: the configured chunk.
        let l = layout(2, 1, &config, false).unwrap();
        assert_eq!(l.slot_bytes, config.max_chunk_bytes() as u64);
        assert!(!l.zero_copy);
        assert!(layout(0, 1, &config, true).is_err());
        assert!(layout(65, 1, &config, true).is_err());
    }
}
