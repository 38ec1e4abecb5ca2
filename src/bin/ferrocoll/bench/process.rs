//! `bench --backend cpu --transport shm|tcp`: this process is one rank of
//! a group started by `ferrocoll launch`; rank 0 prints the table.

use std::sync::Mutex;

use ferrocoll::comm::{Call, CommError, Communicator};
use ferrocoll::conformance::KitElement;
use ferrocoll::process::{ProcessCommunicator, SharedBuffer};

use super::run::{Backend, BenchRank, try_copy};

/// The local rank of a process group: the CPU executor's over shm or TCP,
/// or NCCL's on this process's GPU.
pub(crate) struct Process<'a, C = ProcessCommunicator> {
    pub comm: &'a Mutex<C>,
    pub schedule: Option<&'a ferrocoll::Verified>,
}

impl<C: BenchRank + Send> Backend for Process<'_, C> {
    type Rank = C;

    fn run<R: Send>(
        &self,
        f: &(dyn Fn(&mut C) -> Result<R, CommError> + Sync),
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

    fn one_rank_per_process(&self) -> bool {
        true
    }
}

/// A rank's buffer: in the group's shared heap when it has one (peers
/// read it in place), else private.
pub(crate) enum Held<T: KitElement> {
    Private(Vec<T>),
    Shared(SharedBuffer<T>),
}

impl<T: KitElement> Held<T> {
    fn new(comm: &ProcessCommunicator, from: &[T]) -> Result<Self, CommError> {
        match comm.shared_buffer::<T>(from.len()) {
            Ok(mut shared) => {
                shared.copy_from_slice(from);
                Ok(Held::Shared(shared))
            }
            Err(CommError::Unsupported { .. }) => Ok(Held::Private(try_copy(from, "buffer")?)),
            Err(e) => Err(e),
        }
    }

    fn slice(&self) -> &[T] {
        match self {
            Held::Private(v) => v,
            Held::Shared(s) => s,
        }
    }

    fn slice_mut(&mut self) -> &mut [T] {
        match self {
            Held::Private(v) => v,
            Held::Shared(s) => s,
        }
    }
}

impl BenchRank for ProcessCommunicator {
    type Buffers<T: KitElement> = (Held<T>, Held<T>);

    fn place<T: KitElement>(
        &mut self,
        input: &[T],
        output: Vec<T>,
    ) -> Result<(Held<T>, Held<T>), CommError> {
        Ok((Held::new(self, input)?, Held::new(self, &output)?))
    }

    fn collective<T: KitElement>(
        &mut self,
        (input, output): &mut (Held<T>, Held<T>),
        collective: ferrocoll::Collective,
        op: ferrocoll::ReduceOp,
        in_place: bool,
        _count: usize,
    ) -> Result<(), CommError> {
        let input = (!in_place).then(|| input.slice().into());
        let call = Call::collective(collective, op, input, output.slice_mut().into());
        self.execute(call)
    }

    fn output<T: KitElement>(&mut self, buffers: &(Held<T>, Held<T>)) -> Result<Vec<T>, CommError> {
        try_copy(buffers.1.slice(), "output read back")
    }
}
