//! `bench --backend cuda`: the same sections on the CUDA executor, with
//! buffers in device memory (placed once per size, outside the timing).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use ferrocoll::comm::CommError;
use ferrocoll::conformance::KitElement;
use ferrocoll::cpu::CpuConfig;
use ferrocoll::cuda::{CudaCommunicator, CudaConfig, probe};
use ferrocoll::{Collective, ReduceOp};

use ferrocoll::cuda::GpuProbe;
use ferrocoll::topo::probe::membw::MemoryBandwidth;
use ferrocoll::topo::probe::{LinkProbe, ProbeOptions};

use super::device::{bytes_of, download, sync, upload};
use super::run::{Backend, BenchRank};

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

/// A CUDA executor's settings for one section: the bench's timeout,
/// algorithm, channels and schedule.
pub(crate) fn cuda_config(cpu: &CpuConfig) -> CudaConfig {
    CudaConfig {
        timeout: cpu.timeout,
        algorithm: cpu.algorithm,
        channels: cpu.channels,
        schedule: cpu.schedule.clone(),
        ..CudaConfig::default()
    }
}

/// The CUDA executor for one section.
pub(crate) struct Cuda {
    devices: Vec<usize>,
    config: CudaConfig,
}

impl Cuda {
    pub(crate) fn new(devices: Vec<usize>, cpu: &CpuConfig, _ranks: u32) -> Cuda {
        Cuda {
            devices,
            config: cuda_config(cpu),
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
        self.config.schedule.as_deref()
    }
}

/// A call's buffers in device memory, as bytes.
pub(crate) struct DeviceBuffers {
    stream: Arc<CudaStream>,
    input: CudaSlice<u8>,
    output: CudaSlice<u8>,
}

impl BenchRank for CudaCommunicator {
    type Buffers<T: KitElement> = DeviceBuffers;

    fn place<T: KitElement>(
        &mut self,
        input: &[T],
        output: Vec<T>,
    ) -> Result<DeviceBuffers, CommError> {
        let stream = self.context().default_stream();
        let buffers = DeviceBuffers {
            input: upload(&stream, bytes_of(input))?,
            output: upload(&stream, bytes_of(&output))?,
            stream,
        };
        sync(&buffers.stream)?;
        Ok(buffers)
    }

    fn collective<T: KitElement>(
        &mut self,
        b: &mut DeviceBuffers,
        collective: Collective,
        op: ReduceOp,
        in_place: bool,
        count: usize,
    ) -> Result<(), CommError> {
        let (input, _i) = b.input.device_ptr(&b.stream);
        let (output, _o) = b.output.device_ptr(&b.stream);
        let input = (!in_place).then_some(input);
        // SAFETY: `place` sized the buffers for this call's shape (the
        // bench computes `count` from the same lengths), on this rank's
        // device, and nothing else uses them during the call.
        unsafe { self.collective_raw(collective, T::DATA_TYPE, count, input, output, op) }
    }

    fn output<T: KitElement>(&mut self, b: &DeviceBuffers) -> Result<Vec<T>, CommError> {
        download(&b.stream, &b.output)
    }
}
