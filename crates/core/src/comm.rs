//! The `Communicator` trait a training loop programs against, and its error.

use std::time::Duration;

use thiserror::Error;

use crate::algorithms::AlgorithmError;
use crate::cpu::Reduce;
use crate::types::{Rank, ReduceOp};
use crate::verify::VerifyError;

/// Why a collective call failed.
///
/// After any error other than [`CommError::BufferSize`] and
/// [`CommError::RankOutOfRange`] (which are caught before anything moves)
/// the group is poisoned: every rank's pending and later calls fail too,
/// so no rank waits forever for one that gave up.
#[derive(Debug, Clone, Error)]
pub enum CommError {
    /// A wait outlasted the configured timeout.
    #[error("rank {rank} timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// The rank that gave up.
        rank: Rank,
        /// The configured timeout.
        timeout: Duration,
        /// What it waited for.
        what: String,
    },
    /// Another rank failed (panicked, timed out, or was given bad input).
    #[error("rank {rank} failed: {reason}")]
    PeerFailed {
        /// The rank that failed first.
        rank: Rank,
        /// Its error.
        reason: String,
    },
    /// Ranks disagree on the call (collective, count, type, op, root).
    #[error("call #{call}: rank {rank} called {got}, but rank {other} called {expected}")]
    Mismatch {
        /// The call's sequence number on this communicator.
        call: u64,
        /// The rank that noticed.
        rank: Rank,
        /// The rank it disagrees with.
        other: Rank,
        /// What the other rank called.
        expected: String,
        /// What this rank called.
        got: String,
    },
    /// A buffer has the wrong length for the call.
    #[error("{what} has {got} elements; this call needs {needed}")]
    BufferSize {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length the call needs.
        needed: usize,
    },
    /// A root or peer that is not a rank.
    #[error("rank {rank} is out of range for world size {world_size}")]
    RankOutOfRange {
        /// The rank given.
        rank: Rank,
        /// The group's size.
        world_size: u32,
    },
    /// A rank named itself as the peer of a send or receive.
    #[error("rank {rank} cannot send to or receive from itself")]
    SelfPeer {
        /// The rank.
        rank: Rank,
    },
    /// The collective has no in-place form.
    #[error("{collective} has no in-place form")]
    InPlaceUnsupported {
        /// The collective.
        collective: String,
    },
    /// The executor's backend (CUDA driver, NVRTC, NCCL) is missing or
    /// failed; the message says which and why.
    #[error("backend: {message}")]
    Backend {
        /// What failed.
        message: String,
    },
    /// The algorithm cannot run this call.
    #[error(transparent)]
    Algorithm(#[from] AlgorithmError),
    /// The schedule (a user's, or a bug in a built-in) did not verify.
    #[error(transparent)]
    Verify(#[from] Box<VerifyError>),
    /// A group of no ranks was asked for.
    #[error("a group needs at least one rank (world size 0)")]
    EmptyGroup,
    /// An out-of-place call's input and output overlap (raw-pointer calls
    /// only; safe slices cannot alias).
    #[error(
        "input [{input:#x}, +{input_bytes}) and output [{output:#x}, +{output_bytes}) overlap; pass no input to run in place"
    )]
    Overlap {
        /// Input address.
        input: u64,
        /// Input bytes.
        input_bytes: usize,
        /// Output address.
        output: u64,
        /// Output bytes.
        output_bytes: usize,
    },
}

/// `Err(CommError::Overlap)` if an out-of-place call's buffers share any
/// byte: the executors read inputs while they write outputs, so an overlap
/// would corrupt both. Raw-pointer entry points call this; in-place calls
/// pass no input instead.
pub fn check_disjoint(
    input: u64,
    input_bytes: usize,
    output: u64,
    output_bytes: usize,
) -> Result<(), CommError> {
    let (i_end, o_end) = (
        input.saturating_add(input_bytes as u64),
        output.saturating_add(output_bytes as u64),
    );
    if input_bytes == 0 || output_bytes == 0 || i_end <= output || o_end <= input {
        Ok(())
    } else {
        Err(CommError::Overlap {
            input,
            input_bytes,
            output,
            output_bytes,
        })
    }
}

