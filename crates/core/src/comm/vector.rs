//! Gather, scatter, all-gather-v and all-to-all-v, built from the
//! agreed collectives and batched point-to-point on any backend.
//!
//! Agreement before data holds here too: every rank first publishes a
//! description of its call (what, element type, root, lengths) through an
//! all-gather on the group, and compares all of them before any byte of
//! data moves. Since every rank sees every description, a disagreement is
//! found by all ranks at once, each returns [`CommError::Disagreement`],
//! and the group stays usable. Lengths that only make sense on some ranks
//! (a root's output, an all-to-all-v's counts) are checked locally first,
//! like any call's arguments.

use super::call::{HostSlice, HostSliceMut};
use super::error::{CommError, check_rank};
use super::p2p::{P2pOp, send_recv_batch};
use super::{Communicator, CommunicatorExt};
use crate::kernels::Reduce;
use crate::plan::stable_hash;
use crate::types::{DataType, Rank, ReduceOp};

/// Which call a description is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gather = 1,
    Scatter = 2,
    AllGatherV = 3,
    AllToAllV = 4,
}

impl Kind {
    fn name(code: u64) -> &'static str {
        match code {
            1 => "gather",
            2 => "scatter",
            3 => "all-gather-v",
            4 => "all-to-all-v",
            _ => "an unknown call",
        }
    }
}

/// Set in a description's kind by a rank whose arguments failed its checks.
const INVALID: u64 = 1 << 63;

/// A call's description, the same on every rank that agrees with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Description {
    kind: u64,
    dtype: u64,
    root: u64,
    count: u64,
    /// The stable hash of a count list (all-gather-v), else 0.
    digest: u64,
}

impl Description {
    fn new(kind: Kind, dtype: DataType, root: Rank, count: usize, digest: u64) -> Self {
        let dtype = DataType::ALL.iter().position(|d| *d == dtype).unwrap_or(0);
        Description {
            kind: kind as u64,
            dtype: dtype as u64,
            root: u64::from(root),
            count: count as u64,
            digest,
        }
    }

    /// The same description, marked as a call whose arguments failed.
    fn invalid(mut self) -> Self {
        self.kind |= INVALID;
        self
    }

    fn words(&self) -> [u64; 5] {
        [self.kind, self.dtype, self.root, self.count, self.digest]
    }

    fn from_words(w: &[u64]) -> Self {
        Description {
            kind: w[0],
            dtype: w[1],
            root: w[2],
            count: w[3],
            digest: w[4],
        }
    }

    fn describe(&self) -> String {
        let dtype = DataType::ALL
            .get(self.dtype as usize)
            .map_or("?".to_owned(), |d| d.to_string());
        if self.kind & INVALID != 0 {
            return format!(
                "{} with invalid arguments",
                Kind::name(self.kind & !INVALID)
            );
        }
        let mut s = format!("{} of {dtype}", Kind::name(self.kind));
        match self.kind {
            1 | 2 => s += &format!(", root {}, {} elements per rank", self.root, self.count),
            3 => {
                s += &format!(
                    ", {} elements in all (counts {:#018x})",
                    self.count, self.digest
                )
            }
            _ => {}
        }
        s
    }
}

/// Publish `mine` — marked invalid when this rank's own arguments failed
/// their checks (`local`) — and compare it with every rank's description:
/// every rank takes part even with bad arguments, so all of them fail the
/// same call rather than some waiting for the rest.
fn agree<C: Communicator + ?Sized>(
    comm: &mut C,
    mine: Description,
    local: Result<(), CommError>,
) -> Result<(), CommError> {
    let n = comm.world_size() as usize;
    let published = if local.is_ok() { mine } else { mine.invalid() };
    let mut all = vec![0u64; 5 * n];
    let words = published.words();
    super::call::exchange(comm, crate::types::Purpose::Describe, &words, &mut all)?;
    local?;
    for (other, words) in all.chunks_exact(5).enumerate() {
        let theirs = Description::from_words(words);
        if theirs != mine {
            return Err(CommError::Disagreement {
                rank: comm.rank(),
                other: other as Rank,
                mine: mine.describe(),
                theirs: theirs.describe(),
            });
        }
    }
    Ok(())
}

fn expect_len(what: &'static str, got: usize, needed: usize) -> Result<(), CommError> {
    if got == needed {
        Ok(())
    } else {
        Err(CommError::BufferSize { what, got, needed })
    }
}

/// The end of every block of `counts`, checked for overflow.
fn offsets(counts: &[usize]) -> Result<Vec<usize>, CommError> {
    let mut at = 0usize;
    let mut starts = Vec::with_capacity(counts.len() + 1);
    starts.push(0);
    for &c in counts {
        at = at.checked_add(c).ok_or_else(|| CommError::Capacity {
            what: "the counts add up to more elements than memory can address".into(),
        })?;
        starts.push(at);
    }
    Ok(starts)
}

