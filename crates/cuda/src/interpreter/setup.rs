//! Opening a group: devices and peer access, the residency check, the
//! layout and the memory every call reuses, the planner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ferrocoll_core::comm::CommError;
use ferrocoll_core::plan::{Planned, Planner, PlannerSettings};
use ferrocoll_core::select::Protocol as SelectedProtocol;

use super::board::Board;
use super::engine::Engine;
use super::ipc;
use super::memory::{Current, DeviceBlock};
use super::residency;
use crate::config::CudaConfig;
use crate::error::CudaError;
use crate::group::enable_peer;
use crate::probe;
use crate::program::params::ABORTED;
use crate::program::{DeviceProgram, Layout, MAX_RANKS, Protocol};

/// What the ranks of a group in this process share; it outlives every
/// launch of theirs.
pub struct Group {
    /// The settings.
    pub config: CudaConfig,
    /// What every rank's window was set up for.
    pub layout: Layout,
    /// The device of each rank in this process (`None`: another process's).
    engines: Vec<Option<Arc<Engine>>>,
    /// Every rank's window as this process addresses it (one process:
    /// unified addressing with peer access on; across processes: opened
    /// from the owner's IPC handle).
    windows: Vec<u64>,
    /// The windows allocated here.
    _owned: Vec<DeviceBlock>,
    /// The windows of other processes' ranks, mapped here.
    _opened: Vec<ipc::Opened>,
    /// The private state of each rank in this process.
    states: Vec<Option<DeviceBlock>>,
    /// The failure board.
    pub board: Board,
    /// Across processes: where the ranks meet once more before their
    /// windows go (`None`: every rank is a thread of this process).
    closing: Option<Mutex<Box<dyn ipc::Exchange + Send>>>,
    planner: Mutex<Planner>,
    programs: Mutex<HashMap<u64, Arc<DeviceProgram>>>,
}

/// The layout a configuration asks for on `n` ranks: a ring of
/// `slots_per_link` slots of `max_chunk_bytes` (rounded up to 16) per
/// (channel, sender), and as many LL slots carrying up to `ll_max_bytes`
/// (no more than a slot) each.
pub fn layout(n: u32, config: &CudaConfig) -> Result<Layout, CudaError> {
    if n == 0 || n > MAX_RANKS {
        return Err(CudaError::Invalid(format!(
            "the device interpreter runs 1..={MAX_RANKS} ranks, not {n}"
        )));
    }
    let too_large = || {
        CudaError::Invalid(format!(
            "max_chunk_bytes {} or ll_max_bytes {} is past what a device window can hold",
            config.max_chunk_bytes, config.ll_max_bytes
        ))
    };
    let slot_bytes = (config.max_chunk_bytes.max(16) as u64)
        .checked_next_multiple_of(16)
        .ok_or_else(too_large)?;
    let ll_message = (config.ll_max_bytes as u64)
        .min(slot_bytes)
        .checked_next_multiple_of(8)
        .ok_or_else(too_large)?;
    let layout = Layout {
        world_size: n,
        max_channels: config.channels.max(1),
        slots: config.slots_per_link.max(2),
        slot_bytes,
        ll_slot_bytes: ll_message.checked_mul(2).ok_or_else(too_large)?,
    };
    layout
        .check()
        .map_err(|e| CudaError::Invalid(e.to_string()))?;
    Ok(layout)
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
        Some(SelectedProtocol::LowLatency) => true,
        Some(SelectedProtocol::Simple) => false,
        None => plan.size_bytes() <= config.ll_max_bytes as u64,
    };
    if fits && wanted {
        Protocol::Ll
    } else {
        Protocol::Simple
    }
}

