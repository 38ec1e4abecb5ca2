//! Batched point-to-point: many sends and receives as one call, in an
//! order that cannot deadlock.
//!
//! A backend's send may wait until the receiver has taken the data (the
//! threads executor reads the sender's buffer in place). Two ranks that
//! both send first would then wait for each other. A batch avoids that by
//! running its operations pair by pair: every rank visits its peers in the
//! order of the pair `(min(rank, peer), max(rank, peer))`, and within a
//! pair the lower rank sends first while the higher receives first. A rank
//! blocked on a pair waits only for a peer still busy with a smaller pair,
//! so the smallest pair in progress always completes: no cycle can form.

use super::Communicator;
use super::call::{Call, HostSlice, HostSliceMut};
use super::error::{CommError, check_peer};
use crate::types::{Element, Rank};

/// One operation of a batch.
#[derive(Debug)]
pub enum P2pOp<'a> {
    /// Send `data` to `peer`.
    Send {
        /// The data.
        data: HostSlice<'a>,
        /// The receiver.
        peer: Rank,
    },
    /// Receive exactly `buffer`'s length from `peer`.
    Recv {
        /// Where it lands.
        buffer: HostSliceMut<'a>,
        /// The sender.
        peer: Rank,
    },
}

impl<'a> P2pOp<'a> {
    /// Send `data` to `peer`.
    pub fn send<T: Element>(data: &'a [T], peer: Rank) -> Self {
        P2pOp::Send {
            data: data.into(),
            peer,
        }
    }

    /// Receive into `buffer` from `peer`.
    pub fn recv<T: Element>(buffer: &'a mut [T], peer: Rank) -> Self {
        P2pOp::Recv {
            buffer: buffer.into(),
            peer,
        }
    }

    fn peer(&self) -> Rank {
        match self {
            P2pOp::Send { peer, .. } | P2pOp::Recv { peer, .. } => *peer,
        }
    }
}

/// Run `ops` as one batch on `comm`: sends to and receives from each peer
/// keep their order within each direction, and messages between two ranks
/// match in that order. Every peer is checked before anything moves.
pub fn send_recv_batch<C: Communicator + ?Sized>(
    comm: &mut C,
    ops: Vec<P2pOp<'_>>,
) -> Result<(), CommError> {
    let (rank, n) = (comm.rank(), comm.world_size());
    for op in &ops {
        check_peer(op.peer(), rank, n)?;
    }
    let mut per_peer: Vec<(Vec<HostSlice<'_>>, Vec<HostSliceMut<'_>>)> =
        (0..n).map(|_| (Vec::new(), Vec::new())).collect();
    for op in ops {
        match op {
            P2pOp::Send { data, peer } => per_peer[peer as usize].0.push(data),
            P2pOp::Recv { buffer, peer } => per_peer[peer as usize].1.push(buffer),
        }
    }
    for peer in pair_order(rank, n) {
        let (sends, recvs) = std::mem::take(&mut per_peer[peer as usize]);
        if rank < peer {
            send_all(comm, sends, peer)?;
            recv_all(comm, recvs, peer)?;
        } else {
            recv_all(comm, recvs, peer)?;
            send_all(comm, sends, peer)?;
        }
    }
    Ok(())
}

/// `rank`'s peers in the order of the pairs they form with it: lower peers
/// `0, 1, ..` first (pairs `(p, rank)`), then higher ones (pairs `(rank, p)`).
pub fn pair_order(rank: Rank, n: u32) -> impl Iterator<Item = Rank> {
    (0..n).filter(move |&p| p != rank)
}

fn send_all<C: Communicator + ?Sized>(
    comm: &mut C,
    sends: Vec<HostSlice<'_>>,
    peer: Rank,
) -> Result<(), CommError> {
    sends
        .into_iter()
        .try_for_each(|data| comm.execute(Call::send(data, peer)))
}

fn recv_all<C: Communicator + ?Sized>(
    comm: &mut C,
    recvs: Vec<HostSliceMut<'_>>,
    peer: Rank,
) -> Result<(), CommError> {
    recvs
        .into_iter()
        .try_for_each(|buffer| comm.execute(Call::recv(buffer, peer)))
}

#[cfg(test)]
mod tests {
    use super::pair_order;

    /// Every rank visits the pairs it belongs to in increasing pair order,
    /// the property the deadlock argument rests on.
    #[test]
    fn peers_are_visited_in_increasing_pair_order() {
        for n in 1..=9u32 {
            for rank in 0..n {
                let pairs: Vec<(u32, u32)> = pair_order(rank, n)
                    .map(|p| (p.min(rank), p.max(rank)))
                    .collect();
                assert!(
                    pairs.windows(2).all(|w| w[0] < w[1]),
                    "{rank}/{n}: {pairs:?}"
                );
                assert_eq!(pairs.len(), n as usize - 1);
            }
        }
    }
}
