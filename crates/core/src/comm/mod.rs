//! The [`Communicator`] trait a training loop programs against, the
//! [`Call`] every backend implements it through, and [`CommError`].
//!
//! A backend implements three methods: [`rank`](Communicator::rank),
//! [`world_size`](Communicator::world_size) and
//! [`execute`](Communicator::execute), which takes one complete [`Call`]
//! (operation plus type-erased buffers). Every typed collective —
//! `all_reduce`, `broadcast`, `send`, ... — is a provided method of
//! [`CommunicatorExt`] that builds the `Call`, so backends never repeat
//! fourteen forwarders. `Communicator` is object-safe, and the typed
//! methods work on `&mut dyn Communicator` and `Box<dyn Communicator>` as on
//! a concrete communicator.
//!
//! ```
//! use ferrocoll_core::comm::{Call, Communicator, CommunicatorExt};
//! use ferrocoll_core::cpu::{self, CpuConfig};
//! use ferrocoll_core::{Collective, ReduceOp};
//!
//! let sums = cpu::run(2, &CpuConfig::default(), |comm| {
//!     let backend: &mut dyn Communicator = comm; // chosen at run time
//!     let mut x = vec![1.0f32; 4];
//!     backend.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
//!     // The same call, spelled out:
//!     backend.execute(Call::collective(Collective::AllReduce, ReduceOp::Sum, None, (&mut x[..]).into()))?;
//!     Ok(x[0])
//! });
//! assert!(sums.iter().all(|s| *s.as_ref().unwrap() == 4.0));
//! ```

mod call;
mod error;
mod lend;
mod nonblocking;
mod p2p;
mod planner;
mod planning;
pub mod split;
mod vector;
mod watch;
mod work;

pub use call::{Call, Checked, HostSlice, HostSliceMut, Operation};
pub use error::{
    BackendError, CommError, check_disjoint, check_peer, check_rank, check_root, printable,
};
pub use lend::{Lender, LentBuffer, LentMemory};
pub use nonblocking::{AsyncCommunicator, P2pBuffers};
pub use p2p::{P2pOp, send_recv_batch};
pub use planner::{Planned, Planner, PlannerSettings, link_slots};
pub use planning::{DEFAULT_TIMEOUT, Executor, Planning};
pub use watch::kernel_checkpoint;
pub use work::{Failed, Work};

use crate::kernels::Reduce;
use crate::types::{Collective, Rank, ReduceOp};

/// Collective operations on host memory, one communicator per rank.
///
/// Every rank of the group must make the same calls in the same order with
/// the same counts, types, ops and roots; a mismatch is detected before
/// any rank writes into another's memory and reported as
/// [`CommError::Mismatch`] on every rank (threads and processes; the NCCL
/// backend cannot check). `count` is always the
/// per-rank block: for reduce-scatter the output length, for all-gather the
/// input length, for all-to-all the elements exchanged with each peer.
pub trait Communicator {
    /// This communicator's rank.
    fn rank(&self) -> Rank;

    /// The number of ranks in the group.
    fn world_size(&self) -> u32;

