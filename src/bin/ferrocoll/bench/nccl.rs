//! `bench --backend nccl`: NCCL on the same GPUs and buffers, for the
//! side-by-side comparison with `--backend cuda`.

use cudarc::driver::DevicePtr;
use ferrocoll::comm::CommError;
use ferrocoll::conformance::KitElement;
use ferrocoll::cpu::CpuConfig;
use ferrocoll::nccl::{NcclCommunicator, NcclConfig};
use ferrocoll::{Collective, ReduceOp};

use super::device::{Buffers, download, place};
use super::run::{Backend, BenchRank};

/// NCCL for one section.
pub(crate) struct Nccl {
    devices: Vec<usize>,
    config: NcclConfig,
}

impl Nccl {
    pub(crate) fn new(devices: Vec<usize>, cpu: &CpuConfig) -> Nccl {
        Nccl {
            devices,
            config: NcclConfig {
                timeout: cpu.timeout,
            },
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

impl BenchRank for NcclCommunicator {
    type Buffers<T: KitElement> = Buffers;

    fn place<T: KitElement>(&mut self, input: &[T], output: Vec<T>) -> Result<Buffers, CommError> {
        place(&self.stream().clone(), input, &output)
    }

    fn collective<T: KitElement>(
        &mut self,
        b: &mut Buffers,
        collective: Collective,
        op: ReduceOp,
        in_place: bool,
        count: usize,
    ) -> Result<(), CommError> {
        let stream = self.stream().clone();
        let (input, _i) = b.input.device_ptr(&stream);
        let (output, _o) = b.output.device_ptr(&stream);
        let input = (!in_place).then_some(input);
        // SAFETY: `place` sized the buffers for this call's shape on this
        // rank's device; nothing else uses them during the call.
        unsafe { self.collective_raw(collective, T::DATA_TYPE, count, input, output, op) }
            .map_err(CommError::from)
    }

    fn output<T: KitElement>(&mut self, b: &Buffers) -> Result<Vec<T>, CommError> {
        download(&self.stream().clone(), &b.output)
    }
}