/// Collective operations on host memory, one communicator per rank.
///
/// Every rank of the group must make the same calls in the same order with
/// the same counts, types, ops and roots; a mismatch is detected and
/// reported as [`CommError::Mismatch`] on the rank that noticed, and as
/// [`CommError::PeerFailed`] on the others. `count` is always the
/// per-rank block: for reduce-scatter the output length, for all-gather the
/// input length, for all-to-all the elements exchanged with each peer.
pub trait Communicator {
    /// This communicator's rank.
    fn rank(&self) -> Rank;

    /// The number of ranks in the group.
    fn world_size(&self) -> u32;

    /// Every rank's `output` becomes the reduction of all `input`s.
    fn all_reduce<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError>;

    /// [`all_reduce`](Self::all_reduce) in place.
    fn all_reduce_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError>;

    /// `input` holds `n` blocks; rank `r`'s `output` becomes the reduction of every rank's block `r`.
    fn reduce_scatter<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError>;

    /// [`reduce_scatter`](Self::reduce_scatter) in place: `buffer` holds
    /// `n` blocks and the result lands in block `rank`.
    fn reduce_scatter_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError>;

    /// `output` (n blocks) gets rank `k`'s `input` in block `k`.
    fn all_gather<T: Reduce>(&mut self, input: &[T], output: &mut [T]) -> Result<(), CommError>;

    /// [`all_gather`](Self::all_gather) in place: this rank's data is already in block `rank`.
    fn all_gather_in_place<T: Reduce>(&mut self, buffer: &mut [T]) -> Result<(), CommError>;

    /// Every rank's `output` becomes `root`'s `input` (other ranks' inputs are ignored).
    fn broadcast<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        root: Rank,
    ) -> Result<(), CommError>;

    /// [`broadcast`](Self::broadcast) in place.
    fn broadcast_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        root: Rank,
    ) -> Result<(), CommError>;

    /// `root`'s `output` becomes the reduction of all inputs; other outputs are untouched.
    fn reduce<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<(), CommError>;

    /// [`reduce`](Self::reduce) in place.
    fn reduce_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<(), CommError>;

    /// Block `k` of `output` becomes block `rank` of rank `k`'s `input`.
    fn all_to_all<T: Reduce>(&mut self, input: &[T], output: &mut [T]) -> Result<(), CommError>;

    /// Send `data` to `peer`; returns once `peer` has received it.
    fn send<T: Reduce>(&mut self, data: &[T], peer: Rank) -> Result<(), CommError>;

    /// Receive exactly `buffer.len()` elements from `peer`.
    fn recv<T: Reduce>(&mut self, buffer: &mut [T], peer: Rank) -> Result<(), CommError>;

    /// Return once every rank has entered the barrier.
    fn barrier(&mut self) -> Result<(), CommError>;
}

/// Run `collective` through the matching [`Communicator`] method.
///
/// Out of place, `input` and `output` are the two buffers. In place, `input`
/// is ignored and `output` is the single buffer, prepared as the
/// collective's in-place call expects (see
/// [`Collective::in_place_alias`](crate::Collective::in_place_alias)); for
/// reduce-scatter it holds all `n` blocks. Send/recv pairs ranks `r → r+1`,
/// even ranks sending first so blocking sends cannot form a cycle. Benches
/// and the conformance kit drive every backend through this one function.
pub fn dispatch<C: Communicator, T: Reduce>(
    comm: &mut C,
    collective: crate::Collective,
    op: ReduceOp,
    in_place: bool,
    input: &[T],
    output: &mut [T],
) -> Result<(), CommError> {
    use crate::Collective as K;
    if in_place {
        return match collective {
            K::AllReduce => comm.all_reduce_in_place(output, op),
            K::ReduceScatter => comm.reduce_scatter_in_place(output, op),
            K::AllGather => comm.all_gather_in_place(output),
            K::Broadcast { root } => comm.broadcast_in_place(output, root),
            K::Reduce { root } => comm.reduce_in_place(output, op, root),
            K::AllToAll | K::SendRecv => Err(CommError::InPlaceUnsupported {
                collective: collective.kind().to_string(),
            }),
        };
    }
    match collective {
        K::AllReduce => comm.all_reduce(input, output, op),
        K::ReduceScatter => comm.reduce_scatter(input, output, op),
        K::AllGather => comm.all_gather(input, output),
        K::Broadcast { root } => comm.broadcast(input, output, root),
        K::Reduce { root } => comm.reduce(input, output, op, root),
        K::AllToAll => comm.all_to_all(input, output),
        K::SendRecv => {
            let (n, rank) = (comm.world_size(), comm.rank());
            if n == 1 {
                output.copy_from_slice(input);
                return Ok(());
            }
            let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
            if rank % 2 == 0 {
                comm.send(input, next)?;
                comm.recv(output, prev)
            } else {
                comm.recv(output, prev)?;
                comm.send(input, next)
            }
        }
    }
}

