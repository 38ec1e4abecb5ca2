//! The TCP transport: one connection per pair of ranks, any hosts.
//!
//! Frames are a 16-byte prefix (kind, channel, length) and, for data, the
//! message header and payload (`frame`). The sockets are non-blocking and
//! the **calling thread** moves the bytes, as MPI's progress engine does:
//! whenever it waits — for a message, for credit, for a write to drain —
//! it reads every connection (`inflow`), so there is no reader thread to
//! hand each message over through a wake-up, and a write that would block
//! reads meanwhile, so two ranks writing to each other never deadlock.
//! A waiting rank spins briefly when every rank has a core, then sleeps in
//! `poll(2)` on its connections.
//!
//! The verifier's bounded links are kept with credits: a sender has at
//! most `slots` unacknowledged messages per link. The receiver owes one
//! credit per message it consumes and returns them in batches — with its
//! next frame to that peer, before it sleeps, and when its call ends — so
//! a call costs no acknowledgement of its own on the wire. Announcements
//! (the control channel) need no credit: the agreement bounds them to two
//! per link. A one-shot call's announcement carries the rank's input.
//!
//! A peer that fails sends a `fail` frame with its reason; one that leaves
//! cleanly sends `bye`. A connection that closes without either — the
//! process was killed, or its host went away — marks the peer lost, which
//! every waiting call reports at once.
//!
//! Connections are made by `setup`'s handshake, which admits only the
//! peer that should dial and proves the job secret. After it, nothing read
//! off the wire is trusted: `frame::parse_prefix` and `frame::decode` check
//! every frame's kind, length, channel (below `frame::MAX_WIRE_CHANNELS`,
//! or the point-to-point channel), a failure's culprit (a rank of the
//! group) and a data header against its payload; a frame that fails a
//! check is a protocol error blamed on the peer that sent it, never a
//! panic or a huge allocation.

use std::collections::HashMap;
use std::io::IoSlice;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use super::{CONTROL_CHANNEL, Transport};
use ferrocoll_core::link::Header;
use ferrocoll_core::link::{Incoming, Links};

mod inflow;
mod poller;
mod silence;

use super::message::frame::{ACK, BYE, DATA, FAIL, MAX_REASON, encode_prefix};
use super::message::mailbox::Mailbox;
use super::message::staging::Staging;
use inflow::Inflow;
#[doc(hidden)]
pub use inflow::fuzz_frames;
use poller::{Poller, Waker};
use silence::SILENCE;

/// How long a waiting rank polls its connections before it sleeps (about
/// one round trip on loopback); yielding its core meanwhile when there
/// are more ranks than cores.
const SPIN: Duration = Duration::from_micros(100);

/// How long a frame that is not data (a failure, a goodbye) may wait for
/// room in a peer's socket before the connection is shut instead.
const CONTROL_PATIENCE: Duration = Duration::from_millis(200);

/// What the calling thread shares with threads that abort the group.
struct Shared {
    /// This rank's own failure (with the rank that caused it); first wins.
    own_failure: Mutex<Option<(Rank, String)>>,
    /// This rank's position, which its failures are stamped with.
    position: AtomicU64,
    /// Moves when `own_failure` is set, so a waiter looks again.
    alarms: AtomicU64,
    waker: Waker,
    /// Writing halves, one per peer (`None` for this rank, and once a
    /// write failed: a frame cut short would garble everything after it).
    writers: Vec<Mutex<Option<TcpStream>>>,
    /// Handles to shut a connection down while its writer is busy.
    closers: Vec<Option<TcpStream>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Write one small frame to `to` now, waiting at most `patience` for
    /// room; a frame that cannot go whole shuts the connection, so the
    /// peer still learns that something is wrong. A busy writer (another
    /// thread mid-frame) is not waited for: the connection is shut.
    fn send_control(&self, to: Rank, kind: u32, channel: u32, body: &[u8], patience: Duration) {
        let writer = &self.writers[to as usize];
        let mut w = match writer.try_lock() {
            Ok(w) => w,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                if let Some(s) = &self.closers[to as usize] {
                    let _ = s.shutdown(Shutdown::Both);
                }
                return;
            }
        };
        let Some(stream) = w.as_mut() else {
            return;
        };
        let prefix = encode_prefix(kind, channel, body.len());
        let mut parts = [IoSlice::new(&prefix), IoSlice::new(body)];
        let until = Instant::now() + patience;
        if write_all(stream, &mut parts, until, &mut || Ok(Vec::new())).is_err() {
            let _ = stream.shutdown(Shutdown::Both);
            *w = None;
        }
    }

    /// Record this rank's failure, caused by `culprit` (first wins), wake
    /// the calling thread, and tell every peer.
    fn fail(&self, culprit: Rank, reason: &str) {
        {
            let mut own = lock(&self.own_failure);
            if own.is_some() {
                return;
            }
            *own = Some((culprit, reason.to_owned()));
        }
        self.alarms.fetch_add(1, Ordering::AcqRel);
        self.waker.wake();
        let mut end = reason.len().min(MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let mut body = self.position.load(Ordering::Relaxed).to_le_bytes().to_vec();
        body.extend_from_slice(&reason.as_bytes()[..end]);
        for peer in 0..self.writers.len() as Rank {
            self.send_control(peer, FAIL, culprit, &body, CONTROL_PATIENCE);
        }
    }
}