    /// Run `call` to completion on this rank: the one entry point every
    /// backend implements.
    fn execute(&mut self, call: Call<'_>) -> Result<(), CommError>;

    /// Return once every rank has entered the barrier.
    fn barrier(&mut self) -> Result<(), CommError> {
        self.execute(Call::barrier())
    }

    /// Split the group, as `MPI_Comm_split` and `ncclCommSplit` do: every
    /// rank calls this; ranks that pass the same `color` form a new group,
    /// ranked by `key` and then by their rank here, and each gets its
    /// communicator; a rank that passes `None` takes part and gets none.
    /// The new group is independent of this one: both can be used at once
    /// (from different threads, or through [`AsyncCommunicator`]s).
    /// Backends that cannot re-form a group return
    /// [`CommError::Unsupported`].
    fn split(
        &mut self,
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<Box<dyn Communicator + Send>>, CommError> {
        let _ = (color, key);
        Err(CommError::Unsupported {
            what: "this backend cannot split its communicator".into(),
        })
    }

    /// Fail the group now: this rank's pending call and every peer's
    /// return an error instead of waiting. By default through
    /// [`aborter`](Self::aborter); backends without a way to abort do
    /// nothing.
    fn abort(&mut self) {
        if let Some(abort) = self.aborter() {
            abort("aborted");
        }
    }

    /// A function that aborts this rank's group from any thread, even
    /// while a call is blocked (what [`AsyncCommunicator::abort`] uses);
    /// it returns once no peer can still be reading or writing this
    /// rank's buffers. `None` where the backend has none.
    fn aborter(&self) -> Option<Aborter> {
        None
    }

    /// Memory this communicator's peers can read in place when a call
    /// uses it, for buffers kept across many calls (see [`LentBuffer`]):
    /// the process executor's shared heap. `None` where the backend has
    /// no such memory; ordinary memory then works the same, with copies.
    fn lender(&self) -> Option<Lender> {
        None
    }

    /// Where an [`AsyncCommunicator`] tells this rank's flight recorder
    /// about calls it queued and has not started yet (the "queued" state
    /// of [`crate::trace`]). `None` where the backend records no calls.
    fn call_queue(&self) -> Option<CallQueueRef> {
        None
    }
}

/// A shared [`CallQueue`].
pub type CallQueueRef = std::sync::Arc<dyn CallQueue>;

/// Calls started on an [`AsyncCommunicator`] wait in its queue before its
/// progress thread runs them; a backend's flight recorder shows them.
pub trait CallQueue: Send + Sync {
    /// A call described by `what` joined the queue; returns its token.
    fn queued(&self, what: String) -> u64;
    /// The progress thread starts the queued call `token` (`None`: a job
    /// nothing recorded): the next call the backend records began queued
    /// (at the time the token was taken), and the queue forgets it.
    fn started(&self, token: Option<u64>);
}

/// The text of a panic's payload (`panic!` with a literal or a format).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// Aborts a group from any thread (see [`Communicator::aborter`]); the
/// argument is the reason peers report.
pub type Aborter = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

/// The typed collectives, each a provided method over
/// [`Communicator::execute`], for every communicator — concrete ones,
/// `&mut dyn Communicator` and `Box<dyn Communicator>` alike (a blanket
/// implementation, so they work on trait objects, where methods of the
/// object-safe trait itself could not be generic).
pub trait CommunicatorExt: Communicator {
    /// Every rank's `output` becomes the reduction of all `input`s.
    fn all_reduce<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.execute(Call::collective(
            Collective::AllReduce,
            op,
            Some(input.into()),
            output.into(),
        ))
    }

    /// [`all_reduce`](Self::all_reduce) in place.
    fn all_reduce_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.execute(Call::collective(
            Collective::AllReduce,
            op,
            None,
            buffer.into(),
        ))
    }

    /// `input` holds `n` blocks; rank `r`'s `output` becomes the reduction of every rank's block `r`.
    fn reduce_scatter<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.execute(Call::collective(
            Collective::ReduceScatter,
            op,
            Some(input.into()),
            output.into(),
        ))
    }

    /// [`reduce_scatter`](Self::reduce_scatter) in place: `buffer` holds
    /// `n` blocks and the result lands in block `rank`.
    fn reduce_scatter_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.execute(Call::collective(
            Collective::ReduceScatter,
            op,
            None,
            buffer.into(),
        ))
    }

    /// `output` (n blocks) gets rank `k`'s `input` in block `k`.
    fn all_gather<T: Reduce>(&mut self, input: &[T], output: &mut [T]) -> Result<(), CommError> {
        self.execute(Call::collective(
            Collective::AllGather,
            ReduceOp::Sum,
            Some(input.into()),
            output.into(),
        ))
    }

    /// [`all_gather`](Self::all_gather) in place: this rank's data is already in block `rank`.
    fn all_gather_in_place<T: Reduce>(&mut self, buffer: &mut [T]) -> Result<(), CommError> {
        self.execute(Call::collective(
            Collective::AllGather,
            ReduceOp::Sum,
            None,
            buffer.into(),
        ))
    }

    /// Every rank's `output` becomes `root`'s `input` (other ranks' inputs are ignored).
    fn broadcast<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        root: Rank,
    ) -> Result<(), CommError> {
        let c = Collective::Broadcast { root };
        self.execute(Call::collective(
            c,
            ReduceOp::Sum,
            Some(input.into()),
            output.into(),
        ))
    }

    /// [`broadcast`](Self::broadcast) in place.
    fn broadcast_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        root: Rank,
    ) -> Result<(), CommError> {
        let c = Collective::Broadcast { root };
        self.execute(Call::collective(c, ReduceOp::Sum, None, buffer.into()))
    }

    /// `root`'s `output` becomes the reduction of all inputs; other outputs are untouched.
    fn reduce<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<(), CommError> {
        let c = Collective::Reduce { root };
        self.execute(Call::collective(c, op, Some(input.into()), output.into()))
    }

    /// [`reduce`](Self::reduce) in place.
    fn reduce_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<(), CommError> {
        self.execute(Call::collective(
            Collective::Reduce { root },
            op,
            None,
            buffer.into(),
        ))
    }

    /// Block `k` of `output` becomes block `rank` of rank `k`'s `input`.
    fn all_to_all<T: Reduce>(&mut self, input: &[T], output: &mut [T]) -> Result<(), CommError> {
        self.execute(Call::collective(
            Collective::AllToAll,
            ReduceOp::Sum,
            Some(input.into()),
            output.into(),
        ))
    }

    /// Send `data` to `peer`; returns once `peer` has received it.
    fn send<T: Reduce>(&mut self, data: &[T], peer: Rank) -> Result<(), CommError> {
        self.execute(Call::send(data.into(), peer))
    }

    /// Receive exactly `buffer.len()` elements of `T` from `peer`.
    fn recv<T: Reduce>(&mut self, buffer: &mut [T], peer: Rank) -> Result<(), CommError> {
        self.execute(Call::recv(buffer.into(), peer))
    }

    /// Sends and receives as one call that cannot deadlock, whatever the
    /// pattern (see [`send_recv_batch`]).
    fn send_recv_batch(&mut self, ops: Vec<P2pOp<'_>>) -> Result<(), CommError> {
        send_recv_batch(self, ops)
    }

    /// `root`'s `output` (`n` blocks of `input.len()`) gets rank `k`'s
    /// `input` in block `k`; other ranks' `output` is not touched (pass `&mut []`).
    fn gather<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        root: Rank,
    ) -> Result<(), CommError> {
        vector::gather(self, input, output, root)
    }

    /// Rank `k`'s `output` gets block `k` of `root`'s `input` (`n` blocks
    /// of `output.len()`); other ranks' `input` is ignored (pass `&[]`).
    fn scatter<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        root: Rank,
    ) -> Result<(), CommError> {
        vector::scatter(self, input, output, root)
    }

    /// All-gather of uneven blocks: rank `k` contributes `counts[k]`
    /// elements and every `output` (their sum) holds all blocks in rank order.
    fn all_gather_v<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        counts: &[usize],
    ) -> Result<(), CommError> {
        vector::all_gather_v(self, input, output, counts)
    }

    /// All-to-all of uneven blocks: `send_counts[k]` elements of `input`
    /// (blocks in rank order) go to rank `k`; `recv_counts[k]` elements of
    /// `output` come from rank `k`.
    fn all_to_all_v<T: Reduce>(
        &mut self,
        input: &[T],
        send_counts: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        vector::all_to_all_v(self, input, send_counts, output, recv_counts)
    }
}

