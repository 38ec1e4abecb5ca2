//! A link per peer: shared memory to the ranks of this host, the network
//! (TCP, or MPI point-to-point) to the others, as one transport (what
//! NCCL does when it picks shm or net per peer).
//!
//! Each message goes over the kind of link its peer has; the executor
//! sees one group. The shared-memory side numbers its ranks among this
//! host's, so every call into it translates; failures it records name
//! group ranks (see [`ShmTransport::named`]), so a failure crosses from
//! one kind to the other as it is relayed (the communicator fails every
//! link with the culprit it learned). The shared heap covers this host
//! only: a value goes by reference or by direct write only to a peer of
//! this host ([`Transport::heap_peer`]).
//!
//! Waiting watches both kinds: it spins over both for a while, then
//! sleeps on this rank's doorbell a slice at a time and looks at the
//! network between slices, since a futex and a socket (or MPI's progress
//! engine) cannot be waited on together.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use super::shm::ShmTransport;
use super::{Position, Transport};
use ferrocoll_core::link::Header;
use ferrocoll_core::link::{HeapMap, Incoming, Links};

/// How long a waiter spins over both kinds before it sleeps (as the TCP
/// transport does: a message from another host rarely comes sooner).
const SPIN: Duration = Duration::from_micros(100);

/// The longest a sleeping waiter goes without reading its connections: a
/// message from another host waits at most this long on top of the
/// network, against milliseconds per message on a gigabit link; shorter
/// slices cost wake-ups on hosts with more ranks than cores.
const SLICE: Duration = Duration::from_micros(200);

/// The slice while the network has messages in flight that only this
/// thread's looks move along ([`Transport::driven`]: MPI's).
const DRIVEN_SLICE: Duration = Duration::from_micros(20);

/// Which link a peer has.
#[derive(Clone, Copy)]
enum Via {
    /// Shared memory; its index among this host's ranks.
    Shm(Rank),
    /// The network (TCP or MPI); its group rank.
    Net(Rank),
}

/// One rank's links: shared memory inside its host, the network `N`
/// (TCP, MPI) across hosts.
pub(crate) struct MixedTransport<N> {
    rank: Rank,
    /// Per group rank, its index among this host's ranks, if it is on it.
    local: Vec<Option<Rank>>,
    shm: ShmTransport,
    net: N,
    /// The host's heaps as the group numbers its ranks (peers on other
    /// hosts map nothing).
    heaps: Option<Arc<HeapMap>>,
}

impl<N: Transport> MixedTransport<N> {
    /// The links of `rank`, whose host holds `members` (group ranks, in
    /// order, the shared-memory side's ranks); `net` reaches every other
    /// rank of the `world_size`.
    pub fn new(rank: Rank, members: &[Rank], world_size: u32, shm: ShmTransport, net: N) -> Self {
        let mut local = vec![None; world_size as usize];
        for (at, &m) in members.iter().enumerate() {
            local[m as usize] = Some(at as Rank);
        }
        let heaps = shm.heaps().map(|h| {
            let mapped: Vec<(usize, usize)> = local
                .iter()
                .map(|l| l.and_then(|l| h.of(l)).unwrap_or((0, 0)))
                .collect();
            Arc::new(HeapMap::new(rank, mapped))
        });
        MixedTransport {
            rank,
            local,
            shm,
            net,
            heaps,
        }
    }

    fn via(&self, peer: Rank) -> Via {
        match self.local.get(peer as usize).copied().flatten() {
            Some(l) => Via::Shm(l),
            None => Via::Net(peer),
        }
    }

    /// This rank's index among its host's ranks.
    fn me(&self) -> Rank {
        self.local[self.rank as usize].expect("a rank is on its own host")
    }
}

/// The tighter of two optional bounds (`None`: unbounded).
fn tighter<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

