//! The MPI transport: every message an MPI non-blocking send on the
//! group's own communicator, so MPI's engine (vader/sm on a node, UCX,
//! InfiniBand or TCP off it) moves the bytes.
//!
//! A message travels as the frame the TCP transport would write
//! (`message::frame`: prefix, header, payload), so both share their
//! checks, credits and mailbox. A data message is built in place: the
//! executor writes its payload into a buffer that already has room for
//! the prefix and header in front, and that buffer is what MPI sends — no
//! copy on this side; the receiver receives the frame into one buffer and
//! hands the executor the payload inside it. Frames from one peer match
//! in the order sent (MPI does not let a sender's messages overtake each
//! other).
//!
//! A frame larger than the fragment size goes as several MPI messages
//! (`wire`: the first's tag says how many follow), each small enough to
//! go eagerly. A message past MPI's eager limit waits for the receiver
//! to answer its rendezvous, which it does only inside an MPI call: with
//! more ranks than cores, or a rank busy reducing, that handshake stalls
//! the link where TCP's socket buffers would have taken the bytes.
//! Measured on the lab's 1 Gbit/s links, 2 hosts × 2 ranks, 16 MiB:
//! whole 512 KiB messages ran 12–28 % behind ferrocoll's own TCP,
//! fragments of 63 KiB (under OpenMPI's 64 KiB TCP eager limit) level
//! with it. On a fabric whose rendezvous moves data without the host
//! (RDMA), whole messages (`ProcessConfig::mpi_fragment_bytes = 0`) save
//! the per-fragment cost.
//!
//! The **calling thread** drives MPI, as with TCP: whenever it waits it
//! completes sends, matches arriving messages (`MPI_Improbe`) and starts
//! receiving them (`MPI_Imrecv`), delivering each peer's frames in the
//! order they were matched. This transport makes no blocking MPI call, so
//! a wait keeps the timeout and a failure heard meanwhile ends it (the
//! library itself may still hold a call briefly: OpenMPI's TCP transport
//! runs its own error path when a peer hangs up).
//!
//! Failures: a rank that fails sends `fail` frames to every peer — from
//! the thread that aborts when MPI was granted `MPI_THREAD_MULTIPLE`,
//! else from the calling thread at its next look. MPI tells nobody of a
//! process that died; under `mpirun` the launcher ends the job, and
//! otherwise the waiting calls end at the timeout. An MPI call that
//! fails marks its peer lost.

mod wire;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;
use ferrocoll_core::link::{Header, Incoming, Links};

use super::message::frame::{BYE, MAX_REASON};
use super::message::mailbox::Mailbox;
use super::message::staging::Staging;
use super::{CONTROL_CHANNEL, Position, Transport};
use crate::mpi::raw::{Comm, Threading};
use crate::mpi::{Mpi, MpiGroup};
use wire::{Receiving, Sending};

/// How long a waiting rank polls MPI before it starts to sleep between
/// looks; yielding its core meanwhile when there are more ranks than cores.
const SPIN: Duration = Duration::from_micros(200);

/// The longest sleep between two looks at MPI while nothing is in flight:
/// a message from another host waits at most this long on top of the
/// network (MPI has no descriptor to sleep on, so the sleep grows from a
/// few microseconds). While a send or receive is in flight the rank never
/// sleeps: MPI moves a large message only inside calls on both sides (its
/// rendezvous handshake), so every nap there would stall the transfer.
const MAX_NAP: Duration = Duration::from_micros(100);

/// The longest sleep while a send or receive is in flight.
pub(crate) const DRIVEN_NAP: Duration = Duration::from_micros(20);

/// How long a rank that leaves waits for its peers' goodbyes, so that the
/// communicator is freed with nothing in flight (else it is kept).
const PARTING: Duration = Duration::from_secs(2);

/// Buffers kept for reuse: a link's worth of messages on a few links.
const SPARES: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the calling thread shares with threads that abort the group.
struct Shared {
    rank: Rank,
    world: u32,
    /// This rank's own failure (with the rank that caused it); first wins.
    own_failure: Mutex<Option<(Rank, String)>>,
    position: AtomicU64,
    /// Moves when `own_failure` is set, so a waiter looks again.
    alarms: AtomicU64,
    /// Other threads may call MPI (`MPI_THREAD_MULTIPLE`): an abort sends
    /// its `fail` frames itself.
    others_may_send: bool,
    /// The communicator for other threads' sends; `None` once the
    /// transport is gone (held while sending, so it is never freed under one).
    comm: Mutex<Option<Arc<Comm>>>,
    /// Sends other threads started, for the calling thread to complete.
    adopted: Mutex<Vec<Sending>>,
    /// This rank's failure is still to be told (the calling thread does).
    untold: AtomicBool,
}

