//! The NCCL communicator.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys as cu};
use ferrocoll_core::comm::{
    Call, Checked, CommError, Communicator, CommunicatorExt, HostSlice, HostSliceMut,
    send_recv_by_pairs,
};
use ferrocoll_core::types::CallShape;
use ferrocoll_core::{Collective, DataType, Rank, ReduceOp};
use ferrocoll_device::DeviceCall;
use nccl_rs_sys::{
    library, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId,
};

use crate::{NcclError, call, check};

/// `NCCL_API_MAGIC` of nccl.h: marks an initialised config.
const API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`: "use NCCL's default".
const UNDEF: i32 = i32::MIN;

/// The id every rank of one NCCL communicator is created from. Ship its
/// bytes to the other processes (the env:// rendezvous will) and rebuild it
/// there with [`UniqueId::from_bytes`].
#[derive(Clone, Copy)]
pub struct UniqueId(ncclUniqueId);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({} bytes)", self.0.internal.len())
    }
}

impl UniqueId {
    /// The id's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.internal.iter().map(|&c| c as u8).collect()
    }

    /// An id from bytes produced by [`UniqueId::to_bytes`] elsewhere.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId, NcclError> {
        let mut id = ncclUniqueId { internal: [0; 128] };
        if bytes.len() != id.internal.len() {
            return Err(NcclError::Invalid(format!(
                "an NCCL unique id has {} bytes, not {}",
                id.internal.len(),
                bytes.len()
            )));
        }
        for (d, &s) in id.internal.iter_mut().zip(bytes) {
            *d = s as std::ffi::c_char;
        }
        Ok(UniqueId(id))
    }
}

/// A new unique id (rank 0 of a communicator makes it).
pub fn unique_id() -> Result<UniqueId, NcclError> {
    let lib = library()?;
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: a valid out-pointer to an id-sized struct.
    check(unsafe { call!(lib, ncclGetUniqueId(&mut id)) })?;
    Ok(UniqueId(id))
}

/// Settings of an NCCL communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclConfig {
    /// The longest initialisation or any call may take before the
    /// communicator is aborted.
    pub timeout: Duration,
    /// The fewest thread blocks (CTAs, NCCL's channels) a call uses
    /// (`None`: NCCL's choice).
    pub min_ctas: Option<u32>,
    /// The most thread blocks a call uses (`None`: NCCL's choice; with
    /// several ranks on one GPU, [`run`](crate::run) sets the GPU's SMs
    /// over its ranks, so their blocks all fit at once).
    pub max_ctas: Option<u32>,
}

impl Default for NcclConfig {
    fn default() -> Self {
        NcclConfig {
            timeout: ferrocoll_core::comm::DEFAULT_TIMEOUT,
            min_ctas: None,
            max_ctas: None,
        }
    }
}

impl NcclConfig {
    /// Every call on exactly `channels` thread blocks: what `--channels`
    /// means for NCCL.
    pub fn with_channels(self, channels: Option<u32>) -> Self {
        NcclConfig {
            min_ctas: channels.or(self.min_ctas),
            max_ctas: channels.or(self.max_ctas),
            ..self
        }
    }
}

pub(crate) fn nccl_type(t: DataType) -> ncclDataType_t {
    use ncclDataType_t as N;
    match t {
        DataType::I8 => N::ncclInt8,
        DataType::U8 => N::ncclUint8,
        DataType::I32 => N::ncclInt32,
        DataType::U32 => N::ncclUint32,
        DataType::I64 => N::ncclInt64,
        DataType::U64 => N::ncclUint64,
        DataType::F16 => N::ncclFloat16,
        DataType::Bf16 => N::ncclBfloat16,
        DataType::F32 => N::ncclFloat32,
        DataType::F64 => N::ncclFloat64,
    }
}

pub(crate) fn nccl_op(op: ReduceOp) -> ncclRedOp_t {
    match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Prod => ncclRedOp_t::ncclProd,
        ReduceOp::Min => ncclRedOp_t::ncclMin,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
        ReduceOp::Avg => ncclRedOp_t::ncclAvg,
    }
}

/// One rank of an NCCL communicator on one GPU.
pub struct NcclCommunicator {
    comm: ncclComm_t,
    rank: Rank,
    n: u32,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    timeout: Duration,
    aborted: bool,
    /// Set by any rank of a [`run`] group that failed, so the others stop
    /// waiting at once.
    group_failed: Arc<AtomicBool>,
}

impl NcclCommunicator {
    /// Join communicator `id` as `rank` of `n` on CUDA device `device`.
    /// Initialisation is non-blocking and bounded by the timeout.
    pub fn init(
        id: &UniqueId,
        rank: Rank,
        n: u32,
        device: usize,
        config: &NcclConfig,
    ) -> Result<Self, NcclError> {
        Self::init_in(
            id,
            rank,
            n,
            device,
            config,
            Arc::new(AtomicBool::new(false)),
        )
    }

    pub(crate) fn init_in(
        id: &UniqueId,
        rank: Rank,
        n: u32,
        device: usize,
        config: &NcclConfig,
        group_failed: Arc<AtomicBool>,
    ) -> Result<Self, NcclError> {
        let lib = library()?;
        if !ferrocoll_device::driver_present() {
            return Err(NcclError::Cuda(
                "libcuda is not installed (no NVIDIA driver): NCCL needs a GPU".into(),
            ));
        }
        let ctx = CudaContext::new(device)?;
        ctx.bind_to_thread()?;
        let stream = ctx.new_stream()?;
        let mut cfg = blank_config();
        cfg.blocking = 0;
        let ctas = |c: Option<u32>| c.map_or(UNDEF, |c| c.clamp(1, i32::MAX as u32) as i32);
        cfg.minCTAs = ctas(config.min_ctas);
        cfg.maxCTAs = ctas(config.max_ctas);
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: the out-pointer and config are valid for the call; the
        // id is a 128-byte struct passed by value, as nccl.h declares.
        let r = unsafe {
            call!(
                lib,
                ncclCommInitRankConfig(&mut comm, n as i32, id.0, rank as i32, &mut cfg)
            )
        };
        if r != ncclResult_t::ncclInProgress {
            check(r)?;
        }
        let mut me = NcclCommunicator {
            comm,
            rank,
            n,
            ctx,
            stream,
            timeout: config.timeout,
            aborted: false,
            group_failed,
        };
        me.settle("initialisation")?;
        Ok(me)
    }

    /// A communicator NCCL made for this rank's context (a split's): its
    /// own stream; rank and size read back from NCCL once it is ready.
    pub(crate) fn adopt(
        comm: ncclComm_t,
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        timeout: Duration,
        group_failed: Arc<AtomicBool>,
    ) -> Self {
        NcclCommunicator {
            comm,
            rank: 0,
            n: 1,
            ctx,
            stream,
            timeout,
            aborted: false,
            group_failed,
        }
    }

    /// The flag that tells the ranks of one `run` group a peer failed.
    pub(crate) fn group_flag(&self) -> Arc<AtomicBool> {
        self.group_failed.clone()
    }

    /// Read this rank and the size from NCCL.
    pub(crate) fn read_shape(&mut self) -> Result<(), NcclError> {
        self.live()?;
        let lib = library()?;
        let (mut rank, mut n) = (0i32, 0i32);
        // SAFETY: a live, ready communicator and valid out-pointers.
        unsafe {
            check(call!(lib, ncclCommUserRank(self.comm, &mut rank)))?;
            check(call!(lib, ncclCommCount(self.comm, &mut n)))?;
        }
        self.rank = rank as Rank;
        self.n = n as u32;
        Ok(())
    }

    /// This rank (also [`Communicator::rank`]).
    pub(crate) fn rank_id(&self) -> Rank {
        self.rank
    }

    /// Ranks in the communicator.
    pub(crate) fn size_n(&self) -> u32 {
        self.n
    }

    /// The NCCL handle.
    pub(crate) fn raw(&self) -> ncclComm_t {
        self.comm
    }

    /// The longest any call may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// This rank's CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream NCCL work is issued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Abort the communicator (idempotent); later calls fail.
    pub fn abort(&mut self) {
        if self.aborted || self.comm.is_null() {
            return;
        }
        self.aborted = true;
        if let Ok(lib) = library()
            && let Ok(f) = lib.ncclCommAbort.as_ref()
        {
            // SAFETY: a live communicator, aborted once.
            let r = unsafe { f(self.comm) };
            if r != ncclResult_t::ncclSuccess {
                tracing::warn!("ncclCommAbort: {r:?}");
            }
        }
    }

    /// `Err` once the communicator was aborted: NCCL freed it, so no call
    /// may pass it on.
    pub(crate) fn live(&self) -> Result<(), NcclError> {
        if self.aborted || self.comm.is_null() {
            return Err(NcclError::Invalid("the communicator was aborted".into()));
        }
        Ok(())
    }

    pub(crate) fn fail(&mut self, e: NcclError) -> NcclError {
        self.group_failed.store(true, Ordering::Release);
        self.abort();
        e
    }

    /// Wait until the communicator is no longer "in progress"; abort on an
    /// error, a timeout, or a failed peer of the same group.
    pub(crate) fn settle(&mut self, what: &str) -> Result<(), NcclError> {
        self.live()?;
        let lib = library()?;
        let deadline = Instant::now() + self.timeout;
        let mut poller = ferrocoll_device::Poller::new();
        loop {
            let mut state = ncclResult_t::ncclInProgress;
            // SAFETY: a live communicator and a valid out-pointer.
            let r = unsafe { call!(lib, ncclCommGetAsyncError(self.comm, &mut state)) };
            if let Err(e) = check(r) {
                return Err(self.fail(e));
            }
            match state {
                ncclResult_t::ncclSuccess => return Ok(()),
                ncclResult_t::ncclInProgress => {}
                other => {
                    let e = check(other).expect_err("not success");
                    return Err(self.fail(e));
                }
            }
            if self.group_failed.load(Ordering::Acquire) {
                return Err(self.fail(NcclError::Invalid(format!("{what}: another rank failed"))));
            }
            if Instant::now() >= deadline {
                let timeout = self.timeout;
                return Err(self.fail(NcclError::Timeout {
                    rank: self.rank,
                    what: what.into(),
                    timeout,
                }));
            }
            poller.pause();
        }
    }

    /// Wait for this rank's own stream, watching NCCL's async errors.
    fn finish(&mut self, what: &str) -> Result<(), NcclError> {
        let stream = self.stream.clone();
        self.finish_on(&stream, what)
    }

    /// Wait for `stream`, watching NCCL's async errors, the group's
    /// failure flag and the timeout; any of them aborts.
    pub(crate) fn finish_on(&mut self, stream: &CudaStream, what: &str) -> Result<(), NcclError> {
        self.settle(what)?;
        let deadline = Instant::now() + self.timeout;
        let mut poller = ferrocoll_device::Poller::new();
        loop {
            self.ctx.bind_to_thread()?;
            // SAFETY: a live stream of this context.
            let r = unsafe { cu::cuStreamQuery(stream.cu_stream()) };
            match r {
                cu::CUresult::CUDA_SUCCESS => return Ok(()),
                cu::CUresult::CUDA_ERROR_NOT_READY => {}
                other => return Err(self.fail(NcclError::Cuda(format!("{what}: {other:?}")))),
            }
            self.settle(what)?;
            if self.group_failed.load(Ordering::Acquire) {
                return Err(self.fail(NcclError::Invalid(format!("{what}: another rank failed"))));
            }
            if Instant::now() >= deadline {
                let timeout = self.timeout;
                return Err(self.fail(NcclError::Timeout {
                    rank: self.rank,
                    what: what.into(),
                    timeout,
                }));
            }
            poller.pause();
        }
    }

    /// Run `collective` on device pointers of this rank's GPU, on the
    /// communicator's own stream, and wait for it: `count` elements per
    /// block; in place when `input` is `None`. The stream-ordered form is
    /// [`DeviceCommunicator`](ferrocoll_device::DeviceCommunicator).
    ///
    /// # Safety
    /// The pointers address buffers of the collective's shape on this
    /// rank's device, untouched by other work until the call returns.
    /// Overlapping `input` and `output` are refused; pass `None` to run in
    /// place.
    pub unsafe fn collective_raw(
        &mut self,
        collective: Collective,
        dtype: DataType,
        count: usize,
        input: Option<u64>,
        output: u64,
        op: ReduceOp,
    ) -> Result<(), NcclError> {
        if let Some(i) = input {
            let bytes = |blocks: u32| blocks as usize * count * dtype.size_bytes();
            ferrocoll_core::comm::check_disjoint(
                i,
                bytes(collective.input_blocks(self.n)),
                output,
                bytes(collective.output_blocks(self.n)),
            )
            .map_err(|e| NcclError::Invalid(e.to_string()))?;
        }
        let call = DeviceCall {
            collective,
            dtype,
            count,
            input,
            output,
            op,
        };
        let stream = self.stream.clone();
        // SAFETY: the caller's promise, on this rank's own stream.
        unsafe { self.issue(&call, &stream)? };
        self.finish(&collective.to_string())
    }

    /// Stage host data through the device and run the collective.
    fn host_collective(
        &mut self,
        shape: &CallShape,
        input: Option<HostSlice<'_>>,
        mut output: HostSliceMut<'_>,
    ) -> Result<(), CommError> {
        if shape.collective == Collective::SendRecv {
            return send_recv_by_pairs(
                self,
                input.expect("send-recv has no in-place form"),
                output,
            );
        }
        let stage = |bytes: &[u8]| -> Result<CudaSlice<u8>, NcclError> {
            let mut d = self.stream.alloc_zeros::<u8>(bytes.len().max(1))?;
            if !bytes.is_empty() {
                self.stream
                    .memcpy_htod(bytes, &mut d.slice_mut(..bytes.len()))?;
            }
            Ok(d)
        };
        let dev_in = input.map(|i| stage(i.as_bytes())).transpose()?;
        let dev_out = stage(output.as_bytes_mut())?;
        self.stream.synchronize().map_err(NcclError::from)?;
        let in_ptr = dev_in.as_ref().map(|d| d.device_ptr(&self.stream).0);
        let out_ptr = dev_out.device_ptr(&self.stream).0;
        // SAFETY: staged buffers of the shape `shape` checked.
        unsafe {
            self.collective_raw(
                shape.collective,
                shape.dtype,
                shape.count,
                in_ptr,
                out_ptr,
                shape.op,
            )?
        };
        let back = self.stream.clone_dtoh(&dev_out).map_err(NcclError::from)?;
        let out = output.as_bytes_mut();
        out.copy_from_slice(&back[..out.len()]);
        Ok(())
    }

    fn p2p(
        &mut self,
        data: Option<HostSlice<'_>>,
        buffer: Option<HostSliceMut<'_>>,
        peer: Rank,
    ) -> Result<(), CommError> {
        self.live()?;
        let lib = library().map_err(NcclError::from)?;
        self.ctx.bind_to_thread().map_err(NcclError::from)?;
        let dtype = data.map_or_else(
            || buffer.as_ref().map_or(DataType::U8, |b| b.dtype()),
            |d| d.dtype(),
        );
        let t = nccl_type(dtype);
        let s = self.stream.cu_stream() as nccl_rs_sys::cudaStream_t;
        let len = data.map_or_else(|| buffer.as_ref().map_or(0, |b| b.len()), |d| d.len());
        let bytes = len * dtype.size_bytes();
        let mut dev = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(NcclError::from)?;
        if let Some(d) = data
            && bytes > 0
        {
            self.stream
                .memcpy_htod(d.as_bytes(), &mut dev.slice_mut(..bytes))
                .map_err(NcclError::from)?;
        }
        let ptr = dev.device_ptr(&self.stream).0 as *mut c_void;
        // SAFETY: `len` elements in the staged buffer; a live communicator.
        let r = unsafe {
            if data.is_some() {
                call!(lib, ncclSend(ptr, len, t, peer as i32, self.comm, s))
            } else {
                call!(lib, ncclRecv(ptr, len, t, peer as i32, self.comm, s))
            }
        };
        if r != ncclResult_t::ncclInProgress
            && let Err(e) = check(r)
        {
            return Err(self.fail(e).into());
        }
        self.finish(if data.is_some() { "send" } else { "recv" })?;
        if let Some(mut b) = buffer {
            let back = self.stream.clone_dtoh(&dev).map_err(NcclError::from)?;
            let out = b.as_bytes_mut();
            let n = out.len();
            out.copy_from_slice(&back[..n]);
        }
        Ok(())
    }
}

/// nccl.h's `NCCL_CONFIG_INITIALIZER`.
pub(crate) fn blank_config() -> ncclConfig_t {
    // SAFETY: the config is plain data (integers and nullable pointers);
    // all-zero is a valid bit pattern, and the fields are then set as the
    // initializer macro sets them.
    let mut c: ncclConfig_t = unsafe { std::mem::zeroed() };
    c.size = std::mem::size_of::<ncclConfig_t>();
    c.magic = API_MAGIC;
    c.version = nccl_rs_sys::NCCL_VERSION_CODE;
    c.blocking = UNDEF;
    c.cgaClusterSize = UNDEF;
    c.minCTAs = UNDEF;
    c.maxCTAs = UNDEF;
    c.splitShare = UNDEF;
    c.trafficClass = UNDEF;
    c.collnetEnable = UNDEF;
    c.CTAPolicy = UNDEF;
    c.shrinkShare = UNDEF;
    c.nvlsCTAs = UNDEF;
    c.nChannelsPerNetPeer = UNDEF;
    c.nvlinkCentricSched = UNDEF;
    c.graphUsageMode = UNDEF;
    c.numRmaCtx = UNDEF;
    c.maxP2pPeers = UNDEF;
    c.graphStreamOrdering = UNDEF;
    c.launchOrderImplicit = UNDEF;
    c.numRmaSig = UNDEF;
    c.rmaEagerInit = UNDEF;
    c.hostCftMode = UNDEF;
    c.nvlsHostMode = UNDEF;
    c
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        if self.comm.is_null() {
            return;
        }
        let Ok(lib) = library() else { return };
        // The communicator may be dropped on another thread than the one
        // that used it last (it is `Send`): its device first.
        if let Err(e) = self.ctx.bind_to_thread() {
            tracing::warn!(
                "NCCL rank {}: binding its context to drop it: {e}",
                self.rank
            );
        }
        if !self.aborted {
            // Finalise (non-blocking), then destroy; a failure is logged,
            // and the communicator aborted instead of panicking.
            // SAFETY: a live communicator.
            let r = lib
                .ncclCommFinalize
                .as_ref()
                .map(|f| unsafe { f(self.comm) });
            let settled = match r {
                Ok(ncclResult_t::ncclSuccess) | Ok(ncclResult_t::ncclInProgress) => {
                    self.settle("finalisation")
                }
                Ok(other) => check(other),
                Err(_) => Ok(()),
            };
            if let Err(e) = settled {
                tracing::warn!("NCCL finalisation of rank {}: {e}", self.rank);
                self.abort();
                return;
            }
        }
        if !self.aborted
            && let Ok(f) = lib.ncclCommDestroy.as_ref()
        {
            // SAFETY: a live, finalised communicator, destroyed once.
            let r = unsafe { f(self.comm) };
            if r != ncclResult_t::ncclSuccess {
                tracing::warn!("ncclCommDestroy of rank {}: {r:?}", self.rank);
            }
        }
    }
}

// SAFETY: NCCL lets a communicator be used from any thread, one call at a
// time (it is not safe for concurrent calls, which `&mut self` rules out);
// every call binds this rank's CUDA context to the calling thread before
// it touches the device, and the context and stream handles are themselves
// `Send`. The raw `ncclComm_t` is the only field that is not.
unsafe impl Send for NcclCommunicator {}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.n
    }

    fn execute(&mut self, call: Call<'_>) -> Result<(), CommError> {
        match call.check(self.rank, self.n)? {
            Checked::Collective {
                shape,
                input,
                output,
            } => self.host_collective(&shape, input, output),
            Checked::Send { data, peer } => self.p2p(Some(data), None, peer),
            Checked::Recv { buffer, peer } => self.p2p(None, Some(buffer), peer),
            // NCCL has no barrier: a one-element all-reduce is one.
            Checked::Barrier => self.all_reduce_in_place(&mut [0i32], ReduceOp::Sum),
        }
    }

    fn abort(&mut self) {
        NcclCommunicator::abort(self)
    }

    fn split(
        &mut self,
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<Box<dyn Communicator + Send>>, CommError> {
        // `split_nccl` is the inherent method of `split.rs`, which builds
        // on this file (not the other way round).
        Ok(self
            .split_nccl(color, key)?
            .map(|c| Box::new(c) as Box<dyn Communicator + Send>))
    }
}
