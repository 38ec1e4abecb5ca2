//! A group of ranks on CUDA devices: devices opened once, peer access
//! enabled once per pair, streams per (rank, channel), the planner, and the
//! board where the ranks of a call meet.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, sys};
use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;
use ferrocoll_core::plan::{CallShape, Planned, Planner};

use crate::config::CudaConfig;
use crate::device::Device;
use crate::enqueue::{RankBuffers, Resources};
use crate::error::CudaError;
use crate::probe;

/// What the ranks of one call share.
pub(crate) struct CallState {
    pub signature: String,
    pub first: Rank,
    pub buffers: Vec<Option<RankBuffers>>,
    pub arrived: u32,
    pub observed: u32,
    pub outcome: Option<Result<Arc<Outcome>, CudaError>>,
}

/// The enqueued work of a call.
pub(crate) struct Outcome {
    pub completion: Vec<usize>,
    pub resources: Mutex<Resources>,
}

/// A point-to-point message waiting for its receiver.
pub(crate) struct Parcel {
    pub ptr: u64,
    pub bytes: usize,
    pub ordinal: usize,
    pub taken: Arc<AtomicBool>,
}

#[derive(Default)]
pub(crate) struct Board {
    pub calls: HashMap<u64, CallState>,
    pub failed: Option<(Rank, String)>,
    pub barrier: (u64, u32),
    pub parcels: HashMap<(Rank, Rank), VecDeque<Parcel>>,
}

/// State shared by the ranks of a group.
pub(crate) struct Shared {
    pub n: u32,
    pub config: CudaConfig,
    pub rank_devices: Vec<Arc<Device>>,
    pub p2p: Vec<Vec<bool>>,
    pub streams: Mutex<Vec<Vec<Arc<CudaStream>>>>,
    /// The group's one planner, shared by its ranks.
    pub planner: Mutex<Planner>,
    pub board: Mutex<Board>,
    pub changed: Condvar,
}