/// What gather and scatter check and agree on before moving data: the
/// root, the root's `n`-block buffer and every rank's description. False
/// when blocks are empty and nothing is left to move.
fn rooted<C, T>(
    comm: &mut C,
    kind: Kind,
    root: Rank,
    block: usize,
    root_len: usize,
    what: &'static str,
) -> Result<bool, CommError>
where
    C: Communicator + ?Sized,
    T: Reduce,
{
    let (rank, n) = (comm.rank(), comm.world_size());
    let local = check_rank(root, n).and_then(|()| match rank == root {
        true => expect_len(what, root_len, block.saturating_mul(n as usize)),
        false => Ok(()),
    });
    let mine = Description::new(kind, T::DATA_TYPE, root, block, 0);
    agree(comm, mine, local)?;
    Ok(block > 0)
}

/// Gather: `root`'s `output` (`n` blocks of `input.len()`) gets rank
/// `k`'s `input` in block `k`; other ranks' outputs are untouched (pass an
/// empty slice).
pub(super) fn gather<C, T>(
    comm: &mut C,
    input: &[T],
    output: &mut [T],
    root: Rank,
) -> Result<(), CommError>
where
    C: Communicator + ?Sized,
    T: Reduce,
{
    let (rank, len) = (comm.rank(), input.len());
    let root_len = output.len();
    if !rooted::<C, T>(comm, Kind::Gather, root, len, root_len, "gather output")? {
        return Ok(());
    }
    if rank != root {
        return send_recv_batch(comm, vec![P2pOp::send(input, root)]);
    }
    let mut blocks: Vec<&mut [T]> = output.chunks_mut(len).collect();
    blocks[rank as usize].copy_from_slice(input);
    let ops = blocks
        .into_iter()
        .enumerate()
        .filter(|(k, _)| *k as Rank != rank)
        .map(|(k, b)| P2pOp::recv(b, k as Rank))
        .collect();
    send_recv_batch(comm, ops)
}

/// Scatter: rank `k`'s `output` gets block `k` of `root`'s `input` (`n`
/// blocks of `output.len()`); other ranks' inputs are ignored (pass an
/// empty slice).
pub(super) fn scatter<C, T>(
    comm: &mut C,
    input: &[T],
    output: &mut [T],
    root: Rank,
) -> Result<(), CommError>
where
    C: Communicator + ?Sized,
    T: Reduce,
{
    let (rank, len) = (comm.rank(), output.len());
    let root_len = input.len();
    if !rooted::<C, T>(comm, Kind::Scatter, root, len, root_len, "scatter input")? {
        return Ok(());
    }
    if rank != root {
        return send_recv_batch(comm, vec![P2pOp::recv(output, root)]);
    }
    let blocks: Vec<&[T]> = input.chunks(len).collect();
    output.copy_from_slice(blocks[rank as usize]);
    let ops = blocks
        .into_iter()
        .enumerate()
        .filter(|(k, _)| *k as Rank != rank)
        .map(|(k, b)| P2pOp::send(b, k as Rank))
        .collect();
    send_recv_batch(comm, ops)
}

/// All-gather with a length per rank: rank `k` contributes `counts[k]`
/// elements, and every `output` (their sum) gets them in rank order.
pub(super) fn all_gather_v<C, T>(
    comm: &mut C,
    input: &[T],
    output: &mut [T],
    counts: &[usize],
) -> Result<(), CommError>
where
    C: Communicator + ?Sized,
    T: Reduce,
{
    let (rank, n) = (comm.rank() as usize, comm.world_size() as usize);
    let total = offsets(counts).map(|ends| ends[ends.len() - 1]);
    let local = expect_len("all-gather-v counts", counts.len(), n)
        .and_then(|()| expect_len("all-gather-v input", input.len(), counts[rank]))
        .and_then(|()| expect_len("all-gather-v output", output.len(), total.clone()?));
    let digest = stable_hash(&counts);
    let mine = Description::new(
        Kind::AllGatherV,
        T::DATA_TYPE,
        0,
        *total.as_ref().unwrap_or(&0),
        digest,
    );
    agree(comm, mine, local)?;
    let mut ops = Vec::with_capacity(2 * n);
    let mut rest = output;
    for (k, &count) in counts.iter().enumerate() {
        let (block, tail) = rest.split_at_mut(count);
        rest = tail;
        if k == rank {
            block.copy_from_slice(input);
        } else if count > 0 {
            ops.push(P2pOp::recv(block, k as Rank));
        }
        if k != rank && !input.is_empty() {
            ops.push(P2pOp::send(input, k as Rank));
        }
    }
    send_recv_batch(comm, ops)
}

