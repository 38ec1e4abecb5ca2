//! `bench --backend cuda-v2`: the device interpreter (executor v2), one
//! launch per call on each rank's own stream, with buffers in device
//! memory (placed once per size, outside the timing).

use cudarc::driver::DevicePtr;
use ferrocoll::comm::CommError;
use ferrocoll::conformance::KitElement;
use ferrocoll::cpu::CpuConfig;
use ferrocoll::cuda::CudaConfig;
use ferrocoll::cuda::interpreter::{self, InterpreterCommunicator};
use ferrocoll::device::{DeviceCall, DeviceCommunicator};
use ferrocoll::{Collective, ReduceOp};

use super::device::{Buffers, download, place};
use super::run::{Backend, BenchRank};

/// The device interpreter for one section.
pub(crate) struct CudaV2 {
    devices: Vec<usize>,
    config: CudaConfig,
}

impl CudaV2 {
    pub(crate) fn new(devices: Vec<usize>, cpu: &CpuConfig, ll_max_bytes: Option<usize>) -> CudaV2 {
        let base = super::cuda::cuda_config(cpu);
        CudaV2 {
            devices,
            config: CudaConfig {
                ll_max_bytes: ll_max_bytes.unwrap_or(base.ll_max_bytes),
                ..base
            },
        }
    }
}

impl Backend for CudaV2 {
    type Rank = InterpreterCommunicator;

    fn run<R: Send>(
        &self,
        f: &(dyn Fn(&mut InterpreterCommunicator) -> Result<R, CommError> + Sync),
    ) -> Result<Vec<Result<R, CommError>>, String> {
        interpreter::run(&self.devices, &self.config, f).map_err(|e| e.to_string())
    }

    fn schedule(&self) -> Option<&ferrocoll::Verified> {
        self.config.schedule.as_deref()
    }
}

impl BenchRank for InterpreterCommunicator {
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
        let call = DeviceCall {
            collective,
            dtype: T::DATA_TYPE,
            count,
            input: (!in_place).then_some(input),
            output,
            op,
        };
        // SAFETY: `place` sized the buffers for this call's shape (the
        // bench computes `count` from the same lengths) on this rank's
        // device; nothing else uses them during the call, which is waited
        // for before returning.
        unsafe { self.enqueue(&call, &stream) }?;
        Ok(self.synchronize(&stream)?)
    }

    fn output<T: KitElement>(&mut self, b: &Buffers) -> Result<Vec<T>, CommError> {
        download(self.stream(), &b.output)
    }
}
