//! How bytes move between the processes of a group.
//!
//! A transport offers the executor exactly the buffering model the
//! verifier proved schedules against: one FIFO link per (sender, receiver,
//! channel) holding at most `slots` unconsumed messages. Everything else —
//! which step fires when, what is reduced — lives in the executor, so the
//! transports (shared memory, TCP, and the two mixed: shared memory
//! inside a host, TCP across) run the same code above them.

pub(crate) mod mixed;
pub(crate) mod shm;
pub(crate) mod tcp;

use std::time::Instant;

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use crate::wire::Header;

/// The channel message-based transports carry call announcements on
/// (see [`Transport::announce`]): past every schedule channel, below the
/// TCP transport's bound on channel numbers, apart from point-to-point.
pub(crate) const CONTROL_CHANNEL: u32 = (1 << 16) - 1;

/// Where a rank is in its sequence of collective calls: `2k + 1` inside
/// call `k`, `2k` after `k` calls and before the next (where point-to-point
/// calls and aborts happen). Every failure is stamped with its rank's
/// position, and a rank is concerned only by failures stamped at or before
/// its own: a peer that failed later had already finished everything this
/// rank's call needs from it (it sent or stored every message, and drained
/// what it lent), so the call completes here as it did there — a
/// disagreement on call `k + 1` never fails call `k` on a slower rank.
pub(crate) type Position = u64;

/// The position inside collective call `call`.
pub(crate) fn inside(call: u64) -> Position {
    2 * call + 1
}

/// The position after `calls` collective calls.
pub(crate) fn between(calls: u64) -> Position {
    2 * calls
}

/// A received message, valid until [`Transport::release`] on its link.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Incoming {
    pub call: u64,
    /// The value's bytes. The payload holds that many only when the
    /// header [holds the value](crate::wire::Header::holds_value); a
    /// reference or a value written to a post must be read as such.
    pub len: usize,
    /// The payload; aligned to 8 bytes (so to every element type).
    pub payload: *const u8,
}

/// Moves messages between the ranks of one group (see the module docs).
///
/// Pointers handed out stay valid until the matching `commit` or
/// `release`; the executor never holds one longer.
pub(crate) trait Transport: Send {
    /// Room for the next message of `len` payload bytes on the link to
    /// `to`, or `None` while the link holds `slots` unconsumed messages.
    /// Asking again without committing returns the same room.
    fn reserve(&mut self, to: Rank, channel: u32, len: usize)
    -> Result<Option<*mut u8>, CommError>;

    /// Publish the message written into the reserved room.
    fn commit(&mut self, to: Rank, channel: u32, header: &Header) -> Result<(), CommError>;

    /// The oldest unconsumed message from `from`, if one has arrived.
    fn peek(&mut self, from: Rank, channel: u32) -> Result<Option<Incoming>, CommError>;

    /// The header of that message, to explain a mismatch.
    fn peek_header(&mut self, from: Rank, channel: u32) -> Option<Header>;

    /// Consume the oldest message from `from`, freeing its slot for the sender.
    fn release(&mut self, from: Rank, channel: u32) -> Result<(), CommError>;

    /// Messages sent to `to` on `channel` that it has not consumed yet.
    fn unconsumed(&mut self, to: Rank, channel: u32) -> u64;

    /// A counter that changes whenever anything arrives or is consumed;
    /// read it before looking, then [`wait`](Self::wait) on it.
    fn ticket(&self) -> u64;

    /// Sleep until the ticket moves past `seen`, or `until`; peers' health
    /// is checked meanwhile.
    fn wait(&mut self, seen: u64, until: Instant);

    /// `Err` once this rank failed, or a peer failed at or before this
    /// rank's [`Position`]. A peer that is gone (left or lost) is not a
    /// failure by itself: it fails the calls that wait on it
    /// ([`departed`](Self::departed)).
    fn check(&mut self) -> Result<(), CommError>;

    /// This rank's position from now on (see [`Position`]): what its
    /// failures are stamped with and which of its peers' concern it.
    fn set_position(&mut self, position: Position);

    /// Tell every peer this rank failed because `culprit` did (itself, or
    /// the peer whose failure it saw), and why, stamped with this rank's
    /// position; the first failure wins, so every survivor names the rank
    /// that started it.
    fn fail(&mut self, culprit: Rank, reason: &str);

    /// The highest channel number usable (`None`: unbounded).
    fn max_channel(&self) -> Option<u32>;

    /// Largest payload one message may carry (`None`: unbounded).
    fn max_message(&self) -> Option<usize>;

    /// A way to fail this rank from another thread.
    fn aborter(&self) -> Box<dyn Fn(&str) + Send + Sync>;