impl Shared {
    /// Record this rank's failure, caused by `culprit` (first wins), and
    /// tell every peer (now where this thread may, else soon).
    fn fail(&self, culprit: Rank, reason: &str) {
        {
            let mut own = lock(&self.own_failure);
            if own.is_some() {
                return;
            }
            *own = Some((culprit, reason.to_owned()));
        }
        self.alarms.fetch_add(1, Ordering::AcqRel);
        self.untold.store(true, Ordering::Release);
        if self.others_may_send {
            self.tell(culprit, reason);
        }
    }

    /// Send the `fail` frames, once.
    fn tell(&self, culprit: Rank, reason: &str) {
        let comm = lock(&self.comm);
        let Some(comm) = comm.as_ref() else {
            return;
        };
        if !self.untold.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut end = reason.len().min(MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let at = self.position.load(Ordering::Relaxed);
        let mut started = Vec::new();
        for peer in (0..self.world).filter(|&p| p != self.rank) {
            let frame = wire::fail_frame(culprit, at, &reason[..end]);
            // A peer we cannot tell learns from the launcher or its timeout.
            if let Ok(s) = Sending::start(comm, peer, frame) {
                started.push(s);
            }
        }
        lock(&self.adopted).extend(started);
    }
}

/// One rank's end of the MPI transport.
pub(crate) struct MpiTransport {
    rank: Rank,
    slots: u64,
    spin: bool,
    /// The largest data payload a peer may send (a frame beyond it is a
    /// protocol error).
    max_payload: usize,
    /// Frames longer than this go as fragments this long (0: whole).
    fragment: usize,
    shared: Arc<Shared>,
    mail: Mailbox,
    /// Rooms handed out and not committed yet, per link.
    rooms: HashMap<(Rank, u32), Vec<u64>>,
    sending: Vec<Sending>,
    /// Buffers whose sends completed, for the next rooms.
    spare: Vec<Vec<u64>>,
    /// Per peer, receives in the order their messages were matched.
    receiving: Vec<VecDeque<Receiving>>,
    /// Per peer, whether receiving from it failed (see `broken`).
    broken: Vec<bool>,
    staging: Staging,
    /// Declared before `_mpi`: the communicator is freed before MPI may
    /// be finalized.
    comm: Option<Arc<Comm>>,
    _mpi: Mpi,
}

impl MpiTransport {
    /// This rank's links over `group`'s communicator (whose ranks are the
    /// group's); `max_payload` bytes at most per message, `one_shot_room`
    /// of input a one-shot call may publish; frames longer than
    /// `fragment` bytes go in fragments (0: whole). (No timeout: nothing
    /// here blocks; the executor bounds its waits.)
    pub fn new(
        group: &MpiGroup,
        slots: u32,
        max_payload: usize,
        one_shot_room: usize,
        fragment: usize,
    ) -> Self {
        let (rank, world) = (group.comm.rank(), group.comm.size());
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        MpiTransport {
            rank,
            slots: u64::from(slots),
            spin: world as usize <= cores,
            max_payload: max_payload.max(one_shot_room),
            fragment,
            shared: Arc::new(Shared {
                rank,
                world,
                own_failure: Mutex::new(None),
                position: AtomicU64::new(0),
                alarms: AtomicU64::new(0),
                others_may_send: group.mpi.threading() == Threading::Multiple,
                comm: Mutex::new(Some(group.comm.clone())),
                adopted: Mutex::new(Vec::new()),
                untold: AtomicBool::new(false),
            }),
            mail: Mailbox::new(world as usize),
            rooms: HashMap::new(),
            sending: Vec::new(),
            spare: Vec::new(),
            receiving: (0..world).map(|_| VecDeque::new()).collect(),
            broken: vec![false; world as usize],
            staging: Staging::new(one_shot_room, world as usize),
            comm: Some(group.comm.clone()),
            _mpi: group.mpi.clone(),
        }
    }

    fn comm(&self) -> &Comm {
        self.comm
            .as_ref()
            .expect("the communicator lives as long as the transport")
    }