/// Write every byte of `parts` to a non-blocking `stream` by `until`;
/// `meanwhile` runs whenever the socket is full and returns the
/// connections to wake for besides room to write, or an error to give up
/// with (the calling thread reads its connections there, so a peer
/// writing to it at the same time can finish and drain this socket in
/// turn, and a failure heard meanwhile ends the wait).
fn write_all(
    stream: &mut TcpStream,
    mut parts: &mut [IoSlice<'_>],
    until: Instant,
    meanwhile: &mut dyn FnMut() -> std::io::Result<Vec<poller::Fd>>,
) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut parts, 0);
    while !parts.is_empty() {
        match send_vectored(stream, parts) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(k) => IoSlice::advance_slices(&mut parts, k),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let now = Instant::now();
                if now >= until {
                    return Err(std::io::ErrorKind::TimedOut.into());
                }
                let fds = meanwhile()?;
                poller::wait_writable(stream, &fds, until - now);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One gathering write that never raises SIGPIPE (a program may not ignore
/// it): a peer that is gone is an `EPIPE` error, like any other loss.
/// (Elsewhere than Linux, std's vectored write.)
#[cfg(target_os = "linux")]
fn send_vectored(stream: &TcpStream, parts: &[IoSlice<'_>]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is guaranteed ABI-compatible with iovec on Unix.
    msg.msg_iov = parts.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = parts.len().min(libc::UIO_MAXIOV as usize) as _;
    // SAFETY: `msg` points at `parts`, live and unmodified for the call;
    // sendmsg only reads the buffers.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

#[cfg(not(target_os = "linux"))]
fn send_vectored(mut stream: &TcpStream, parts: &[IoSlice<'_>]) -> std::io::Result<usize> {
    std::io::Write::write_vectored(&mut stream, parts)
}

/// One peer's incoming side.
struct Link {
    stream: TcpStream,
    inflow: Inflow,
}

/// One rank's end of the TCP transport.
pub(crate) struct TcpTransport {
    rank: Rank,
    slots: u64,
    timeout: Duration,
    spin: bool,
    shared: Arc<Shared>,
    links: Vec<Option<Link>>,
    mail: Mailbox,
    poller: Poller,
    outgoing: HashMap<(Rank, u32), Vec<u64>>,
    staging: Staging,
}

impl TcpTransport {
    /// Take over one connected stream per peer (`None` for this rank);
    /// `one_shot_room` bytes of input a one-shot call may publish.
    pub fn new(
        rank: Rank,
        streams: Vec<Option<TcpStream>>,
        slots: u32,
        timeout: Duration,
        max_payload: usize,
        one_shot_room: usize,
    ) -> std::io::Result<Self> {
        let n = streams.len();
        let max_payload = max_payload.max(one_shot_room);
        let mut writers = Vec::with_capacity(n);
        let mut links = Vec::with_capacity(n);
        let mut closers = Vec::with_capacity(n);
        for stream in streams {
            match stream {
                Some(s) => {
                    s.set_nodelay(true)?;
                    silence::bound(&s, SILENCE);
                    s.set_nonblocking(true)?;
                    writers.push(Mutex::new(Some(s.try_clone()?)));
                    closers.push(Some(s.try_clone()?));
                    links.push(Some(Link {
                        stream: s,
                        inflow: Inflow::new(max_payload, n as u32),
                    }));
                }
                None => {
                    writers.push(Mutex::new(None));
                    closers.push(None);
                    links.push(None);
                }
            }
        }
        let (poller, waker) = Poller::new()?;
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        Ok(TcpTransport {
            rank,
            slots: u64::from(slots),
            timeout,
            spin: n <= cores,
            shared: Arc::new(Shared {
                own_failure: Mutex::new(None),
                position: AtomicU64::new(0),
                alarms: AtomicU64::new(0),
                waker,
                writers,
                closers,
            }),
            links,
            mail: Mailbox::new(n),
            poller,
            outgoing: HashMap::new(),
            staging: Staging::new(one_shot_room, n),
        })
    }

    /// Read whatever every connection holds, without blocking.
    fn progress(&mut self) {
        let slots = self.slots;
        for peer in 0..self.links.len() {
            let Some(link) = &mut self.links[peer] else {
                continue;
            };
            let mail = &mut self.mail;
            let read = link
                .inflow
                .pump(&mut link.stream, |f| mail.deliver(peer as Rank, f, slots));
            if let Err(e) = read {
                // Our side of the connection closes too, so a peer that left
                // (and waits in its drop for our close) sees it at once.
                let _ = link.stream.shutdown(Shutdown::Write);
                self.links[peer] = None;
                self.mail.ended(peer as Rank, &e);
            }
        }
    }

    /// Write one data frame to `to`, with the credits this rank owes it in
    /// front (one write for both).
    fn write_data(&mut self, to: Rank, channel: u32, parts: &[&[u8]]) -> std::io::Result<()> {
        let owed = self.mail.take_owed(to);
        let acks: Vec<[u8; 24]> = owed.iter().map(|&(c, k)| ack_frame(c, k)).collect();
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let prefix = encode_prefix(DATA, channel, len);
        let mut slices: Vec<IoSlice<'_>> = acks.iter().map(|a| IoSlice::new(a)).collect();
        slices.push(IoSlice::new(&prefix));
        slices.extend(parts.iter().map(|p| IoSlice::new(p)));
        self.write_frames(to, &mut slices)
    }

    /// Send every credit owed, to every peer.
    fn settle_credits(&mut self) {
        for peer in 0..self.links.len() as Rank {
            if self.mail.owed[peer as usize].is_empty() {
                continue;
            }
            let acks: Vec<[u8; 24]> = self
                .mail
                .take_owed(peer)
                .iter()
                .map(|&(c, k)| ack_frame(c, k))
                .collect();
            let mut slices: Vec<IoSlice<'_>> = acks.iter().map(|a| IoSlice::new(a)).collect();
            if self.mail.gone(peer) {
                // A peer that is gone needs no credit.
                continue;
            }
            if let Err(e) = self.write_frames(peer, &mut slices) {
                // The next call that waits on this peer reports it.
                self.note_lost(peer, &e);
            }
        }
    }

    fn write_frames(&mut self, to: Rank, slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        let shared = self.shared.clone();
        let mut w = lock(&shared.writers[to as usize]);
        let Some(stream) = w.as_mut() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "an earlier write to this peer failed",
            ));
        };
        let until = Instant::now() + self.timeout;
        let written = write_all(stream, slices, until, &mut || {
            self.progress();
            if self.failed_here().is_some() || self.mail.gone(to) {
                return Err(std::io::Error::other("the group failed meanwhile"));
            }
            Ok(self.open_fds())
        });
        if written.is_err() {
            let _ = stream.shutdown(Shutdown::Both);
            *w = None;
        }
        written
    }

    /// The error for a write to `to` that failed with `e`: this rank's own
    /// failure or the first one heard of when there is one (an abort shuts
    /// connections mid-write; a write gives up once the group failed),
    /// else `to` is lost.
    fn note_lost(&mut self, to: Rank, e: &std::io::Error) -> CommError {
        if let Some((rank, reason)) = self.failed_here() {
            return CommError::PeerFailed { rank, reason };
        }
        let reason = if self.mail.departed[to as usize] {
            "left the group (its communicator was dropped) while messages were still due".to_owned()
        } else {
            let reason = format!("lost: connection from rank {} broke: {e}", self.rank);
            self.mail.lost[to as usize].get_or_insert(reason).clone()
        };
        self.mail.ticket += 1;
        CommError::PeerFailed { rank: to, reason }
    }

    /// This rank's failure, or the earliest failure a peer reported at or
    /// before this rank's position.
    fn failed_here(&self) -> Option<(Rank, String)> {
        lock(&self.shared.own_failure).clone().or_else(|| {
            let here = self.shared.position.load(Ordering::Relaxed);
            self.mail.failure_at(here)
        })
    }

    fn open_fds(&self) -> Vec<poller::Fd> {
        self.links
            .iter()
            .flatten()
            .map(|l| poller::fd_of(&l.stream))
            .collect()
    }
}

fn ack_frame(channel: u32, count: u64) -> [u8; 24] {
    let mut f = [0u8; 24];
    f[..16].copy_from_slice(&encode_prefix(ACK, channel, 8));
    f[16..].copy_from_slice(&count.to_le_bytes());
    f
}

// SAFETY: rooms are this transport's staging buffers and payloads its
// receive buffers, each sized for the message and left alone until the
// commit or release; it offers no heap and no posts, so no peer's memory
// is ever named.
unsafe impl Links for TcpTransport {
    fn reserve(
        &mut self,
        to: Rank,
        channel: u32,
        len: usize,
    ) -> Result<Option<*mut u8>, CommError> {
        if channel != CONTROL_CHANNEL && self.unconsumed(to, channel) >= self.slots {
            return Ok(None);
        }
        let buf = self.outgoing.entry((to, channel)).or_default();
        buf.resize(len.div_ceil(8).max(buf.len()), 0);
        Ok(Some(buf.as_mut_ptr() as *mut u8))
    }

    fn commit(&mut self, to: Rank, channel: u32, header: &Header) -> Result<(), CommError> {
        let len = header.len as usize;
        let buf = self.outgoing.remove(&(to, channel)).unwrap_or_default();
        // SAFETY: `reserve` sized the buffer for `len` bytes.
        let payload = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, len) };
        let head = header.encode();
        let written = self.write_data(to, channel, &[&head, payload]);
        self.outgoing.insert((to, channel), buf);
        if let Err(e) = written {
            return Err(self.note_lost(to, &e));
        }
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
        self.mail.release(from, channel);
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
        let spin_until = Instant::now() + SPIN;
        loop {
            self.progress();
            if self.ticket() != seen {
                return;
            }
            let now = Instant::now();
            if now >= until {
                return;
            }
            if now < spin_until {
                // With more ranks than cores, a waiter gives its core to
                // a rank that has work instead of burning it.
                if self.spin {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            let fds = self.open_fds();
            self.poller.sleep(&fds, until - now);
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

impl Transport for TcpTransport {
    fn set_position(&mut self, position: super::Position) {
        self.shared.position.store(position, Ordering::Relaxed);
    }

    fn fail(&mut self, culprit: Rank, reason: &str) {
        self.shared.fail(culprit, reason);
    }

    fn aborter(&self) -> Box<dyn Fn(&str) + Send + Sync> {
        let (shared, rank) = (self.shared.clone(), self.rank);
        Box::new(move |reason| shared.fail(rank, reason))
    }

    fn depart(&mut self) {
        // No credits are settled here: every call settled its own, and a
        // rank that leaves consumes nothing more.
        if self.mail.closing {
            return;
        }
        self.mail.closing = true;
        for peer in 0..self.shared.writers.len() as Rank {
            self.shared
                .send_control(peer, BYE, 0, &[], CONTROL_PATIENCE);
        }
    }

    fn settle(&mut self) {
        self.settle_credits();
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
        let head = Header::new(header.call, staged, header.signature()).encode();
        // SAFETY: `carried` names `staged` bytes of this rank's staging,
        // which writing a frame leaves alone.
        let payload = unsafe { std::slice::from_raw_parts(own, staged) };
        let written = self.write_data(to, CONTROL_CHANNEL, &[&head, payload]);
        written.map(|()| true).map_err(|e| self.note_lost(to, &e))
    }

    /// The newest announcement from `from`; the inputs earlier ones carry
    /// are kept by call parity for the one-shot protocol.
    fn announcement(&mut self, from: Rank) -> Result<Option<Header>, CommError> {
        Ok(self.staging.take_announcements(&mut self.mail, from))
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.depart();
        // Shutting our write side lets peers see the close after `bye`;
        // reading until they close theirs (bounded) keeps our receive
        // queue empty, so closing sends no reset that could destroy a
        // frame a peer has not read yet.
        for link in self.links.iter().flatten() {
            let _ = link.stream.shutdown(Shutdown::Write);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            self.progress();
            let now = Instant::now();
            if self.links.iter().all(Option::is_none) || now >= deadline {
                break;
            }
            let fds = self.open_fds();
            self.poller.sleep(&fds, deadline - now);
        }
        for link in self.links.iter().flatten() {
            let _ = link.stream.shutdown(Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests;