    /// Leave the group cleanly: peers will not count this rank's exit as a loss.
    fn depart(&mut self);

    /// Whether `peer` is gone — it left the group (dropped its
    /// communicator) or was lost (its process ended without leaving): it
    /// will never send or consume again. What it sent before is still
    /// delivered, so only a call waiting on it fails.
    fn departed(&mut self, peer: Rank) -> bool;

    /// Why `peer` is gone, for an error of a call that waited on it.
    fn farewell(&self, peer: Rank) -> String {
        let _ = peer;
        "left the group (its communicator was dropped)".to_owned()
    }

    /// The group's shared heaps (shared memory with
    /// `ProcessConfig::shared_heap_bytes` set): values in a buffer of the
    /// sender's heap travel as offsets.
    fn heaps(&self) -> Option<std::sync::Arc<shm::heap::Heaps>> {
        None
    }

    /// Whether `peer` maps this rank's heap (so a value may go to it by
    /// reference or be written into its heap): every peer where the group
    /// has heaps at all, unless the group spans hosts.
    fn heap_peer(&self, peer: Rank) -> bool {
        let _ = peer;
        self.heaps().is_some()
    }

    /// Half `call % 2` of `rank`'s one-shot staging, as mapped in this
    /// process, and its size (or, where peers' staging is not mapped, the
    /// input `rank`'s announcement of `call` carried, and its length). A
    /// rank writes its own half before it announces a call and peers read
    /// it after the agreement; a half is rewritten two calls later, after
    /// every peer announced the call in between (so finished reading).
    fn staging(&self, _rank: Rank, _call: u64) -> Option<(*mut u8, usize)> {
        None
    }

    /// This rank's input for one-shot call `call` lies in its own staging
    /// (`len` bytes): a transport whose peers cannot map that staging
    /// sends it with the call's announcement.
    fn stage(&mut self, _call: u64, _len: usize) {}

    /// A call ended: hand peers whatever this rank still owes them (a
    /// transport that batches acknowledgements sends them now, so no peer
    /// waits for credit while this rank is away from the group).
    fn settle(&mut self) {}

    /// Messages from `from` on `channel` this rank has consumed, ever.
    fn consumed(&self, _from: Rank, _channel: u32) -> u64 {
        0
    }

    /// Ask `from` to write message number `seq` (counted over the link's
    /// life) straight into `len` bytes at `offset` of this rank's shared
    /// heap (direct write); ignored while another post is pending, once
    /// that message was sent, or where there is no heap.
    fn post(&mut self, _from: Rank, _channel: u32, _seq: u64, _offset: usize, _len: usize) {}

    /// Whether `from` took this rank's post for message `seq` (and so
    /// wrote there).
    fn post_taken(&mut self, _from: Rank, _channel: u32, _seq: u64) -> bool {
        false
    }

    /// Message `seq` from `from` was consumed: its post is spent.
    fn clear_post(&mut self, _from: Rank, _channel: u32, _seq: u64) {}

    /// Withdraw this rank's post on the link from `from` (its call is
    /// giving up): `Some(seq)` when `from` already took it for message
    /// `seq` — then it may be writing there until it sends that message.
    fn withdraw_post(&mut self, _from: Rank, _channel: u32) -> Option<u64> {
        None
    }

    /// Messages `from` has sent this rank on `channel`, ever.
    fn sent_to_me(&self, _from: Rank, _channel: u32) -> u64 {
        0
    }

    /// Give back a post of `to`'s this rank took but will not write (its
    /// step failed).
    fn give_back_post(&mut self, _to: Rank, _channel: u32) {}

    /// Claim `to`'s post for this rank's next message on the link, when
    /// there is one for exactly `len` bytes: where to write the value in
    /// `to`'s heap, as mapped here.
    fn take_post(&mut self, _to: Rank, _channel: u32, _len: usize) -> Option<*mut u8> {
        None
    }

    /// Tell `to` that this rank entered the call `header` describes (its
    /// number and signature, no payload); `Ok(false)` while there is no
    /// room yet. Announcing the same call again is harmless.
    fn announce(&mut self, to: Rank, header: &Header) -> Result<bool, CommError> {
        match self.reserve(to, CONTROL_CHANNEL, 0)? {
            Some(_) => {
                self.commit(to, CONTROL_CHANNEL, header)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The newest call `from` has announced, if any arrived since the last
    /// look (a transport may also repeat the newest one).
    fn announcement(&mut self, from: Rank) -> Result<Option<Header>, CommError> {
        let mut newest = None;
        while self.peek(from, CONTROL_CHANNEL)?.is_some() {
            newest = self.peek_header(from, CONTROL_CHANNEL);
            self.release(from, CONTROL_CHANNEL)?;
        }
        Ok(newest)
    }
}