    /// One look at MPI without blocking: complete sends, tell a pending
    /// failure, match and receive what arrived, deliver what completed.
    fn progress(&mut self) {
        let adopted = std::mem::take(&mut *lock(&self.shared.adopted));
        self.sending.extend(adopted);
        if self.shared.untold.load(Ordering::Acquire)
            && let Some((culprit, reason)) = lock(&self.shared.own_failure).clone()
        {
            self.shared.tell(culprit, &reason);
            let adopted = std::mem::take(&mut *lock(&self.shared.adopted));
            self.sending.extend(adopted);
        }
        self.complete_sends();
        self.match_arrivals();
        self.deliver_arrivals();
    }

    fn complete_sends(&mut self) {
        let mut i = 0;
        while i < self.sending.len() {
            match self.sending[i].test() {
                Ok(false) => i += 1,
                Ok(true) => {
                    let done = self.sending.swap_remove(i);
                    if self.spare.len() < SPARES {
                        self.spare.push(done.into_buffer());
                    }
                }
                Err(e) => {
                    // Other fragments of it may still be under way: the
                    // buffer is left to MPI.
                    let failed = self.sending.swap_remove(i);
                    self.note_lost(failed.to(), &e.to_string());
                    failed.abandon();
                }
            }
        }
    }

    fn match_arrivals(&mut self) {
        loop {
            let matched = match self.comm().probe() {
                Ok(Some(m)) => m,
                Ok(None) => return,
                Err(e) => {
                    self.shared.fail(self.rank, &format!("MPI: {e}"));
                    return;
                }
            };
            let from = matched.from as usize;
            if from >= self.receiving.len() {
                continue;
            }
            // A fragment belongs to the one frame of its peer still
            // announcing more (only a failure told from another thread
            // can come between a frame's fragments); anything else starts
            // a frame.
            let open = (matched.tag == wire::MORE)
                .then(|| self.receiving[from].iter_mut().find(|f| f.more > 0))
                .flatten();
            let started = match open {
                Some(frame) => frame.add(matched),
                None => Receiving::start(matched, self.max_payload, &mut self.spare)
                    .map(|r| self.receiving[from].push_back(r)),
            };
            if let Err(e) = started {
                self.broken(from as Rank, &e.to_string());
            }
        }
    }

    fn deliver_arrivals(&mut self) {
        let world = self.shared.world;
        for peer in 0..self.receiving.len() {
            while let Some(front) = self.receiving[peer].front_mut() {
                match front.test() {
                    Ok(false) => break,
                    Ok(true) => {}
                    Err(e) => {
                        self.broken(peer as Rank, &e.to_string());
                        break;
                    }
                }
                let done = self.receiving[peer].pop_front().expect("just tested");
                if self.broken[peer] {
                    // Received only to take it off MPI's queue.
                    continue;
                }
                let delivered = done
                    .into_frame(self.max_payload, world)
                    .and_then(|f| self.mail.deliver(peer as Rank, f, self.slots));
                if let Err(e) = delivered {
                    self.broken[peer] = true;
                    self.mail.ended(peer as Rank, &e);
                }
            }
        }
    }

    /// Receiving from `peer` failed with `what`: nothing more it sent can
    /// be trusted to be in order, so it is a failure of the group (as a
    /// protocol error is), and whatever else arrives from it is dropped.
    /// The receives under way are left to MPI, with their buffers.
    fn broken(&mut self, peer: Rank, what: &str) {
        let p = peer as usize;
        self.broken[p] = true;
        for r in self.receiving[p].drain(..) {
            r.abandon();
        }
        let why = std::io::Error::new(std::io::ErrorKind::InvalidData, format!("MPI: {what}"));
        self.mail.ended(peer, &why);
    }

    /// `peer` is gone: an MPI call concerning it failed with `what`.
    fn note_lost(&mut self, peer: Rank, what: &str) {
        if let Some(lost) = self.mail.lost.get_mut(peer as usize) {
            lost.get_or_insert_with(|| format!("lost: {what}"));
            self.mail.ticket += 1;
        }
    }

    /// The error of a send to `to` that could not start.
    fn send_failed(&mut self, to: Rank, what: &str) -> CommError {
        if let Some((rank, reason)) = self.failed_here() {
            return CommError::PeerFailed { rank, reason };
        }
        self.note_lost(to, what);
        CommError::PeerFailed {
            rank: to,
            reason: self.farewell(to),
        }
    }

