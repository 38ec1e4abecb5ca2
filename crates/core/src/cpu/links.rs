//! The thread group's kind of link: in-process queues under core's one
//! host executor ([`crate::link::exec`]).
//!
//! Threads share one address space, so the "heap" every rank maps is all
//! of it ([`Group::heaps`]): a value lent by reference travels as its
//! address, a post names an address in the receiver's output, and a
//! reference is read with plain loads. What makes that safe is the
//! movement lock: every read or write of a peer's memory happens between
//! [`Links::begin_movement`] and [`Links::end_movement`], which fail once
//! the group has failed, and a rank that gives up takes the lock for
//! writing before it returns, so no peer is inside its buffers then.

use std::sync::{Arc, RwLockReadGuard};
use std::time::Instant;

use super::group::{Group, LinkQueue, Msg, Post};
use crate::comm::CommError;
use crate::link::{Header, HeapMap, Incoming, Links};
use crate::plan::RankPlan;
use crate::types::Rank;

/// One rank's links in one call, looked up once.
pub(crate) struct ThreadLinks<'a> {
    group: &'a Group,
    rank: Rank,
    /// Channels of the call: links are indexed `peer * channels + channel`.
    channels: u32,
    incoming: Vec<Option<Arc<LinkQueue>>>,
    outgoing: Vec<Option<Arc<LinkQueue>>>,
    heaps: Arc<HeapMap>,
    /// Held while this rank touches a peer's memory.
    moving: Option<RwLockReadGuard<'a, ()>>,
}

impl<'a> ThreadLinks<'a> {
    /// The links `plan` (this rank's part of a call) sends and receives on.
    pub fn new(group: &'a Group, rank: Rank, plan: &RankPlan) -> Self {
        let channels = plan.channels.len().max(1) as u32;
        let size = (group.n * channels) as usize;
        let (mut incoming, mut outgoing) = (vec![None; size], vec![None; size]);
        for (c, list) in plan.channels.iter().enumerate() {
            let c = c as u32;
            for ins in list {
                for m in &ins.recv {
                    incoming[(m.peer * channels + c) as usize]
                        .get_or_insert_with(|| group.link(m.peer, rank, c));
                }
                for m in &ins.send {
                    outgoing[(m.peer * channels + c) as usize]
                        .get_or_insert_with(|| group.link(rank, m.peer, c));
                }
            }
        }
        ThreadLinks {
            group,
            rank,
            channels,
            incoming,
            outgoing,
            heaps: group.heaps[rank as usize].clone(),
            moving: None,
        }
    }

    fn at(&self, peer: Rank, channel: u32) -> Option<usize> {
        (peer < self.group.n && channel < self.channels)
            .then(|| (peer * self.channels + channel) as usize)
    }

    fn incoming(&self, from: Rank, channel: u32) -> Option<&LinkQueue> {
        self.incoming[self.at(from, channel)?].as_deref()
    }

    fn outgoing(&self, to: Rank, channel: u32) -> Option<&LinkQueue> {
        self.outgoing[self.at(to, channel)?].as_deref()
    }

    /// The outgoing link to `to`, which the plan sends on.
    fn sending(&self, to: Rank, channel: u32) -> Result<&LinkQueue, CommError> {
        self.outgoing(to, channel)
            .ok_or_else(|| no_link(to, channel))
    }
}

/// The executor asked for a link its plan does not use: a bug, reported
/// as an error rather than a panic.
fn no_link(peer: Rank, channel: u32) -> CommError {
    protocol_error(
        peer,
        format!("no link on channel {channel} in this call's plan"),
    )
}

fn protocol_error(peer: Rank, what: String) -> CommError {
    CommError::PeerFailed {
        rank: peer,
        reason: format!("protocol error: {what}"),
    }
}

