//! `bench --backend nccl`: NCCL on the same GPUs and buffers, for the
//! side-by-side comparison with `--backend cuda`.

use ferrocoll::comm::{CommError, Communicator};
use ferrocoll::cpu::CpuConfig;
use ferrocoll::nccl::{NcclCommunicator, NcclConfig};
use ferrocoll::process::ProcessConfig;
use ferrocoll::topo::probe::membw::MemoryBandwidth;

use super::BenchArgs;
use super::device::{DeviceRank, device_bandwidth, devices};
use super::launched::Launched;
use super::row::Row;
use super::run::Backend;
use super::target::{Sweep, Target, device_timing};

/// NCCL on this process's devices.
pub(crate) struct NcclDevices {
    devices: Vec<usize>,
}

/// Open NCCL on `--devices` (or every visible GPU).
pub(crate) fn open(args: &mut BenchArgs) -> Result<Box<dyn Target>, String> {
    ferrocoll::nccl::version().map_err(|e| e.to_string())?;
    Ok(Box::new(NcclDevices {
        devices: devices(args.ranks, args.devices.as_deref())?,
    }))
}

/// Join the NCCL communicator `launch` started; `args.ranks` becomes its
/// size.
pub(crate) fn open_launched(args: &mut BenchArgs) -> Result<Box<dyn Target>, String> {
    let config = NcclConfig {
        timeout: ProcessConfig::builtin()
            .with_env()
            .map_err(|e| e.to_string())?
            .planning
            .timeout,
        ..NcclConfig::default()
    }
    .with_channels(args.channels);
    let comm = ferrocoll::env::nccl_communicator_from_env(&config).map_err(|e| e.to_string())?;
    args.ranks = comm.world_size();
    Ok(Box::new(Launched::new(comm, describe)))
}

/// The header's lines of NCCL.
fn describe(args: &BenchArgs, _config: &CpuConfig, _algorithm: &str) -> Vec<String> {
    vec![device_timing(args)]
}

impl Target for NcclDevices {
    fn describe(&self, args: &BenchArgs, config: &CpuConfig, algorithm: &str) -> Vec<String> {
        describe(args, config, algorithm)
    }

    fn memory_bandwidth(&self) -> Result<MemoryBandwidth, String> {
        device_bandwidth(self.devices[0])
    }

    fn run_section(&self, sweep: &Sweep) -> Result<Vec<Row>, String> {
        let backend = Nccl::new(self.devices.clone(), sweep.config, sweep.args.channels);
        sweep.on(&backend)
    }
}

/// NCCL for one section.
pub(crate) struct Nccl {
    devices: Vec<usize>,
    config: NcclConfig,
}

impl Nccl {
    /// NCCL with the bench's timeout, on `--channels` blocks if given.
    pub(crate) fn new(devices: Vec<usize>, cpu: &CpuConfig, channels: Option<u32>) -> Nccl {
        Nccl {
            devices,
            config: NcclConfig {
                timeout: cpu.planning.timeout,
                ..NcclConfig::default()
            }
            .with_channels(channels),
        }
    }
}

impl Backend for Nccl {
    type Rank = NcclCommunicator;

    fn run<R: Send>(
        &self,
        f: &(dyn Fn(&mut NcclCommunicator) -> Result<R, CommError> + Sync),
    ) -> Result<Vec<Result<R, CommError>>, String> {
        ferrocoll::nccl::run(&self.devices, &self.config, f).map_err(|e| e.to_string())
    }

    fn schedule(&self) -> Option<&ferrocoll::Verified> {
        None
    }
}

impl DeviceRank for NcclCommunicator {
    fn rank_stream(&self) -> std::sync::Arc<cudarc::driver::CudaStream> {
        self.stream().clone()
    }
}
