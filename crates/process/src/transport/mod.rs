//! How bytes move between the processes of a group.
//!
//! A transport offers the executor exactly the buffering model the
//! verifier proved schedules against: one FIFO link per (sender, receiver,
//! channel) holding at most `slots` unconsumed messages. Everything else —
//! which step fires when, what is reduced — lives in the executor, so the
//! transports (shared memory, TCP, MPI point-to-point with the feature
//! `mpi`, and the mixed: shared memory inside a host, TCP or MPI across)
//! run the same code above them.

pub(crate) mod message;
pub(crate) mod mixed;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
pub(crate) mod shm;
pub(crate) mod tcp;

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use ferrocoll_core::link::{Header, Links};

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

/// Moves messages between the ranks of one group (see the module docs):
/// the links core's executor runs a plan over, and what a process group
/// needs around its calls (failures and positions, one-shot staging, call
/// announcements, leaving).
pub(crate) trait Transport: Links + Send {
    /// This rank's position from now on (see [`Position`]): what its
    /// failures are stamped with and which of its peers' concern it.
    fn set_position(&mut self, position: Position);

    /// Tell every peer this rank failed because `culprit` did (itself, or
    /// the peer whose failure it saw), and why, stamped with this rank's
    /// position; the first failure wins, so every survivor names the rank
    /// that started it.
    fn fail(&mut self, culprit: Rank, reason: &str);

    /// A way to fail this rank from another thread.
    fn aborter(&self) -> Box<dyn Fn(&str) + Send + Sync>;

    /// Leave the group cleanly: peers will not count this rank's exit as a loss.
    fn depart(&mut self);

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

    /// Whether messages are in flight that only this thread's looks at
    /// the transport move along (MPI moves a large message only inside
    /// calls on both sides): a waiter must then keep looking, not sleep.
    fn driven(&self) -> bool {
        false
    }

    /// A call ended: hand peers whatever this rank still owes them (a
    /// transport that batches acknowledgements sends them now, so no peer
    /// waits for credit while this rank is away from the group).
    fn settle(&mut self) {}

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

    /// This rank's own shared heap, where its [`SharedBuffer`](shm::heap::SharedBuffer)s
    /// come from (shared memory with `ProcessConfig::shared_heap_bytes` set).
    fn own_heap(&self) -> Option<std::sync::Arc<shm::heap::Heap>> {
        None
    }
}