/// Implement [`Communicator`] for an executor whose collectives all go
/// through one inherent method, so GPU executors (which stage host slices
/// through device memory) do not repeat the trait's fourteen forwarders.
///
/// The type must have inherent methods `comm_rank(&self) -> Rank`,
/// `comm_size(&self) -> u32`, `host_call::<T>(&mut self, Collective,
/// Option<&[T]>, &mut [T], ReduceOp)` (`None` input means in place),
/// `host_send::<T>(&mut self, &[T], Rank)`,
/// `host_recv::<T>(&mut self, &mut [T], Rank)` and `host_barrier(&mut self)`,
/// each returning `Result<_, CommError>`.
#[macro_export]
macro_rules! communicator_via_host_call {
    ($ty:ty) => {
        impl $crate::comm::Communicator for $ty {
            fn rank(&self) -> $crate::Rank {
                self.comm_rank()
            }
            fn world_size(&self) -> u32 {
                self.comm_size()
            }
            fn all_reduce<T: $crate::cpu::Reduce>(
                &mut self,
                input: &[T],
                output: &mut [T],
                op: $crate::ReduceOp,
            ) -> Result<(), $crate::comm::CommError> {
                self.host_call($crate::Collective::AllReduce, Some(input), output, op)
            }
            fn all_reduce_in_place<T: $crate::cpu::Reduce>(
                &mut self,
                buffer: &mut [T],
                op: $crate::ReduceOp,
            ) -> Result<(), $crate::comm::CommError> {
                self.host_call($crate::Collective::AllReduce, None, buffer, op)
            }
            fn reduce_scatter<T: $crate::cpu::Reduce>(
                &mut self,
                input: &[T],
                output: &mut [T],
                op: $crate::ReduceOp,
            ) -> Result<(), $crate::comm::CommError> {
                self.host_call($crate::Collective::ReduceScatter, Some(input), output, op)
            }
            fn reduce_scatter_in_place<T: $crate::cpu::Reduce>(
                &mut self,
                buffer: &mut [T],
                op: $crate::ReduceOp,
            ) -> Result<(), $crate::comm::CommError> {
                self.host_call($crate::Collective::ReduceScatter, None, buffer, op)
            }
            fn all_gather<T: $crate::cpu::Reduce>(
                &mut self,
                input: &[T],
                output: &mut [T],
            ) -> Result<(), $crate::comm::CommError> {
                self.host_call(
                    $crate::Collective::AllGather,
                    Some(input),
                    output,
                    $crate::ReduceOp::Sum,
                )
            }
            fn all_gather_in_place<T: $crate::cpu::Reduce>(
                &mut self,
                buffer: &mut [T],
            ) -> Result<(), $crate::comm::CommError> {
                self.host_call(
                    $crate::Collective::AllGather,
                    None,
                    buffer,
                    $crate::ReduceOp::Sum,
                )
            }
            fn broadcast<T: $crate::cpu::Reduce>(
                &mut self,
                input: &[T],
                output: &mut [T],
                root: $crate::Rank,
            ) -> Result<(), $crate::comm::CommError> {
                self.host_call(
                    $crate::Collective::Broadcast { root },
                    Some(input),
                    output,
                    $crate::ReduceOp::Sum,
                )
            }
            fn broadcast_in_place<T: $crate::cpu::Reduce>(
                &mut self,
                buffer: &mut [T],
                root: $crate::Rank,
            ) -> Result<(), $crate::comm::CommError> {
                self.host_call(
                    $crate::Collective::Broadcast { root },
                    None,
                    buffer,
                    $crate::ReduceOp::Sum,
                )
            }
            fn reduce<T: $crate::cpu::Reduce>(
                &mut self,
                input: &[T],
                output: &mut [T],
                op: $crate::ReduceOp,
                root: $crate::Rank,
            ) -> Result<(), $crate::comm::CommError> {
                self.host_call($crate::Collective::Reduce { root }, Some(input), output, op)
            }
            fn reduce_in_place<T: $crate::cpu::Reduce>(
                &mut self,
                buffer: &mut [T],
                op: $crate::ReduceOp,
                root: $crate::Rank,
            ) -> Result<(), $crate::comm::CommError> {
                self.host_call($crate::Collective::Reduce { root }, None, buffer, op)
            }
            fn all_to_all<T: $crate::cpu::Reduce>(
                &mut self,
                input: &[T],
                output: &mut [T],
            ) -> Result<(), $crate::comm::CommError> {
                self.host_call(
                    $crate::Collective::AllToAll,
                    Some(input),
                    output,
                    $crate::ReduceOp::Sum,
                )
            }
            fn send<T: $crate::cpu::Reduce>(
                &mut self,
                data: &[T],
                peer: $crate::Rank,
            ) -> Result<(), $crate::comm::CommError> {
                self.host_send(data, peer)
            }
            fn recv<T: $crate::cpu::Reduce>(
                &mut self,
                buffer: &mut [T],
                peer: $crate::Rank,
            ) -> Result<(), $crate::comm::CommError> {
                self.host_recv(buffer, peer)
            }
            fn barrier(&mut self) -> Result<(), $crate::comm::CommError> {
                self.host_barrier()
            }
        }
    };
}

