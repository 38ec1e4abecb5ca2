//! The measured link probe for GPUs, in the layout of CUDA's
//! `p2pBandwidthLatencyTest`: every ordered pair's copy bandwidth one way
//! and both ways at once, and the latency of a small copy, with peer
//! access on (direct) or off (staged by the driver through host memory).

use std::sync::Arc;

use cudarc::driver::{CudaContext, result, sys};
use ferrocoll_topo::probe::{LinkProbe, Matrix, ProbeError, ProbeOptions, ProbeReport};

use crate::error::CudaError;
use crate::probe;

/// One GPU of a probe: its primary context.
struct Device {
    ordinal: usize,
    ctx: Arc<CudaContext>,
}

impl Device {
    fn open(ordinal: usize) -> Result<Device, CudaError> {
        Ok(Device {
            ordinal,
            ctx: CudaContext::new(ordinal)?,
        })
    }

    fn bind(&self) -> Result<(), CudaError> {
        Ok(self.ctx.bind_to_thread()?)
    }

    /// `bytes` of device memory, freed by [`Copies::free`].
    fn alloc(&self, bytes: usize) -> Result<u64, CudaError> {
        self.bind()?;
        // SAFETY: the context is current; freed once, after the probe's
        // copies completed.
        Ok(unsafe { result::malloc_sync(bytes)? })
    }
}

/// Small copies timed for the latency matrix.
const LATENCY_COPIES: u32 = 100;

/// Probes the links between `devices` (CUDA ordinals).
#[derive(Debug, Clone)]
pub struct GpuProbe {
    /// The devices to measure, in report order.
    pub devices: Vec<usize>,
}

impl GpuProbe {
    /// Every visible device, or an error saying why there is none.
    pub fn all() -> Result<GpuProbe, CudaError> {
        Ok(GpuProbe {
            devices: (0..probe::available()?).collect(),
        })
    }
}

fn unavailable(e: CudaError) -> ProbeError {
    match e {
        CudaError::BackendUnavailable { reason } => ProbeError::Unavailable(reason),
        other => ProbeError::Failed(other.to_string()),
    }
}

/// A timing event.
struct Timer {
    device: Arc<Device>,
    event: sys::CUevent,
}

impl Timer {
    fn new(device: &Arc<Device>) -> Result<Timer, CudaError> {
        device.bind()?;
        Ok(Timer {
            device: device.clone(),
            event: result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)?,
        })
    }

    fn record(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: a live event and a live stream of this device.
        unsafe { result::event::record(self.event, stream) }?;
        Ok(())
    }

    /// Milliseconds from `self` to `end`, once `end` has completed.
    fn ms_to(&self, end: &Timer) -> Result<f64, CudaError> {
        // SAFETY: both events were recorded; synchronising waits for the
        // end, so the elapsed time is defined.
        unsafe {
            result::event::synchronize(end.event)?;
            Ok(f64::from(result::event::elapsed(self.event, end.event)?))
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: the event is no longer used.
            let _ = unsafe { result::event::destroy(self.event) };
        }
    }
}

impl LinkProbe for GpuProbe {
    fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn measure(&self, options: &ProbeOptions) -> Result<ProbeReport, ProbeError> {
        self.run(options).map_err(unavailable)
    }
}

impl GpuProbe {
    fn run(&self, options: &ProbeOptions) -> Result<ProbeReport, CudaError> {
        let count = probe::available()?;
        let n = self.devices.len();
        if let Some(&bad) = self.devices.iter().find(|&&d| d >= count) {
            return Err(CudaError::Invalid(format!("device {bad} does not exist")));
        }
        let devs: Vec<Arc<Device>> = self
            .devices
            .iter()
            .map(|&d| Device::open(d).map(Arc::new))
            .collect::<Result<_, _>>()?;
        set_peer_access(&devs, options.p2p)?;
        let bytes = options.bytes.max(4);
        let repeats = options.repeats.max(1);
        let bench = Copies {
            streams: devs
                .iter()
                .map(|d| d.ctx.new_stream())
                .collect::<Result<Vec<_>, _>>()?,
            bufs: devs
                .iter()
                .map(|d| d.alloc(bytes))
                .collect::<Result<_, _>>()?,
            spare: devs
                .iter()
                .map(|d| d.alloc(bytes))
                .collect::<Result<_, _>>()?,
            devs,
            bytes,
            repeats,
        };
        let (mut uni, mut bi, mut lat) = (Matrix::new(n), Matrix::new(n), Matrix::new(n));
        for i in 0..n {
            for j in 0..n {
                let (gbps, us) = bench.one_way(i, j)?;
                uni.set(i, j, gbps);
                lat.set(i, j, us);
                bi.set(i, j, bench.both_ways(i, j)?);
            }
        }
        bench.free()?;
        Ok(ProbeReport {
            what: format!(
                "GPUs {:?}, {} bytes per copy, {repeats} copies timed together, peer access {}",
                self.devices,
                bytes,
                if options.p2p {
                    "on where supported"
                } else {
                    "off"
                }
            ),
            p2p: options.p2p,
            unidirectional_gbps: uni,
            bidirectional_gbps: bi,
            latency_us: lat,
        })
    }
}