    /// Start sending `frame` (whose first `len` bytes count) to `to`, with
    /// the credits this rank owes it sent first.
    fn send(&mut self, to: Rank, frame: Vec<u64>, len: usize) -> Result<(), CommError> {
        for (channel, count) in self.mail.take_owed(to) {
            let ack = wire::ack_frame(channel, count);
            match Sending::start(self.comm(), to, ack) {
                Ok(s) => self.sending.push(s),
                Err(e) => return Err(self.send_failed(to, &e.to_string())),
            }
        }
        match Sending::start_len(self.comm(), to, frame, len, self.fragment) {
            Ok(s) => {
                self.sending.push(s);
                Ok(())
            }
            Err(e) => Err(self.send_failed(to, &e.to_string())),
        }
    }

    /// Send every credit owed, to every peer still here.
    fn settle_credits(&mut self) {
        for peer in 0..self.mail.owed.len() as Rank {
            if self.mail.owed[peer as usize].is_empty() || self.mail.gone(peer) {
                continue;
            }
            for (channel, count) in self.mail.take_owed(peer) {
                match Sending::start(self.comm(), peer, wire::ack_frame(channel, count)) {
                    Ok(s) => self.sending.push(s),
                    Err(e) => self.note_lost(peer, &e.to_string()),
                }
            }
        }
    }

    /// A buffer of at least `words` from the spares, else a new one.
    fn buffer(&mut self, words: usize) -> Vec<u64> {
        wire::take_spare(&mut self.spare, words)
    }

    /// This rank's failure, or the earliest failure a peer reported at or
    /// before this rank's position.
    fn failed_here(&self) -> Option<(Rank, String)> {
        lock(&self.shared.own_failure).clone().or_else(|| {
            let here = self.shared.position.load(Ordering::Relaxed);
            self.mail.failure_at(here)
        })
    }

    /// Whether a send or receive is in flight, which only this thread's
    /// looks at MPI move along.
    fn in_flight(&self) -> bool {
        !self.sending.is_empty() || self.receiving.iter().any(|q| !q.is_empty())
    }

    /// Whether every peer said goodbye (or is gone) and nothing is in flight.
    fn parted(&self) -> bool {
        (0..self.shared.world).all(|p| p == self.rank || self.mail.gone(p)) && !self.in_flight()
    }
}

// SAFETY: rooms are this transport's send buffers past the frame's front,
// sized for the message and left alone until the commit (then MPI owns
// them until the send completes); payloads lie in received buffers, kept
// queued until the release. No heap and no posts: no peer's memory is
// ever named.
unsafe impl Links for MpiTransport {
    fn reserve(
        &mut self,
        to: Rank,
        channel: u32,
        len: usize,
    ) -> Result<Option<*mut u8>, CommError> {
        if channel != CONTROL_CHANNEL && self.unconsumed(to, channel) >= self.slots {
            return Ok(None);
        }
        let words = wire::frame_words(len);
        let mut room = match self.rooms.remove(&(to, channel)) {
            Some(r) if r.len() >= words => r,
            _ => self.buffer(words),
        };
        let at = wire::payload_of(&mut room);
        self.rooms.insert((to, channel), room);
        Ok(Some(at))
    }

    fn commit(&mut self, to: Rank, channel: u32, header: &Header) -> Result<(), CommError> {
        let len = header.len as usize;
        let mut frame = match self.rooms.remove(&(to, channel)) {
            Some(r) => r,
            None => self.buffer(wire::frame_words(0)),
        };
        let bytes = wire::seal_data(&mut frame, channel, header);
        self.send(to, frame, bytes)?;
        debug_assert_eq!(bytes, wire::frame_bytes(len));
        self.mail.count_sent(to, channel);
        Ok(())
    }

    fn peek(&mut self, from: Rank, channel: u32) -> Result<Option<Incoming>, CommError> {
        Ok(self.mail.peek(from, channel))
    }

    fn peek_header(&mut self, from: Rank, channel: u32) -> Option<Header> {
        self.mail.peek_header(from, channel)
    }

    fn release(&mut self, from: Rank, channel: u32) -> Result<(), CommError> {
        if let Some(m) = self.mail.release(from, channel)
            && self.spare.len() < SPARES
        {
            self.spare.push(m.data);
        }
        Ok(())
    }

    fn unconsumed(&mut self, to: Rank, channel: u32) -> u64 {
        self.mail.unconsumed(to, channel)
    }

    fn ticket(&self) -> u64 {
        self.mail
            .ticket
            .wrapping_add(self.shared.alarms.load(Ordering::Acquire))
    }