/// `Err(RankOutOfRange)` unless `rank` (a root or a peer) is a rank of a
/// group of `world_size`.
pub fn check_rank(rank: Rank, world_size: u32) -> Result<(), CommError> {
    if rank < world_size {
        Ok(())
    } else {
        Err(CommError::RankOutOfRange { rank, world_size })
    }
}

/// The root of `collective`, if it has one, checked with [`check_rank`].
pub fn check_root(collective: crate::Collective, world_size: u32) -> Result<(), CommError> {
    collective
        .root()
        .map_or(Ok(()), |root| check_rank(root, world_size))
}

/// A send/recv peer of rank `me`: a rank of the group, and not `me`.
pub fn check_peer(peer: Rank, me: Rank, world_size: u32) -> Result<(), CommError> {
    check_rank(peer, world_size)?;
    if peer == me {
        return Err(CommError::SelfPeer { rank: peer });
    }
    Ok(())
}

fn buffer_size(what: &'static str, got: usize, needed: usize) -> CommError {
    CommError::BufferSize { what, got, needed }
}

/// The per-rank block count (`count`) of a call on `n` ranks from its
/// buffer lengths (`in_len` is `None` in place), or the
/// [`CommError::BufferSize`] that explains which buffer is off. Executors
/// whose calls take whole slices share this one check.
pub fn block_count(
    collective: crate::Collective,
    n: usize,
    in_len: Option<usize>,
    out_len: usize,
) -> Result<usize, CommError> {
    use crate::Collective as C;
    let whole = |len: usize, what: &'static str| {
        if len % n == 0 {
            Ok(len / n)
        } else {
            Err(buffer_size(what, len, len.div_ceil(n) * n))
        }
    };
    match (collective, in_len) {
        (C::ReduceScatter, None) => whole(out_len, "in-place reduce-scatter buffer"),
        (C::AllGather, None) => whole(out_len, "in-place all-gather buffer"),
        (C::ReduceScatter, Some(i)) => {
            if i != out_len * n {
                return Err(buffer_size("reduce-scatter input", i, out_len * n));
            }
            Ok(out_len)
        }
        (C::AllGather, Some(i)) => {
            if out_len != i * n {
                return Err(buffer_size("all-gather output", out_len, i * n));
            }
            Ok(i)
        }
        (C::AllToAll, Some(i)) => {
            if out_len != i {
                return Err(buffer_size("all-to-all output", out_len, i));
            }
            whole(i, "all-to-all input")
        }
        (_, Some(i)) if i != out_len => Err(buffer_size("input", i, out_len)),
        _ => Ok(out_len),
    }
}