// SAFETY: every link is the shared-memory transport's or the network's,
// which keep the contract; the heap map is the shared-memory side's, renumbered
// by group rank, with empty ranges for peers on other hosts.
unsafe impl<N: Transport> Links for MixedTransport<N> {
    fn reserve(
        &mut self,
        to: Rank,
        channel: u32,
        len: usize,
    ) -> Result<Option<*mut u8>, CommError> {
        match self.via(to) {
            Via::Shm(l) => self.shm.reserve(l, channel, len),
            Via::Net(r) => self.net.reserve(r, channel, len),
        }
    }

    fn commit(&mut self, to: Rank, channel: u32, header: &Header) -> Result<(), CommError> {
        match self.via(to) {
            Via::Shm(l) => self.shm.commit(l, channel, header),
            Via::Net(r) => self.net.commit(r, channel, header),
        }
    }

    fn peek(&mut self, from: Rank, channel: u32) -> Result<Option<Incoming>, CommError> {
        match self.via(from) {
            Via::Shm(l) => self.shm.peek(l, channel),
            Via::Net(r) => self.net.peek(r, channel),
        }
    }

    fn peek_header(&mut self, from: Rank, channel: u32) -> Option<Header> {
        match self.via(from) {
            Via::Shm(l) => self.shm.peek_header(l, channel),
            Via::Net(r) => self.net.peek_header(r, channel),
        }
    }

    fn release(&mut self, from: Rank, channel: u32) -> Result<(), CommError> {
        match self.via(from) {
            Via::Shm(l) => self.shm.release(l, channel),
            Via::Net(r) => self.net.release(r, channel),
        }
    }

    fn unconsumed(&mut self, to: Rank, channel: u32) -> u64 {
        match self.via(to) {
            Via::Shm(l) => self.shm.unconsumed(l, channel),
            Via::Net(r) => self.net.unconsumed(r, channel),
        }
    }

    fn ticket(&self) -> u64 {
        // Each side's ticket only moves forward: the sum moves whenever
        // either does.
        self.shm.ticket().wrapping_add(self.net.ticket())
    }

    fn wait(&mut self, seen: u64, until: Instant) {
        let spin_until = Instant::now() + SPIN;
        loop {
            // One look at the connections, without blocking.
            let net_seen = self.net.ticket();
            self.net.wait(net_seen, Instant::now());
            let now = Instant::now();
            if self.ticket() != seen || now >= until {
                return;
            }
            if now < spin_until {
                std::thread::yield_now();
                continue;
            }
            let slice = if self.net.driven() {
                DRIVEN_SLICE
            } else {
                SLICE
            };
            let shm_seen = self.shm.ticket();
            self.shm.doze(shm_seen, until.min(now + slice));
        }
    }

    fn check(&mut self) -> Result<(), CommError> {
        self.shm.check()?;
        self.net.check()
    }

    fn max_channel(&self) -> Option<u32> {
        tighter(self.shm.max_channel(), self.net.max_channel())
    }

    fn max_message(&self) -> Option<usize> {
        tighter(self.shm.max_message(), self.net.max_message())
    }

    fn departed(&mut self, peer: Rank) -> bool {
        match self.via(peer) {
            Via::Shm(l) => self.shm.departed(l),
            Via::Net(r) => self.net.departed(r),
        }
    }

    fn farewell(&self, peer: Rank) -> String {
        match self.via(peer) {
            Via::Shm(l) => self.shm.farewell(l),
            Via::Net(r) => self.net.farewell(r),
        }
    }

    fn heaps(&self) -> Option<Arc<HeapMap>> {
        self.heaps.clone()
    }

    fn heap_peer(&self, peer: Rank) -> bool {
        self.heaps.is_some() && matches!(self.via(peer), Via::Shm(_))
    }

    fn consumed(&self, from: Rank, channel: u32) -> u64 {
        match self.via(from) {
            Via::Shm(l) => self.shm.consumed(l, channel),
            Via::Net(r) => self.net.consumed(r, channel),
        }
    }

    fn post(&mut self, from: Rank, channel: u32, seq: u64, offset: usize, len: usize) {
        if let Via::Shm(l) = self.via(from) {
            self.shm.post(l, channel, seq, offset, len);
        }
    }

