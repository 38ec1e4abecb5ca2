//! The link seam: how one rank of a host group moves messages, and the one
//! executor that runs an execution plan over any kind of link.
//!
//! A rank's [`Links`] offer exactly the buffering model the verifier
//! proved schedules against: one FIFO link per (sender, receiver,
//! channel) holding at most `slots` unconsumed messages, each with a
//! [`Header`] naming its call. Every kind of link — shared-memory slots,
//! TCP, the two mixed (shared memory inside a host, TCP across), and
//! whatever comes next — runs the same walk, firing rule and data path
//! ([`exec`]).
//!
//! A message travels one of three ways, picked per step by the executor
//! from the plan's facts and where the buffers lie: copied through the
//! link's room, read in place from the sender's heap (`zero_copy`,
//! [`HeapMap`]), or written by the sender into the receiver's posted
//! output (`direct`).
//!
//! Invariants the executor relies on from every implementation (the
//! trait is `unsafe` to implement: see its Safety section):
//! - a room handed out by [`Links::reserve`] or a payload by
//!   [`Links::peek`] stays valid until the matching `commit` or
//!   `release`, and the executor never holds one longer;
//! - payloads and rooms are 8-aligned (so aligned for every element type);
//! - [`Links::ticket`] moves whenever anything arrives or is consumed, so
//!   a wait on it never misses progress.

mod direct;
pub mod exec;
mod header;
mod heaps;
mod zero_copy;

use std::time::Instant;

use crate::comm::CommError;
use crate::types::Rank;

pub use header::{HEADER_BYTES, Header};
pub use heaps::HeapMap;
pub use zero_copy::reference_bytes;

/// A received message, valid until [`Links::release`] on its link.
#[derive(Debug, Clone, Copy)]
pub struct Incoming {
    /// The sender's call number.
    pub call: u64,
    /// The value's bytes. The payload holds that many only when the
    /// header [holds the value](Header::holds_value); a reference or a
    /// value written to a post must be read as such.
    pub len: usize,
    /// The payload; aligned to 8 bytes (so to every element type).
    pub payload: *const u8,
}

/// One rank's links to every peer of its group (see the module docs).
///
/// # Safety
/// The executor reads and writes through what an implementation hands
/// out, so an implementation promises: a room from [`reserve`](Self::reserve)
/// is valid for writes of `len` bytes, 8-aligned and touched by nobody
/// else until [`commit`](Self::commit); a payload from [`peek`](Self::peek)
/// is valid for reads of the bytes its header says it holds (or, for a
/// reference, of the room [`max_message`](Self::max_message) promises)
/// until [`release`](Self::release); [`heaps`](Self::heaps) describes
/// memory that is mapped and readable in this process wherever a peer's
/// reference may point; a post from [`take_post`](Self::take_post) is
/// valid for writes of `len` bytes that nobody else touches until the
/// message is committed; and after [`give_up`](Self::give_up) returns no
/// peer touches this rank's memory for the call.
pub unsafe trait Links {
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

    /// `Err` once this rank failed, or a peer failed in a way that
    /// concerns this rank's current call. A peer that is gone (left or
    /// lost) is not a failure by itself: it fails the calls that wait on
    /// it ([`departed`](Self::departed)).
    fn check(&mut self) -> Result<(), CommError>;

    /// The highest channel number usable (`None`: unbounded).
    fn max_channel(&self) -> Option<u32>;

    /// Largest payload one message may carry (`None`: unbounded).
    fn max_message(&self) -> Option<usize>;

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

    /// Where the group's heaps lie in this process, when it has any:
    /// values in a buffer of the sender's heap travel as offsets.
    fn heaps(&self) -> Option<std::sync::Arc<HeapMap>> {
        None
    }

    /// Whether `peer` maps this rank's heap (so a value may go to it by
    /// reference or be written into its heap): every peer where the group
    /// has heaps at all, unless the group spans hosts.
    fn heap_peer(&self, peer: Rank) -> bool {
        let _ = peer;
        self.heaps().is_some()
    }

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

    /// Enter a stretch of work on peers' memory (values read where they
    /// lie, values written into a peer's post): `Err` once the group has
    /// failed, and then nothing may be touched. Ends with
    /// [`end_movement`](Self::end_movement). Links whose peers' memory
    /// outlives a failure (mapped heaps) need nothing here.
    fn begin_movement(&mut self) -> Result<(), CommError> {
        Ok(())
    }

    /// Leave the stretch [`begin_movement`](Self::begin_movement) entered.
    fn end_movement(&mut self) {}

    /// This rank's call failed with `error`: return only once no peer can
    /// still be reading or writing this rank's memory for it (where that
    /// memory is the caller's, which it may free once the call returns).
    fn give_up(&mut self, _error: &CommError) {}

    /// Claim `to`'s post for this rank's next message on the link, when
    /// there is one for exactly `len` bytes: where to write the value in
    /// `to`'s heap, as mapped here.
    fn take_post(&mut self, _to: Rank, _channel: u32, _len: usize) -> Option<*mut u8> {
        None
    }
}