/// How the group plans: messages cut to fit a slot (an LL slot where the
/// selector chose LL), selections no wider than the windows' channels.
pub fn planner_settings(config: &CudaConfig, layout: &Layout) -> PlannerSettings {
    PlannerSettings {
        max_message_bytes: Some(layout.slot_bytes as usize),
        max_ll_message_bytes: (layout.ll_slot_bytes > 0)
            .then(|| layout.ll_message_bytes() as usize),
        max_channels: Some(layout.max_channels),
        ..config.planner_settings()
    }
}

impl Group {
    /// Open `devices` (one entry per rank; a device may repeat) for
    /// `config`, or say why not.
    pub fn open(devices: &[usize], config: &CudaConfig) -> Result<Group, CudaError> {
        let layout = layout(devices.len() as u32, config)?;
        let count = probe::available()?;
        if let Some(&bad) = devices.iter().find(|&&d| d >= count) {
            return Err(CudaError::Invalid(format!(
                "device {bad} does not exist; this machine has {count}"
            )));
        }
        let mut opened: HashMap<usize, Arc<Engine>> = HashMap::new();
        for &d in devices {
            if let std::collections::hash_map::Entry::Vacant(e) = opened.entry(d) {
                e.insert(Engine::shared(d)?);
            }
        }
        connect(&opened)?;
        for (&d, engine) in &opened {
            let ranks = devices.iter().filter(|&&x| x == d).count() as u64;
            let blocks = ranks * u64::from(layout.max_channels);
            residency::check(d, blocks, engine.blocks_per_sm()?, engine.sms)?;
        }
        let engines: Vec<Arc<Engine>> = devices.iter().map(|d| opened[d].clone()).collect();
        let window = layout.window().bytes;
        let owned = engines
            .iter()
            .map(|e| DeviceBlock::zeroed(&e.ctx, window))
            .collect::<Result<Vec<_>, _>>()?;
        let states = engines
            .iter()
            .map(|e| state_block(e, &layout).map(Some))
            .collect::<Result<Vec<_>, _>>()?;
        let board = Board::new(&engines[0].ctx, devices.len())?;
        tracing::debug!(?devices, ?layout, window, "device interpreter group opened");
        Ok(Group {
            planner: Mutex::new(Planner::new(
                devices.len() as u32,
                planner_settings(config, &layout),
            )),
            config: config.clone(),
            layout,
            windows: owned.iter().map(|w| w.ptr).collect(),
            engines: engines.into_iter().map(Some).collect(),
            _owned: owned,
            _opened: Vec::new(),
            states,
            board,
            closing: None,
            programs: Mutex::new(HashMap::new()),
        })
    }

    /// One rank of a group whose other ranks are other processes: `parts`
    /// is what `ipc::join` set up.
    pub(super) fn across_processes(config: &CudaConfig, parts: ipc::Parts) -> Group {
        let ipc::Parts {
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
            engines,
            windows,
            _owned: vec![window],
            _opened: opened,
            states,
            board,
            closing: Some(Mutex::new(exchange)),
            programs: Mutex::new(HashMap::new()),
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
    pub fn plan(&self, shape: &ferrocoll_core::plan::CallShape) -> Result<Planned, CommError> {
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
        // lowering a plan once per rank: bounded like a rank's.
        if programs.len() >= 4 * super::loaded::KEEP {
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

/// Peer access between every pair of the group's devices: the interpreter
/// stores straight into peers' memory, so a pair without it is refused
/// (executor v1's host relay covers such machines).
fn connect(opened: &HashMap<usize, Arc<Engine>>) -> Result<(), CudaError> {
    let mut ordinals: Vec<usize> = opened.keys().copied().collect();
    ordinals.sort_unstable();
    for (i, &a) in ordinals.iter().enumerate() {
        for &b in &ordinals[i + 1..] {
            if !enable_peer(&opened[&a].ctx, &opened[&b].ctx)? {
                return Err(CudaError::Invalid(format!(
                    "devices {a} and {b} have no peer access; the device interpreter needs it \
                     between every pair (backend `cuda` relays through the host)"
                )));
            }
        }
    }
    Ok(())
}
