//! `bench --backend cuda`: ferrocoll's CUDA executor (the device
//! interpreter), one launch per call on each rank's own stream, with
//! buffers in device memory (placed once per size, outside the timing).

use std::sync::Arc;

use ferrocoll::Verified;
use ferrocoll::comm::{CommError, Planning};
use ferrocoll::cpu::CpuConfig;
use ferrocoll::cuda::{CudaCommunicator, CudaConfig};
use ferrocoll::device::DeviceCommunicator;
use ferrocoll::process::ProcessConfig;
use ferrocoll::topo::probe::membw::MemoryBandwidth;

use super::BenchArgs;
use super::device::{DeviceRank, device_bandwidth, devices};
use super::launched::Launched;
use super::nccl::Nccl;
use super::row::Row;
use super::run::Backend;
use super::setup::custom_schedule;
use super::target::{Sweep, Target, device_timing};
use crate::spec::AlgoSpec;

/// The CUDA executor on this process's devices, with NCCL beside it if
/// asked.
pub(crate) struct CudaDevices {
    devices: Vec<usize>,
    custom: Option<Arc<Verified>>,
    compare: bool,
}

/// Open the CUDA executor on `--devices` (or every visible GPU).
pub(crate) fn open(args: &mut BenchArgs) -> Result<Box<dyn Target>, String> {
    if args.compare.is_some() {
        ferrocoll::nccl::version().map_err(|e| e.to_string())?;
    }
    Ok(Box::new(CudaDevices {
        devices: devices(args.ranks, args.devices.as_deref())?,
        custom: custom_schedule(&args.algo, args.ranks)?,
        compare: args.compare.is_some(),
    }))
}

/// Join the CUDA executor group `launch` started; `args.ranks` becomes
/// its size.
pub(crate) fn open_launched(args: &mut BenchArgs) -> Result<Box<dyn Target>, String> {
    // The group's settings are fixed when it forms: one run, one setting
    // (as `--backend nccl --from-env`).
    if args.compare.is_some() || args.algo != AlgoSpec::Auto {
        return Err(
            "--backend cuda --from-env runs the group's own choice: drop --compare and --algo"
                .to_owned(),
        );
    }
    let timeout = ProcessConfig::builtin()
        .with_env()
        .map_err(|e| e.to_string())?
        .planning
        .timeout;
    let mut cpu = CpuConfig::builtin();
    cpu.planning.timeout = timeout;
    let comm = ferrocoll::env::cuda_communicator_from_env(&cuda_config(&cpu, args))
        .map_err(|e| e.to_string())?;
    args.ranks = DeviceCommunicator::size(&comm);
    Ok(Box::new(Launched::new(comm, describe)))
}

/// The header's lines of the CUDA executor.
fn describe(args: &BenchArgs, config: &CpuConfig, algorithm: &str) -> Vec<String> {
    let cuda = cuda_config(config, args);
    vec![
        device_timing(args),
        format!(
            "# cuda: max chunk {} B, channels {}, {} slots per link, LL up to {} B{}, timeout {:?}, algorithm {algorithm}",
            cuda.max_chunk_bytes(),
            cuda.planning.channels.map_or(
                "auto (the GPU's resident blocks shared by its ranks)".into(),
                |c| c.to_string()
            ),
            cuda.planning.slots_per_link,
            cuda.ll_max_bytes,
            cuda.planning
                .protocols
                .as_ref()
                .map_or_else(String::new, |p| format!(
                    ", protocols `{p}` (FERROCOLL_PROTO)"
                )),
            cuda.planning.timeout,
        ),
    ]
}

impl Target for CudaDevices {
    fn custom(&self) -> Option<Arc<Verified>> {
        self.custom.clone()
    }

    fn describe(&self, args: &BenchArgs, config: &CpuConfig, algorithm: &str) -> Vec<String> {
        describe(args, config, algorithm)
    }

    fn memory_bandwidth(&self) -> Result<MemoryBandwidth, String> {
        device_bandwidth(self.devices[0])
    }

    fn run_section(&self, sweep: &Sweep) -> Result<Vec<Row>, String> {
        let backend = Cuda::new(self.devices.clone(), sweep.config, sweep.args);
        sweep.on(&backend)
    }

    fn compare(&self, sweep: &Sweep) -> Result<Option<Vec<Row>>, String> {
        if !self.compare {
            return Ok(None);
        }
        let backend = Nccl::new(self.devices.clone(), sweep.config, sweep.args.channels);
        let mut theirs = sweep.on(&backend)?;
        for row in &mut theirs {
            row.algorithm = "nccl".to_owned();
        }
        Ok(Some(theirs))
    }
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
            // FERROCOLL_ALGO's NCCL forms and FERROCOLL_PROTO, read with
            // the rest of the environment into the bench's configuration.
            algorithms: cpu.planning.algorithms.clone(),
            protocols: cpu.planning.protocols.clone(),
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