impl Shared {
    /// Open the devices of `devices` (one entry per rank) and enable peer
    /// access between every pair that supports it.
    pub fn new(devices: &[usize], config: CudaConfig) -> Result<Shared, CudaError> {
        if devices.is_empty() {
            return Err(CudaError::Invalid("a group needs at least one rank".into()));
        }
        let count = probe::available()?;
        if let Some(&bad) = devices.iter().find(|&&d| d >= count) {
            return Err(CudaError::Invalid(format!(
                "device {bad} does not exist; this machine has {count}"
            )));
        }
        let mut opened: HashMap<usize, Arc<Device>> = HashMap::new();
        for &d in devices {
            if let std::collections::hash_map::Entry::Vacant(e) = opened.entry(d) {
                e.insert(Arc::new(Device::open(d)?));
            }
        }
        let mut ordinals: Vec<usize> = opened.keys().copied().collect();
        ordinals.sort_unstable();
        let mut access: HashMap<(usize, usize), bool> = HashMap::new();
        for &a in &ordinals {
            for &b in &ordinals {
                let ok = a == b || (config.p2p && enable_peer(&opened[&a].ctx, &opened[&b].ctx)?);
                access.insert((a, b), ok);
            }
        }
        let rank_devices: Vec<Arc<Device>> = devices.iter().map(|d| opened[d].clone()).collect();
        // Without peer access every message between two ranks takes the
        // host relay, even between ranks sharing a device: the relay can
        // then be tested on a single GPU.
        let p2p = (0..devices.len())
            .map(|a| {
                (0..devices.len())
                    .map(|b| a == b || (config.p2p && access[&(devices[a], devices[b])]))
                    .collect()
            })
            .collect();
        tracing::debug!(?devices, ?access, "CUDA group opened");
        let planner = Mutex::new(Planner::new(
            devices.len() as u32,
            config.planner_settings(),
        ));
        Ok(Shared {
            n: devices.len() as u32,
            config,
            rank_devices,
            p2p,
            streams: Mutex::new(vec![Vec::new(); devices.len()]),
            planner,
            board: Mutex::new(Board::default()),
            changed: Condvar::new(),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Raw streams of every rank, at least `channels` each.
    pub fn streams(&self, channels: &[usize]) -> Result<Vec<Vec<sys::CUstream>>, CudaError> {
        let mut all = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        for (r, &want) in channels.iter().enumerate() {
            while all[r].len() < want.max(1) {
                let s = self.rank_devices[r].ctx.new_stream()?;
                all[r].push(s);
            }
        }
        Ok(all
            .iter()
            .map(|v| v.iter().map(|s| s.cu_stream()).collect())
            .collect())
    }

    /// The plan of a call, compiled once for every rank.
    pub fn plan(&self, shape: &CallShape) -> Result<Planned, CommError> {
        self.planner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .plan(shape)
    }

    /// Mark the group failed because of `rank`, and wake every waiter.
    pub fn fail(&self, rank: Rank, why: &str) {
        let mut b = self.lock();
        if b.failed.is_none() {
            b.failed = Some((rank, why.to_owned()));
        }
        drop(b);
        self.changed.notify_all();
    }

    /// Wait until `done` holds (checked under the board lock), the group
    /// fails, or the timeout passes.
    pub fn wait_until<T>(
        &self,
        rank: Rank,
        what: &str,
        mut done: impl FnMut(&mut Board) -> Option<T>,
    ) -> Result<T, CommError> {
        let deadline = Instant::now() + self.config.timeout;
        let mut board = self.lock();
        loop {
            // What is done is done even in a failed group: a call whose
            // work is enqueued must still be waited for, or its caller
            // could free buffers the device is writing.
            if let Some(v) = done(&mut board) {
                return Ok(v);
            }
            if let Some((who, why)) = &board.failed
                && *who != rank
            {
                return Err(CommError::PeerFailed {
                    rank: *who,
                    reason: why.clone(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    rank,
                    timeout: self.config.timeout,
                    what: what.to_owned(),
                });
            }
            board = self
                .changed
                .wait_timeout(board, (deadline - now).min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Enable peer access from `a` to `b` (and back) if the hardware allows it.
pub(crate) fn enable_peer(a: &CudaContext, b: &CudaContext) -> Result<bool, CudaError> {
    let mut can = 0;
    // SAFETY: both devices come from opened contexts; the out-pointer is a
    // live local.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.cu_device(), b.cu_device()).result()? };
    if can == 0 {
        return Ok(false);
    }
    // What the link is like, for the debug log (the topology's own probe
    // measures it properly).
    let attribute = |which: sys::CUdevice_P2PAttribute| {
        let mut v = 0;
        // SAFETY: live devices; a local out-pointer.
        let r =
            unsafe { sys::cuDeviceGetP2PAttribute(&mut v, which, a.cu_device(), b.cu_device()) };
        (r == sys::CUresult::CUDA_SUCCESS).then_some(v)
    };
    tracing::debug!(
        "peer {} -> {}: performance rank {:?}, native atomics {:?}",
        a.ordinal(),
        b.ordinal(),
        attribute(sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK),
        attribute(sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED),
    );
    for (from, to) in [(a, b), (b, a)] {
        from.bind_to_thread()?;
        // SAFETY: `to`'s context is alive; enabling twice only reports
        // "already enabled", which is not an error here.
        let r = unsafe { sys::cuCtxEnablePeerAccess(to.cu_ctx(), 0) };
        if r != sys::CUresult::CUDA_SUCCESS
            && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        {
            // One-way access, too many peers: treat the pair as having no
            // peer access; its messages take the host relay.
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

/// Whether `event` has completed, polling until `deadline`.
pub(crate) fn wait_event(
    device: &Device,
    event: sys::CUevent,
    deadline: Instant,
) -> Result<bool, CudaError> {
    device.bind()?;
    let mut spins = 0u32;
    loop {
        // SAFETY: the event is alive until the call's resources are freed,
        // which happens only after every rank stopped polling.
        let r = unsafe { sys::cuEventQuery(event) };
        match r {
            sys::CUresult::CUDA_SUCCESS => return Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => {}
            other => {
                return Err(CudaError::Driver(format!(
                    "waiting for the device: {other:?}"
                )));
            }
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        spins += 1;
        if spins < 2000 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// A flag a sender waits on until its parcel is taken.
pub(crate) fn taken(flag: &AtomicBool) -> bool {
    flag.load(Ordering::Acquire)
}
