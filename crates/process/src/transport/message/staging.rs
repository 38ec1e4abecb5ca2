//! Inputs of one-shot calls over a message transport: this rank's, which
//! its announcement carries, and what each peer's announcements carried.
//!
//! Kept by call parity: a peer announces call `c + 2` only after this
//! rank announced `c + 1`, so after it finished reading `c`'s inputs.

use std::cell::UnsafeCell;

use ferrocoll_core::Rank;
use ferrocoll_core::link::Header;

use super::mailbox::{Mailbox, Message};

/// The input a peer's announcement carried.
struct Carried {
    call: u64,
    message: Message,
}

/// One rank's one-shot inputs (see the module docs).
pub(crate) struct Staging {
    /// Cells: the communicator writes the input through the pointer
    /// [`staging`](Self::staging) hands out from a shared borrow.
    own: Box<[UnsafeCell<u64>]>,
    room: usize,
    /// The call whose announcement carries `own`, and how many bytes.
    staged: Option<(u64, usize)>,
    peers: Vec<[Option<Carried>; 2]>,
}

impl Staging {
    /// Room for `room` bytes of this rank's input, in a group of `world_size`.
    pub fn new(room: usize, world_size: usize) -> Self {
        Staging {
            own: (0..room.div_ceil(8)).map(|_| UnsafeCell::new(0)).collect(),
            room,
            staged: None,
            peers: (0..world_size).map(|_| [None, None]).collect(),
        }
    }

    /// Where `rank`'s input for `call` lies (this rank's own room, or what
    /// the peer's announcement of `call` carried), and its length.
    pub fn input(&self, me: Rank, rank: Rank, call: u64) -> Option<(*mut u8, usize)> {
        if self.room == 0 {
            return None;
        }
        if rank == me {
            return Some((self.own.as_ptr() as *mut u8, self.room));
        }
        match &self.peers.get(rank as usize)?[(call % 2) as usize] {
            Some(c) if c.call == call => Some((
                c.message.payload() as *mut u8,
                c.message.header.len as usize,
            )),
            _ => None,
        }
    }

    /// This rank's input for `call` is `len` bytes of its room.
    pub fn stage(&mut self, call: u64, len: usize) {
        self.staged = Some((call, len.min(self.room)));
    }

    /// The bytes the announcement of the call `header` names carries:
    /// this rank's staged input when it is that call's, else none. As a
    /// pointer and length, so the transport can send them while it
    /// borrows itself mutably: the cells stay put and hold `len` bytes
    /// (`stage` caps it at the room), and nothing but the communicator —
    /// before it announces the call — writes them.
    pub fn carried(&self, header: &Header) -> (*const u8, usize) {
        let len = match self.staged {
            Some((call, len)) if call == header.call => len,
            _ => 0,
        };
        (self.own.as_ptr() as *const u8, len)
    }

    /// The newest call `from` announced since the last look; the inputs
    /// every announcement carried are kept (by call parity).
    pub fn take_announcements(&mut self, mail: &mut Mailbox, from: Rank) -> Option<Header> {
        let mut newest = None;
        for m in mail.announcements(from) {
            newest = Some(m.header.clone());
            self.keep(from, m);
        }
        newest
    }

    /// Keep the input `from`'s announcement `message` carried (even an
    /// empty one: a one-shot input may be 0 bytes).
    fn keep(&mut self, from: Rank, message: Message) {
        let call = message.header.call;
        if let Some(peer) = self.peers.get_mut(from as usize) {
            peer[(call % 2) as usize] = Some(Carried { call, message });
        }
    }
}