impl<C: Communicator + ?Sized> CommunicatorExt for C {}

impl<C: Communicator + ?Sized> Communicator for &mut C {
    fn rank(&self) -> Rank {
        (**self).rank()
    }

    fn world_size(&self) -> u32 {
        (**self).world_size()
    }

    fn execute(&mut self, call: Call<'_>) -> Result<(), CommError> {
        (**self).execute(call)
    }

    fn split(
        &mut self,
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<Box<dyn Communicator + Send>>, CommError> {
        (**self).split(color, key)
    }

    fn abort(&mut self) {
        (**self).abort()
    }

    fn aborter(&self) -> Option<Aborter> {
        (**self).aborter()
    }

    fn lender(&self) -> Option<Lender> {
        (**self).lender()
    }

    fn call_queue(&self) -> Option<CallQueueRef> {
        (**self).call_queue()
    }
}

impl<C: Communicator + ?Sized> Communicator for Box<C> {
    fn rank(&self) -> Rank {
        (**self).rank()
    }

    fn world_size(&self) -> u32 {
        (**self).world_size()
    }

    fn execute(&mut self, call: Call<'_>) -> Result<(), CommError> {
        (**self).execute(call)
    }

    fn split(
        &mut self,
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<Box<dyn Communicator + Send>>, CommError> {
        (**self).split(color, key)
    }

    fn abort(&mut self) {
        (**self).abort()
    }

    fn aborter(&self) -> Option<Aborter> {
        (**self).aborter()
    }

    fn lender(&self) -> Option<Lender> {
        (**self).lender()
    }

    fn call_queue(&self) -> Option<CallQueueRef> {
        (**self).call_queue()
    }
}

/// nccl-tests' send/recv collective as point-to-point pairs: every rank
/// sends `input` to rank `r + 1` and receives rank `r − 1`'s into
/// `output`, even ranks sending first so blocking sends cannot form a
/// cycle. For backends that run no schedule for it.
pub fn send_recv_by_pairs<C: Communicator + ?Sized>(
    comm: &mut C,
    input: HostSlice<'_>,
    mut output: HostSliceMut<'_>,
) -> Result<(), CommError> {
    let (n, rank) = (comm.world_size(), comm.rank());
    if input.dtype() != output.dtype() {
        return Err(CommError::DtypeMismatch {
            input: input.dtype(),
            output: output.dtype(),
        });
    }
    if input.len() != output.len() {
        return Err(CommError::BufferSize {
            what: "send-recv output",
            got: output.len(),
            needed: input.len(),
        });
    }
    if n == 1 {
        output.as_bytes_mut().copy_from_slice(input.as_bytes());
        return Ok(());
    }
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    if rank % 2 == 0 {
        comm.execute(Call::send(input, next))?;
        comm.execute(Call::recv(output, prev))
    } else {
        comm.execute(Call::recv(output.reborrow(), prev))?;
        comm.execute(Call::send(input, next))
    }
}
