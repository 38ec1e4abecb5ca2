//! `bench --backend cuda|nccl --from-env`: this process is one rank of a
//! GPU group `ferrocoll launch` started, one GPU each; rank 0 prints the
//! table.

use std::sync::Mutex;

use ferrocoll::comm::{CommError, Communicator};
use ferrocoll::cpu::CpuConfig;
use ferrocoll::device::DeviceCommunicator;
use ferrocoll::topo::probe::membw::MemoryBandwidth;

use super::BenchArgs;
use super::device::{DeviceRank, device_bandwidth};
use super::process::Process;
use super::row::Row;
use super::target::{Sweep, Target};

/// The header's lines of a backend.
pub(crate) type Describe = fn(&BenchArgs, &CpuConfig, &str) -> Vec<String>;

/// This process's rank of a launched GPU group.
pub(crate) struct Launched<C> {
    comm: Mutex<C>,
    describe: Describe,
}

impl<C> Launched<C> {
    /// The rank `comm`, described by `describe`.
    pub(crate) fn new(comm: C, describe: Describe) -> Self {
        Launched {
            comm: Mutex::new(comm),
            describe,
        }
    }
}

impl<C> Target for Launched<C>
where
    C: DeviceRank + Communicator + Send,
    CommError: From<<C as DeviceCommunicator>::Error>,
{
    fn prints(&self) -> bool {
        self.comm
            .lock()
            .map_or(true, |c| DeviceCommunicator::rank(&*c) == 0)
    }

    fn describe(&self, args: &BenchArgs, config: &CpuConfig, algorithm: &str) -> Vec<String> {
        (self.describe)(args, config, algorithm)
    }

    fn memory_bandwidth(&self) -> Result<MemoryBandwidth, String> {
        let comm = self
            .comm
            .lock()
            .map_err(|_| "the communicator is poisoned")?;
        device_bandwidth(DeviceCommunicator::context(&*comm).ordinal())
    }

    fn run_section(&self, sweep: &Sweep) -> Result<Vec<Row>, String> {
        let backend = Process {
            comm: &self.comm,
            schedule: None,
        };
        sweep.on(&backend)
    }
}