/// Turn peer access between every pair on (where the hardware allows) or off.
fn set_peer_access(devs: &[Arc<Device>], p2p: bool) -> Result<(), CudaError> {
    for a in devs {
        for b in devs {
            if a.ordinal == b.ordinal {
                continue;
            }
            a.bind()?;
            if p2p {
                let mut can = 0;
                // SAFETY: live devices; a local out-pointer.
                unsafe {
                    sys::cuDeviceCanAccessPeer(&mut can, a.ctx.cu_device(), b.ctx.cu_device())
                };
                if can == 1 {
                    // SAFETY: enabling access to a live context;
                    // "already enabled" is fine.
                    let _ = unsafe { sys::cuCtxEnablePeerAccess(b.ctx.cu_ctx(), 0) };
                }
            } else {
                // Primary contexts outlive groups: access enabled by an
                // earlier group would make "off" measure "on".
                // SAFETY: disabling access to a live context; "not
                // enabled" is fine.
                let _ = unsafe { sys::cuCtxDisablePeerAccess(b.ctx.cu_ctx()) };
            }
        }
    }
    Ok(())
}

/// The devices, their streams and buffers of one probe.
struct Copies {
    devs: Vec<Arc<Device>>,
    streams: Vec<Arc<cudarc::driver::CudaStream>>,
    bufs: Vec<u64>,
    spare: Vec<u64>,
    bytes: usize,
    repeats: u32,
}

impl Copies {
    /// Enqueue a copy of `len` bytes from device `from` to `to` (a local
    /// copy goes to the spare buffer).
    fn copy(
        &self,
        from: usize,
        to: usize,
        len: usize,
        stream: sys::CUstream,
    ) -> Result<(), CudaError> {
        let (src, dst) = (&self.devs[from], &self.devs[to]);
        let dst_ptr = if from == to {
            self.spare[to]
        } else {
            self.bufs[to]
        };
        // SAFETY: both buffers hold at least `len` bytes.
        unsafe {
            result::memcpy_peer_async(
                dst.ctx.cu_ctx(),
                dst_ptr,
                src.ctx.cu_ctx(),
                self.bufs[from],
                len,
                stream,
            )
        }?;
        Ok(())
    }

    /// i → j: bandwidth (GB/s) of large copies, latency (µs) of tiny ones.
    fn one_way(&self, i: usize, j: usize) -> Result<(f64, f64), CudaError> {
        let s = self.streams[i].cu_stream();
        let (start, end) = (Timer::new(&self.devs[i])?, Timer::new(&self.devs[i])?);
        self.copy(i, j, self.bytes, s)?;
        start.record(s)?;
        for _ in 0..self.repeats {
            self.copy(i, j, self.bytes, s)?;
        }
        end.record(s)?;
        let ms = start.ms_to(&end)?;
        let gbps = self.bytes as f64 * f64::from(self.repeats) / (ms * 1e-3) / 1e9;
        start.record(s)?;
        for _ in 0..LATENCY_COPIES {
            self.copy(i, j, 4, s)?;
        }
        end.record(s)?;
        let us = start.ms_to(&end)? * 1e3 / f64::from(LATENCY_COPIES);
        Ok((gbps, us))
    }

    /// Both ways at once: j→i on j's stream, started together; j's end is
    /// brought back to i's stream, so one device's events time both
    /// (events of two devices cannot be). GB/s over both directions.
    fn both_ways(&self, i: usize, j: usize) -> Result<f64, CudaError> {
        let (s, t) = (self.streams[i].cu_stream(), self.streams[j].cu_stream());
        let devs = &self.devs;
        let (start, end_i, end_j) = (
            Timer::new(&devs[i])?,
            Timer::new(&devs[i])?,
            Timer::new(&devs[j])?,
        );
        start.record(s)?;
        devs[j].bind()?;
        // SAFETY: live stream and recorded event.
        unsafe {
            result::stream::wait_event(
                t,
                start.event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }?;
        for _ in 0..self.repeats {
            self.copy(i, j, self.bytes, s)?;
            if i != j {
                self.copy(j, i, self.bytes, t)?;
            }
        }
        end_j.record(t)?;
        devs[i].bind()?;
        // SAFETY: as above.
        unsafe {
            result::stream::wait_event(
                s,
                end_j.event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }?;
        end_i.record(s)?;
        let ms = start.ms_to(&end_i)?;
        let moved = if i == j { 1.0 } else { 2.0 } * self.bytes as f64 * f64::from(self.repeats);
        Ok(moved / (ms * 1e-3) / 1e9)
    }

    /// Wait for the copies and free the buffers.
    fn free(&self) -> Result<(), CudaError> {
        for (d, (&a, &b)) in self.devs.iter().zip(self.bufs.iter().zip(&self.spare)) {
            d.ctx.synchronize()?;
            d.bind()?;
            // SAFETY: allocated by `Device::alloc` in this context; the
            // work above has completed.
            unsafe {
                result::free_sync(a)?;
                result::free_sync(b)?;
            }
        }
        Ok(())
    }
}