// SAFETY: rooms and payloads are the group's slot buffers under the slot
// protocol (a room is slot `pushed % slots` while fewer than `slots`
// messages are queued; a payload is read while its message is queued);
// the "heap" is this process's address space, and a reference or a post
// names a peer's buffer that the movement lock keeps alive: every read or
// write of it happens between `begin_movement` and `end_movement`, and
// `give_up` fails the group and then waits for every such stretch to end.
unsafe impl Links for ThreadLinks<'_> {
    fn reserve(
        &mut self,
        to: Rank,
        channel: u32,
        len: usize,
    ) -> Result<Option<*mut u8>, CommError> {
        let q = self.sending(to, channel)?;
        let st = self.group.lock_link(q);
        if st.queue.len() >= self.group.slots {
            return Ok(None);
        }
        let index = (st.pushed % self.group.slots as u64) as usize;
        // SAFETY: this rank is the link's only sender, and fewer than
        // `slots` messages are queued, numbered just below `pushed`, so
        // none names slot `pushed % slots`.
        let room = unsafe { q.slots[index].prepare(len) };
        Ok(Some(room as *mut u8))
    }

    fn commit(&mut self, to: Rank, channel: u32, header: &Header) -> Result<(), CommError> {
        let q = self.sending(to, channel)?;
        {
            let mut st = self.group.lock_link(q);
            let slot = (st.pushed % self.group.slots as u64) as usize;
            st.queue.push_back(Msg::Plan {
                header: header.clone(),
                slot,
            });
            st.pushed += 1;
            // Copied, read in place or written to a post: the value's
            // bytes cross the link once.
            st.count(q.link, header.len as usize);
        }
        self.group.ring(to);
        Ok(())
    }

    fn peek(&mut self, from: Rank, channel: u32) -> Result<Option<Incoming>, CommError> {
        let Some(q) = self.incoming(from, channel) else {
            return Ok(None);
        };
        let st = self.group.lock_link(q);
        Ok(match st.queue.front() {
            Some(Msg::Plan { header, slot }) => Some(Incoming {
                call: header.call,
                len: header.len as usize,
                payload: q.slots[*slot].address() as *const u8,
            }),
            Some(Msg::Send { .. }) => {
                return Err(protocol_error(
                    from,
                    format!("a point-to-point send on plan channel {channel}"),
                ));
            }
            None => None,
        })
    }

    fn peek_header(&mut self, from: Rank, channel: u32) -> Option<Header> {
        let q = self.incoming(from, channel)?;
        match self.group.lock_link(q).queue.front() {
            Some(Msg::Plan { header, .. }) => Some(header.clone()),
            _ => None,
        }
    }

    fn release(&mut self, from: Rank, channel: u32) -> Result<(), CommError> {
        let q = self
            .incoming(from, channel)
            .ok_or_else(|| no_link(from, channel))?;
        {
            let mut st = self.group.lock_link(q);
            st.queue.pop_front();
            st.popped += 1;
        }
        self.group.ring(from);
        Ok(())
    }

    fn unconsumed(&mut self, to: Rank, channel: u32) -> u64 {
        self.outgoing(to, channel)
            .map_or(0, |q| self.group.lock_link(q).queue.len() as u64)
    }

    fn ticket(&self) -> u64 {
        self.group.generation(self.rank)
    }

    fn wait(&mut self, seen: u64, until: Instant) {
        // A failure is seen by the executor's next `check`.
        let _ = self.group.sleep(self.rank, seen, until);
    }

    fn check(&mut self) -> Result<(), CommError> {
        self.group.check()
    }

    fn max_channel(&self) -> Option<u32> {
        None
    }

    fn max_message(&self) -> Option<usize> {
        // Slot buffers grow to any message.
        Some(usize::MAX)
    }

    fn departed(&mut self, peer: Rank) -> bool {
        self.group.has_departed(peer)
    }

    fn heaps(&self) -> Option<Arc<HeapMap>> {
        Some(self.heaps.clone())
    }

    fn consumed(&self, from: Rank, channel: u32) -> u64 {
        self.incoming(from, channel)
            .map_or(0, |q| self.group.lock_link(q).popped)
    }

    fn post(&mut self, from: Rank, channel: u32, seq: u64, offset: usize, len: usize) {
        let Some(q) = self.incoming(from, channel) else {
            return;
        };
        let mut st = self.group.lock_link(q);
        // One post at a time, and only for a message not sent yet.
        if st.post.is_none() && st.pushed <= seq {
            st.post = Some(Post {
                seq,
                address: offset,
                len,
                taken: false,
            });
        }
    }

    fn post_taken(&mut self, from: Rank, channel: u32, seq: u64) -> bool {
        self.incoming(from, channel).is_some_and(|q| {
            let st = self.group.lock_link(q);
            st.post.is_some_and(|p| p.seq == seq && p.taken)
        })
    }

    fn clear_post(&mut self, from: Rank, channel: u32, seq: u64) {
        if let Some(q) = self.incoming(from, channel) {
            let mut st = self.group.lock_link(q);
            if st.post.is_some_and(|p| p.seq == seq) {
                st.post = None;
            }
        }
    }

    fn withdraw_post(&mut self, from: Rank, channel: u32) -> Option<u64> {
        let q = self.incoming(from, channel)?;
        let mut st = self.group.lock_link(q);
        match st.post {
            Some(p) if p.taken => Some(p.seq),
            _ => {
                st.post = None;
                None
            }
        }
    }

    fn sent_to_me(&self, from: Rank, channel: u32) -> u64 {
        self.incoming(from, channel)
            .map_or(0, |q| self.group.lock_link(q).pushed)
    }

    fn give_back_post(&mut self, to: Rank, channel: u32) {
        if let Some(q) = self.outgoing(to, channel) {
            let mut st = self.group.lock_link(q);
            let next = st.pushed;
            if st.post.is_some_and(|p| p.taken && p.seq == next) {
                st.post = None;
            }
        }
    }

    fn take_post(&mut self, to: Rank, channel: u32, len: usize) -> Option<*mut u8> {
        let q = self.outgoing(to, channel)?;
        let mut st = self.group.lock_link(q);
        let next = st.pushed;
        let post = st.post.as_mut()?;
        if post.taken || post.seq != next || post.len != len {
            return None;
        }
        post.taken = true;
        Some(post.address as *mut u8)
    }

    fn begin_movement(&mut self) -> Result<(), CommError> {
        self.moving = Some(self.group.begin_movement()?);
        Ok(())
    }

    fn end_movement(&mut self) {
        self.moving = None;
    }

    fn give_up(&mut self, error: &CommError) {
        self.moving = None;
        // A peer's failure (one that left, or broke the protocol) keeps
        // naming that peer; the quiesce's own record is then a no-op.
        self.group.fail_on(self.rank, error);
        self.group.quiesce(self.rank, error);
    }
}
