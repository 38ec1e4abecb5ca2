//! `bench --backend nccl`: NCCL on the same GPUs and buffers, for the
//! side-by-side comparison with `--backend cuda`.

use ferrocoll::comm::CommError;
use ferrocoll::cpu::CpuConfig;
use ferrocoll::nccl::{NcclCommunicator, NcclConfig};

use super::device::DeviceRank;
use super::run::Backend;

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
