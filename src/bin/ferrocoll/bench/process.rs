//! `bench --backend cpu --transport shm|tcp`: this process is one rank of
//! a group started by `ferrocoll launch`; rank 0 prints the table.

use std::sync::Mutex;

use ferrocoll::comm::{CommError, Communicator, CommunicatorExt};
use ferrocoll::process::ProcessCommunicator;

use super::run::{Backend, host_bench_rank};

/// The local rank of a process group.
pub(crate) struct Process<'a> {
    pub comm: &'a Mutex<ProcessCommunicator>,
    pub schedule: Option<&'a ferrocoll::Verified>,
}

impl Backend for Process<'_> {
    type Rank = ProcessCommunicator;

    fn run<R: Send>(
        &self,
        f: &(dyn Fn(&mut ProcessCommunicator) -> Result<R, CommError> + Sync),
    ) -> Result<Vec<Result<R, CommError>>, String> {
        let mut comm = self
            .comm
            .lock()
            .map_err(|_| "the communicator is poisoned")?;
        Ok(vec![f(&mut comm)])
    }

    fn schedule(&self) -> Option<&ferrocoll::Verified> {
        self.schedule
    }

    fn first_rank(&self) -> u32 {
        self.comm.lock().map_or(0, |c| c.rank())
    }
}

host_bench_rank!(
    ProcessCommunicator,
    fn total_wrong(&mut self, mine: [u64; 2]) -> Result<Option<[u64; 2]>, CommError> {
        let mut total = mine;
        self.all_reduce_in_place(&mut total, ferrocoll::ReduceOp::Sum)?;
        Ok(Some(total))
    }
);