/// All-to-all with lengths per pair: `send_counts[k]` elements of `input`
/// (in rank order) go to rank `k`, and `recv_counts[k]` elements of
/// `output` come from it. Rank `i`'s `send_counts[j]` must equal rank
/// `j`'s `recv_counts[i]`.
pub(super) fn all_to_all_v<C, T>(
    comm: &mut C,
    input: &[T],
    send_counts: &[usize],
    output: &mut [T],
    recv_counts: &[usize],
) -> Result<(), CommError>
where
    C: Communicator + ?Sized,
    T: Reduce,
{
    let (rank, n) = (comm.rank() as usize, comm.world_size() as usize);
    let checked = || {
        expect_len("all-to-all-v send counts", send_counts.len(), n)?;
        expect_len("all-to-all-v receive counts", recv_counts.len(), n)?;
        let send_ends = offsets(send_counts)?;
        let recv_ends = offsets(recv_counts)?;
        expect_len("all-to-all-v input", input.len(), send_ends[n])?;
        expect_len("all-to-all-v output", output.len(), recv_ends[n])?;
        Ok(send_ends)
    };
    let send_ends = checked();
    let mine = Description::new(Kind::AllToAllV, T::DATA_TYPE, 0, 0, 0);
    agree(
        comm,
        mine,
        send_ends.as_ref().map(drop).map_err(Clone::clone),
    )?;
    let send_ends = send_ends?;
    check_counts(comm, send_counts, recv_counts)?;
    let mut ops = Vec::with_capacity(2 * n);
    let mut rest = output;
    for k in 0..n {
        let (block, tail) = rest.split_at_mut(recv_counts[k]);
        rest = tail;
        let sent = &input[send_ends[k]..send_ends[k + 1]];
        if k == rank {
            block.copy_from_slice(sent);
            continue;
        }
        if !block.is_empty() {
            ops.push(P2pOp::recv(block, k as Rank));
        }
        if !sent.is_empty() {
            ops.push(P2pOp::send(sent, k as Rank));
        }
    }
    send_recv_batch(comm, ops)
}

/// Check every pair's counts: an all-to-all tells each rank what every
/// peer will send it, and an all-reduce tells every rank the first pair
/// that disagrees, so all ranks fail together (with `n` words per rank
/// rather than the whole `n × n` matrix).
fn check_counts<C: Communicator + ?Sized>(
    comm: &mut C,
    send_counts: &[usize],
    recv_counts: &[usize],
) -> Result<(), CommError> {
    let (rank, n) = (comm.rank() as usize, comm.world_size() as usize);
    let sends: Vec<u64> = send_counts.iter().map(|&c| c as u64).collect();
    let mut incoming = vec![0u64; n];
    comm.execute(super::Call::collective(
        crate::types::Collective::AllToAll,
        ReduceOp::Sum,
        Some(HostSlice::from(&sends[..])),
        HostSliceMut::from(&mut incoming[..]),
    ))?;
    let first_bad = (0..n).find(|&k| incoming[k] != recv_counts[k] as u64);
    let mut code = [first_bad.map_or(u64::MAX, |k| (rank * n + k) as u64)];
    comm.all_reduce_in_place(&mut code, ReduceOp::Min)?;
    if code[0] == u64::MAX {
        return Ok(());
    }
    let (receiver, sender) = ((code[0] / n as u64) as usize, (code[0] % n as u64) as usize);
    let (mine, theirs) = if receiver == rank {
        (
            format!(
                "an all-to-all-v receiving {} elements from rank {sender}",
                recv_counts[sender]
            ),
            format!(
                "an all-to-all-v sending {} elements to rank {rank}",
                incoming[sender]
            ),
        )
    } else {
        (
            "an all-to-all-v".to_owned(),
            format!(
                "an all-to-all-v whose receive count from rank {sender} is not what rank {sender} sends"
            ),
        )
    };
    let other = if receiver == rank { sender } else { receiver };
    Err(CommError::Disagreement {
        rank: rank as Rank,
        other: other as Rank,
        mine,
        theirs,
    })
}

#[cfg(test)]
mod tests {
    use super::{Description, Kind, offsets};
    use crate::plan::stable_hash;
    use crate::types::DataType;

    #[test]
    fn descriptions_name_what_differs() {
        let d = Description::new(Kind::Gather, DataType::F32, 2, 7, 0);
        assert_eq!(d.describe(), "gather of f32, root 2, 7 elements per rank");
        assert_ne!(stable_hash(&[1, 2]), stable_hash(&[2, 1]));
        assert!(offsets(&[usize::MAX, 1]).is_err());
        assert_eq!(offsets(&[2, 0, 3]).unwrap(), vec![0, 2, 2, 5]);
    }
}