    fn wait(&mut self, seen: u64, until: Instant) {
        // A peer may be waiting for credit this rank owes: never sleep on it.
        self.settle_credits();
        let start = Instant::now();
        let mut nap = Duration::from_micros(2);
        loop {
            self.progress();
            if self.ticket() != seen {
                return;
            }
            let now = Instant::now();
            if now >= until {
                return;
            }
            if now < start + SPIN {
                if self.spin {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            let longest = if self.driven() { DRIVEN_NAP } else { MAX_NAP };
            std::thread::sleep(nap.min(longest).min(until - now));
            nap = (nap * 2).min(MAX_NAP);
        }
    }

    fn check(&mut self) -> Result<(), CommError> {
        self.progress();
        match self.failed_here() {
            Some((rank, reason)) => Err(CommError::PeerFailed { rank, reason }),
            None => Ok(()),
        }
    }

    fn max_channel(&self) -> Option<u32> {
        None
    }

    fn max_message(&self) -> Option<usize> {
        None
    }

    fn departed(&mut self, peer: Rank) -> bool {
        self.mail.departed(peer)
    }

    fn farewell(&self, peer: Rank) -> String {
        self.mail.farewell(peer)
    }
}

impl Transport for MpiTransport {
    fn set_position(&mut self, position: Position) {
        self.shared.position.store(position, Ordering::Relaxed);
    }

    fn fail(&mut self, culprit: Rank, reason: &str) {
        self.shared.fail(culprit, reason);
        self.progress();
    }

    fn aborter(&self) -> Box<dyn Fn(&str) + Send + Sync> {
        let (shared, rank) = (self.shared.clone(), self.rank);
        Box::new(move |reason| shared.fail(rank, reason))
    }

    fn depart(&mut self) {
        if self.mail.closing {
            return;
        }
        self.mail.closing = true;
        for peer in (0..self.shared.world).filter(|&p| p != self.rank) {
            if let Ok(s) = Sending::start(self.comm(), peer, wire::control_frame(BYE, 0)) {
                self.sending.push(s);
            }
        }
    }

    fn settle(&mut self) {
        self.settle_credits();
    }

    fn driven(&self) -> bool {
        self.in_flight()
    }

    fn staging(&self, rank: Rank, call: u64) -> Option<(*mut u8, usize)> {
        self.staging.input(self.rank, rank, call)
    }

    fn stage(&mut self, call: u64, len: usize) {
        self.staging.stage(call, len);
    }

    /// An announcement is a data frame on the control channel; for the
    /// call this rank staged a one-shot input for, it carries that input.
    fn announce(&mut self, to: Rank, header: &Header) -> Result<bool, CommError> {
        let (own, staged) = self.staging.carried(header);
        let mut frame = self.buffer(wire::frame_words(staged));
        // SAFETY: `carried` names `staged` bytes of this rank's staging;
        // the frame's room holds them (sized above).
        unsafe { std::ptr::copy_nonoverlapping(own, wire::payload_of(&mut frame), staged) };
        let head = Header::new(header.call, staged, header.signature());
        let bytes = wire::seal_data(&mut frame, CONTROL_CHANNEL, &head);
        self.send(to, frame, bytes).map(|()| true)
    }

    /// The newest announcement from `from`; the inputs earlier ones carry
    /// are kept by call parity for the one-shot protocol.
    fn announcement(&mut self, from: Rank) -> Result<Option<Header>, CommError> {
        Ok(self.staging.take_announcements(&mut self.mail, from))
    }
}

impl Drop for MpiTransport {
    fn drop(&mut self) {
        self.depart();
        let until = Instant::now() + PARTING;
        while !self.parted() && Instant::now() < until {
            self.progress();
            std::thread::sleep(Duration::from_micros(100));
        }
        // No other thread sends from here on.
        *lock(&self.shared.comm) = None;
        self.progress();
        let comm = self.comm.take();
        if self.parted() {
            drop(comm);
        } else {
            // Something is still in flight (a peer that never said goodbye,
            // a send nobody received): MPI keeps the buffers and the
            // communicator until it finalizes.
            tracing::debug!(
                rank = self.rank,
                sends = self.sending.len(),
                "leaving MPI links with messages in flight; their communicator is kept"
            );
            for s in self.sending.drain(..) {
                s.abandon();
            }
            for r in self.receiving.iter_mut().flat_map(|q| q.drain(..)) {
                r.abandon();
            }
            if let Some(comm) = comm {
                comm.keep();
            }
        }
    }
}
