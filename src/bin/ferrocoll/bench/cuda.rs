//! `bench --backend cuda`: ferrocoll's CUDA executor (the device
//! interpreter), one launch per call on each rank's own stream, with
//! buffers in device memory (placed once per size, outside the timing).

use ferrocoll::comm::{CommError, Planning};
use ferrocoll::cpu::CpuConfig;
use ferrocoll::cuda::{CudaCommunicator, CudaConfig, GpuProbe, probe};
use ferrocoll::topo::probe::membw::MemoryBandwidth;
use ferrocoll::topo::probe::{LinkProbe, ProbeOptions};

use super::BenchArgs;
use super::device::DeviceRank;
use super::run::Backend;

/// Device memory bandwidth of `device` as the bench's ceiling wants it:
/// bytes read plus written per second by a device-to-device copy of
/// 256 MiB (the copy rate twice over).
pub(crate) fn device_bandwidth(device: usize) -> Result<MemoryBandwidth, String> {
    let report = GpuProbe {
        devices: vec![device],
    }
    .measure(&ProbeOptions {
        bytes: 256 << 20,
        repeats: 5,
        p2p: true,
    })
    .map_err(|e| e.to_string())?;
    let traffic = 2.0 * report.unidirectional_gbps.get(0, 0);
    Ok(MemoryBandwidth {
        copy: traffic,
        nt_copy: None,
        accumulate: traffic,
        best: traffic,
        threads: 1,
    })
}

/// The device of each of `ranks` ranks, from `--devices` or round the
/// visible devices; a typed "unavailable" message without CUDA.
pub(crate) fn devices(ranks: u32, list: Option<&str>) -> Result<Vec<usize>, String> {
    let count = probe::available().map_err(|e| e.to_string())?;
    let given: Vec<usize> = match list {
        Some(s) => s
            .split(',')
            .map(|d| {
                d.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("--devices: `{d}` is not a device number"))
            })
            .collect::<Result<_, _>>()?,
        None => (0..count).collect(),
    };
    if given.is_empty() {
        return Err("--devices is empty".into());
    }
    if let Some(bad) = given.iter().find(|&&d| d >= count) {
        return Err(format!(
            "--devices: device {bad} does not exist (this machine has {count})"
        ));
    }
    Ok((0..ranks as usize)
        .map(|r| given[r % given.len()])
        .collect())
}

/// The CUDA executor's settings for one section: the bench's timeout,
/// algorithm and schedule, and the channels, chunk and LL threshold the
/// command line gives (else the executor's own: channels from what the
/// GPUs hold).
pub(crate) fn cuda_config(cpu: &CpuConfig, args: &BenchArgs) -> CudaConfig {
    let base = CudaConfig::default();
    CudaConfig {
        ll_max_bytes: args.ll_max_bytes.unwrap_or(base.ll_max_bytes),
        kernel_cache: ferrocoll::env::kernel_cache(),
        planning: Planning {
            timeout: cpu.planning.timeout,
            algorithm: cpu.planning.algorithm,
            schedule: cpu.planning.schedule.clone(),
            channels: args.channels,
            max_chunk_bytes: Some(args.max_chunk_bytes.unwrap_or(base.max_chunk_bytes())),
            ..base.planning
        },
        ..base
    }
}

/// The CUDA executor for one section.
pub(crate) struct Cuda {
    devices: Vec<usize>,
    config: CudaConfig,
}

impl Cuda {
    pub(crate) fn new(devices: Vec<usize>, cpu: &CpuConfig, args: &BenchArgs) -> Cuda {
        Cuda {
            devices,
            config: cuda_config(cpu, args),
        }
    }
}

impl Backend for Cuda {
    type Rank = CudaCommunicator;

    fn run<R: Send>(
        &self,
        f: &(dyn Fn(&mut CudaCommunicator) -> Result<R, CommError> + Sync),
    ) -> Result<Vec<Result<R, CommError>>, String> {
        ferrocoll::cuda::run(&self.devices, &self.config, f).map_err(|e| e.to_string())
    }

    fn schedule(&self) -> Option<&ferrocoll::Verified> {
        self.config.planning.schedule.as_deref()
    }
}

impl DeviceRank for CudaCommunicator {
    fn rank_stream(&self) -> std::sync::Arc<cudarc::driver::CudaStream> {
        self.stream().clone()
    }
}
