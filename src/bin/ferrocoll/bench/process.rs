//! `bench --backend cpu --transport shm|tcp`: this process is one rank of
//! a group started by `ferrocoll launch`; rank 0 prints the table.

use std::sync::Mutex;

use ferrocoll::comm::{Call, CommError, Communicator, CommunicatorExt};
use ferrocoll::conformance::KitElement;
use ferrocoll::process::{ProcessCommunicator, SharedBuffer};

use super::run::{Backend, BenchRank, try_copy};

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

    fn total_wrong(&mut self, mine: [u64; 2]) -> Result<Option<[u64; 2]>, CommError> {
        let mut total = mine;
        self.all_reduce_in_place(&mut total, ferrocoll::ReduceOp::Sum)?;
        Ok(Some(total))
    }
}