    fn post_taken(&mut self, from: Rank, channel: u32, seq: u64) -> bool {
        match self.via(from) {
            Via::Shm(l) => self.shm.post_taken(l, channel, seq),
            Via::Net(_) => false,
        }
    }

    fn clear_post(&mut self, from: Rank, channel: u32, seq: u64) {
        if let Via::Shm(l) = self.via(from) {
            self.shm.clear_post(l, channel, seq);
        }
    }

    fn withdraw_post(&mut self, from: Rank, channel: u32) -> Option<u64> {
        match self.via(from) {
            Via::Shm(l) => self.shm.withdraw_post(l, channel),
            Via::Net(_) => None,
        }
    }

    fn sent_to_me(&self, from: Rank, channel: u32) -> u64 {
        match self.via(from) {
            Via::Shm(l) => self.shm.sent_to_me(l, channel),
            Via::Net(r) => self.net.sent_to_me(r, channel),
        }
    }

    fn give_back_post(&mut self, to: Rank, channel: u32) {
        if let Via::Shm(l) = self.via(to) {
            self.shm.give_back_post(l, channel);
        }
    }

    fn take_post(&mut self, to: Rank, channel: u32, len: usize) -> Option<*mut u8> {
        match self.via(to) {
            Via::Shm(l) => self.shm.take_post(l, channel, len),
            Via::Net(_) => None,
        }
    }
}

impl<N: Transport> Transport for MixedTransport<N> {
    fn own_heap(&self) -> Option<Arc<super::shm::heap::Heap>> {
        self.shm.own_heap()
    }

    fn set_position(&mut self, position: Position) {
        self.shm.set_position(position);
        self.net.set_position(position);
    }

    fn fail(&mut self, culprit: Rank, reason: &str) {
        self.shm.fail(culprit, reason);
        self.net.fail(culprit, reason);
    }

    fn aborter(&self) -> Box<dyn Fn(&str) + Send + Sync> {
        let (shm, net) = (self.shm.aborter(), self.net.aborter());
        Box::new(move |reason| {
            shm(reason);
            net(reason);
        })
    }

    fn depart(&mut self) {
        self.shm.depart();
        self.net.depart();
    }

    fn staging(&self, rank: Rank, call: u64) -> Option<(*mut u8, usize)> {
        match self.via(rank) {
            Via::Shm(l) => self.shm.staging(l, call),
            Via::Net(r) => self.net.staging(r, call),
        }
    }

    fn stage(&mut self, call: u64, len: usize) {
        // Peers on this host read the input where it was written; the
        // announcements to other hosts carry a copy.
        let written = self.shm.staging(self.me(), call);
        let carried = self.net.staging(self.rank, call);
        if let (Some((from, _)), Some((to, room))) = (written, carried) {
            // SAFETY: `from` is this rank's own staging half, holding the
            // `len` bytes just written there; `to` is the network side's own
            // buffer of `room` bytes, a separate allocation nothing reads
            // until the announcement is sent.
            unsafe { std::ptr::copy_nonoverlapping(from, to, len.min(room)) };
        }
        self.shm.stage(call, len);
        self.net.stage(call, len);
    }

    fn driven(&self) -> bool {
        self.net.driven()
    }

    fn settle(&mut self) {
        self.shm.settle();
        self.net.settle();
    }

    fn announce(&mut self, to: Rank, header: &Header) -> Result<bool, CommError> {
        match self.via(to) {
            Via::Shm(l) => self.shm.announce(l, header),
            Via::Net(r) => self.net.announce(r, header),
        }
    }

    fn announcement(&mut self, from: Rank) -> Result<Option<Header>, CommError> {
        match self.via(from) {
            Via::Shm(l) => self.shm.announcement(l),
            Via::Net(r) => self.net.announcement(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tighter;

    #[test]
    fn the_tighter_bound_wins_and_none_is_unbounded() {
        assert_eq!(tighter(Some(3), Some(5)), Some(3));
        assert_eq!(tighter(None, Some(5)), Some(5));
        assert_eq!(tighter(Some(4), None), Some(4));
        assert_eq!(tighter::<u32>(None, None), None);
    }
}
