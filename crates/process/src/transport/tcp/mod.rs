//! The TCP transport: one connection per pair of ranks, any hosts.
//!
//! Frames are a 16-byte prefix (kind, channel, length) and, for data, the
//! message header and payload. A reader thread per connection drains the
//! socket into per-(sender, channel) queues and never blocks on the
//! executor, so a sender's write always completes while its peer lives.
//! The verifier's bounded links are kept with credits: a sender has at
//! most `slots` unacknowledged messages per link, and the receiver returns
//! one credit (an ack frame) per message it consumes.
//!
//! A peer that fails sends a `fail` frame with its reason; one that leaves
//! cleanly sends `bye`. A connection that closes without either — the
//! process was killed, or its host went away — marks the peer lost, which
//! every waiting call reports at once.
//!
//! Connections are made by `setup`'s handshake, which admits only the
//! peer that should dial and proves the job secret. After it, nothing read
//! off the wire is trusted: `frame::read_frame` checks every frame's kind,
//! length, channel (below `frame::MAX_WIRE_CHANNELS`, or the point-to-point
//! channel), a failure's culprit (a rank of the group) and a data header
//! against its payload; a frame that fails a check is a protocol error
//! blamed on the peer that sent it, never a panic or a huge allocation.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use super::{Incoming, Transport};
use crate::wire::Header;

mod frame;

#[doc(hidden)]
pub use frame::fuzz_frames;
use frame::{ACK, BYE, DATA, FAIL, Frame, MAX_REASON, PREFIX_BYTES, read_frame};

struct Message {
    header: Header,
    /// `u64`s so the payload is aligned for every element type.
    data: Vec<u64>,
}

#[derive(Default)]
struct Inbox {
    ticket: u64,
    queues: HashMap<(Rank, u32), VecDeque<Message>>,
    /// Credits returned per outgoing link.
    acked: HashMap<(Rank, u32), u64>,
    /// This rank's own failure (with the rank that caused it), then the
    /// first peer failure heard of.
    own_failure: Option<(Rank, String)>,
    failure: Option<(Rank, String)>,
    departed: Vec<bool>,
    closing: bool,
}

struct Shared {
    inbox: Mutex<Inbox>,
    bell: Condvar,
    /// Writing halves, one per peer (`None` for this rank, and once a
    /// write failed: a frame cut short would garble everything after it).
    writers: Vec<Mutex<Option<TcpStream>>>,
    /// Handles to shut a connection down while its writer is busy.
    closers: Vec<Option<TcpStream>>,
    /// The largest payload a data frame may announce.
    max_payload: usize,
}

impl Shared {
    fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self, mut inbox: MutexGuard<'_, Inbox>) {
        inbox.ticket += 1;
        drop(inbox);
        self.bell.notify_all();
    }

    /// Write one frame to `to`. A control frame (`wait` false) is skipped
    /// — and the connection shut, so the peer still learns something is
    /// wrong — rather than wait behind a data write that is stuck.
    fn send_frame(
        &self,
        to: Rank,
        kind: u32,
        channel: u32,
        parts: &[&[u8]],
        wait: bool,
    ) -> std::io::Result<()> {
        let writer = &self.writers[to as usize];
        let mut w = if wait {
            writer.lock().unwrap_or_else(|e| e.into_inner())
        } else {
            match writer.try_lock() {
                Ok(w) => w,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if let Some(s) = &self.closers[to as usize] {
                        let _ = s.shutdown(Shutdown::Both);
                    }
                    return Err(std::io::ErrorKind::WouldBlock.into());
                }
            }
        };
        let Some(stream) = w.as_mut() else {
            return if self.closers[to as usize].is_none() {
                Ok(())
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "an earlier write to this peer failed",
                ))
            };
        };
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut prefix = [0u8; PREFIX_BYTES];
        prefix[0..4].copy_from_slice(&kind.to_le_bytes());
        prefix[4..8].copy_from_slice(&channel.to_le_bytes());
        prefix[8..16].copy_from_slice(&(len as u64).to_le_bytes());
        let written = (|| {
            stream.write_all(&prefix)?;
            for p in parts {
                stream.write_all(p)?;
            }
            Ok(())
        })();
        if written.is_err() {
            let _ = stream.shutdown(Shutdown::Both);
            *w = None;
        }
        written
    }

    /// Record this rank's failure, caused by `culprit` (first wins), and
    /// tell every peer.
    fn fail(&self, culprit: Rank, reason: &str) {
        {
            let mut inbox = self.inbox();
            if inbox.own_failure.is_some() {
                return;
            }
            inbox.own_failure = Some((culprit, reason.to_owned()));
            self.bump(inbox);
        }
        let mut end = reason.len().min(MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        for peer in 0..self.writers.len() as Rank {
            let _ = self.send_frame(peer, FAIL, culprit, &[&reason.as_bytes()[..end]], false);
        }
    }
}

/// One rank's end of the TCP transport.
pub(crate) struct TcpTransport {
    rank: Rank,
    slots: u64,
    shared: Arc<Shared>,
    sent: HashMap<(Rank, u32), u64>,
    staging: HashMap<(Rank, u32), Vec<u64>>,
    readers: Vec<JoinHandle<()>>,
    streams: Vec<TcpStream>,
}

impl TcpTransport {
    /// Take over one connected stream per peer (`None` for this rank).
    pub fn new(
        rank: Rank,
        streams: Vec<Option<TcpStream>>,
        slots: u32,
        timeout: Duration,
        max_payload: usize,
    ) -> std::io::Result<Self> {
        let n = streams.len();
        let mut writers = Vec::with_capacity(n);
        let mut readers = Vec::with_capacity(n);
        let mut closers = Vec::with_capacity(n);
        let mut kept = Vec::new();
        for stream in &streams {
            match stream {
                Some(s) => {
                    s.set_nodelay(true)?;
                    s.set_write_timeout(Some(timeout))?;
                    writers.push(Mutex::new(Some(s.try_clone()?)));
                    readers.push(Some(s.try_clone()?));
                    closers.push(Some(s.try_clone()?));
                    kept.push(s.try_clone()?);
                }
                None => {
                    writers.push(Mutex::new(None));
                    readers.push(None);
                    closers.push(None);
                }
            }
        }
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox {
                departed: vec![false; n],
                ..Inbox::default()
            }),
            bell: Condvar::new(),
            writers,
            closers,
            max_payload,
        });
        let handles = readers
            .into_iter()
            .enumerate()
            .filter_map(|(peer, s)| s.map(|s| (peer as Rank, s)))
            .map(|(peer, stream)| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("ferrocoll-tcp-{rank}<-{peer}"))
                    .spawn(move || read_loop(peer, stream, &shared))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(TcpTransport {
            rank,
            slots: u64::from(slots),
            shared,
            sent: HashMap::new(),
            staging: HashMap::new(),
            readers: handles,
            streams: kept,
        })
    }

    fn lost(&self, to: Rank, e: &std::io::Error) -> CommError {
        let reason = if self.departed_peer(to) {
            "left the group (its communicator was dropped) while messages were still due".to_owned()
        } else {
            format!("lost: connection from rank {} broke: {e}", self.rank)
        };
        let mut inbox = self.shared.inbox();
        if inbox.failure.is_none() {
            inbox.failure = Some((to, reason.clone()));
        }
        drop(inbox);
        CommError::PeerFailed { rank: to, reason }
    }
}

/// Read frames from `peer` until the connection ends.
fn read_loop(peer: Rank, mut stream: TcpStream, shared: &Shared) {
    let world_size = shared.writers.len() as u32;
    let ended = loop {
        let frame = match read_frame(&mut stream, shared.max_payload, world_size) {
            Ok(frame) => frame,
            Err(e) => break e,
        };
        let mut inbox = shared.inbox();
        match frame {
            Frame::Data {
                channel,
                header,
                data,
            } => inbox
                .queues
                .entry((peer, channel))
                .or_default()
                .push_back(Message { header, data }),
            Frame::Ack { channel } => *inbox.acked.entry((peer, channel)).or_default() += 1,
            Frame::Fail { culprit, reason } => {
                if inbox.failure.is_none() {
                    inbox.failure = Some((culprit, reason));
                }
            }
            Frame::Bye => inbox.departed[peer as usize] = true,
        }
        shared.bump(inbox);
    };
    let mut inbox = shared.inbox();
    if !inbox.closing && !inbox.departed[peer as usize] && inbox.failure.is_none() {
        let why = if matches!(
            ended.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
        ) {
            "its connection closed without leaving the group (process killed or crashed)".to_owned()
        } else {
            format!("its connection failed: {ended}")
        };
        inbox.failure = Some((peer, format!("lost: {why}")));
    }
    shared.bump(inbox);
}

impl Transport for TcpTransport {
    fn reserve(
        &mut self,
        to: Rank,
        channel: u32,
        len: usize,
    ) -> Result<Option<*mut u8>, CommError> {
        let sent = self.sent.get(&(to, channel)).copied().unwrap_or(0);
        let acked = self
            .shared
            .inbox()
            .acked
            .get(&(to, channel))
            .copied()
            .unwrap_or(0);
        if sent.saturating_sub(acked) >= self.slots {
            return Ok(None);
        }
        let buf = self.staging.entry((to, channel)).or_default();
        buf.resize(len.div_ceil(8).max(buf.len()), 0);
        Ok(Some(buf.as_mut_ptr() as *mut u8))
    }

    fn commit(&mut self, to: Rank, channel: u32, header: &Header) -> Result<(), CommError> {
        let len = header.len as usize;
        let buf = self.staging.entry((to, channel)).or_default();
        // SAFETY: `reserve` sized the staging buffer for `len` bytes.
        let payload = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, len) };
        let head = header.encode();
        if let Err(e) = self
            .shared
            .send_frame(to, DATA, channel, &[&head, payload], true)
        {
            return Err(self.lost(to, &e));
        }
        *self.sent.entry((to, channel)).or_default() += 1;
        Ok(())
    }

    fn peek(&mut self, from: Rank, channel: u32) -> Result<Option<Incoming>, CommError> {
        let inbox = self.shared.inbox();
        Ok(inbox
            .queues
            .get(&(from, channel))
            .and_then(|q| q.front())
            .map(|m| Incoming {
                call: m.header.call,
                len: m.header.len as usize,
                // The vector's heap buffer does not move while the message
                // is queued; only this thread pops it.
                payload: m.data.as_ptr() as *const u8,
            }))
    }

    fn peek_header(&mut self, from: Rank, channel: u32) -> Option<Header> {
        self.shared
            .inbox()
            .queues
            .get(&(from, channel))
            .and_then(|q| q.front())
            .map(|m| m.header.clone())
    }

    fn release(&mut self, from: Rank, channel: u32) -> Result<(), CommError> {
        let popped = self
            .shared
            .inbox()
            .queues
            .get_mut(&(from, channel))
            .and_then(|q| q.pop_front());
        drop(popped);
        if let Err(e) = self.shared.send_frame(from, ACK, channel, &[], true) {
            // A peer that left cleanly needs no more credit.
            if self.departed_peer(from) {
                return Ok(());
            }
            return Err(self.lost(from, &e));
        }
        Ok(())
    }

    fn unconsumed(&mut self, to: Rank, channel: u32) -> u64 {
        let sent = self.sent.get(&(to, channel)).copied().unwrap_or(0);
        sent.saturating_sub(
            self.shared
                .inbox()
                .acked
                .get(&(to, channel))
                .copied()
                .unwrap_or(0),
        )
    }

    fn ticket(&self) -> u64 {
        self.shared.inbox().ticket
    }

    fn wait(&mut self, seen: u64, until: Instant) {
        let mut inbox = self.shared.inbox();
        while inbox.ticket == seen {
            let now = Instant::now();
            if now >= until {
                return;
            }
            inbox = self
                .shared
                .bell
                .wait_timeout(inbox, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn check(&mut self) -> Result<(), CommError> {
        let inbox = self.shared.inbox();
        if let Some((rank, reason)) = &inbox.own_failure {
            return Err(CommError::PeerFailed {
                rank: *rank,
                reason: reason.clone(),
            });
        }
        if let Some((rank, reason)) = &inbox.failure {
            return Err(CommError::PeerFailed {
                rank: *rank,
                reason: reason.clone(),
            });
        }
        Ok(())
    }

    fn fail(&mut self, culprit: Rank, reason: &str) {
        self.shared.fail(culprit, reason);
    }

    fn max_channel(&self) -> Option<u32> {
        None
    }

    fn max_message(&self) -> Option<usize> {
        None
    }

    fn aborter(&self) -> Box<dyn Fn(&str) + Send + Sync> {
        let (shared, rank) = (self.shared.clone(), self.rank);
        Box::new(move |reason| shared.fail(rank, reason))
    }

    fn depart(&mut self) {
        self.shared.inbox().closing = true;
        for peer in 0..self.shared.writers.len() as Rank {
            let _ = self.shared.send_frame(peer, BYE, 0, &[], false);
        }
    }

    fn departed(&mut self, peer: Rank) -> bool {
        self.departed_peer(peer)
    }
}

impl TcpTransport {
    fn departed_peer(&self, peer: Rank) -> bool {
        let inbox = self.shared.inbox();
        inbox.departed.get(peer as usize).copied().unwrap_or(false)
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.depart();
        // Our reads end once the peers close their side; shutting down our
        // write side lets them see the close after `bye`.
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Write);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        for h in self.readers.drain(..) {
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::frame::MAX_WIRE_CHANNELS;
    use super::*;
    use crate::wire::HEADER_BYTES;
    use std::net::TcpListener;

    /// Rank 0's transport, connected to a test socket playing rank 1.
    fn pair() -> (TcpTransport, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mine, _) = listener.accept().unwrap();
        let t =
            TcpTransport::new(0, vec![None, Some(mine)], 2, Duration::from_secs(5), 4096).unwrap();
        (t, peer)
    }

    fn frame(kind: u32, channel: u32, len: u64) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&kind.to_le_bytes());
        f.extend_from_slice(&channel.to_le_bytes());
        f.extend_from_slice(&len.to_le_bytes());
        f
    }

    fn failure_of(t: &mut TcpTransport) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Err(e) = t.check() {
                return e.to_string();
            }
            assert!(Instant::now() < deadline, "the bad frame went unnoticed");
            let seen = t.ticket();
            t.wait(seen, Instant::now() + Duration::from_millis(50));
        }
    }

    #[test]
    fn frames_announcing_absurd_lengths_fail_the_peer_without_allocating() {
        for bad in [
            frame(DATA, 0, 1 << 60),
            frame(DATA, 0, 3),
            frame(FAIL, 0, 1 << 40),
            frame(ACK, 0, 8),
            frame(99, 0, 0),
        ] {
            let (mut t, mut peer) = pair();
            peer.write_all(&bad).unwrap();
            let e = failure_of(&mut t);
            assert!(
                e.contains("rank 1 failed") && e.contains("protocol error"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_fail_frame_blaming_a_rank_outside_the_group_is_a_protocol_error_of_the_sender() {
        for culprit in [2, 99, u32::MAX] {
            let (mut t, mut peer) = pair();
            peer.write_all(&frame(FAIL, culprit, 4)).unwrap();
            peer.write_all(b"boom").unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            let e = loop {
                if let Err(e) = t.check() {
                    break e;
                }
                assert!(Instant::now() < deadline, "the bad frame went unnoticed");
                std::thread::sleep(Duration::from_millis(5));
            };
            match &e {
                CommError::PeerFailed { rank, reason } => {
                    assert_eq!(*rank, 1, "the sender is blamed, not rank {culprit}: {e}");
                    assert!(reason.contains("protocol error"), "{e}");
                }
                other => panic!("{other}"),
            }
        }
    }

    #[test]
    fn frames_on_channels_past_the_wire_bound_are_protocol_errors() {
        for bad in [
            frame(ACK, MAX_WIRE_CHANNELS, 0),
            frame(ACK, u32::MAX - 1, 0),
        ] {
            let (mut t, mut peer) = pair();
            peer.write_all(&bad).unwrap();
            let e = failure_of(&mut t);
            assert!(e.contains("protocol error") && e.contains("channel"), "{e}");
        }
        // The point-to-point channel is one a peer may use.
        let mut ack = frame(ACK, u32::MAX, 0).as_slice().to_vec();
        ack.extend(frame(BYE, 0, 0));
        let mut r = ack.as_slice();
        assert!(matches!(
            read_frame(&mut r, 64, 2),
            Ok(Frame::Ack { channel: u32::MAX })
        ));
        assert!(matches!(read_frame(&mut r, 64, 2), Ok(Frame::Bye)));
    }

    #[test]
    fn the_frame_reader_survives_truncated_and_garbled_streams() {
        let header = Header::new(3, 8, "send").encode();
        let mut good = frame(DATA, 0, (HEADER_BYTES + 8) as u64);
        good.extend_from_slice(&header);
        good.extend_from_slice(&[1u8; 8]);
        for cut in 0..good.len() {
            let mut r = &good[..cut];
            assert!(read_frame(&mut r, 64, 2).is_err(), "cut at {cut}");
        }
        let mut r = good.as_slice();
        assert!(matches!(read_frame(&mut r, 64, 2), Ok(Frame::Data { .. })));
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let bytes: Vec<u8> = (0..64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            fuzz_frames(&bytes);
        }
    }

    #[test]
    fn a_payload_that_disagrees_with_its_header_is_refused() {
        let (mut t, mut peer) = pair();
        let header = Header::new(0, 100, "all-reduce").encode();
        peer.write_all(&frame(DATA, 0, (HEADER_BYTES + 8) as u64))
            .unwrap();
        peer.write_all(&header).unwrap();
        peer.write_all(&[0u8; 8]).unwrap();
        let e = failure_of(&mut t);
        assert!(e.contains("header says 100"), "{e}");
        assert!(t.peek(1, 0).unwrap().is_none(), "nothing was queued");
    }

    #[test]
    fn a_closed_connection_is_a_lost_peer_and_bye_is_not() {
        let (mut t, peer) = pair();
        drop(peer);
        assert!(failure_of(&mut t).contains("lost"));
        let (mut t, mut peer) = pair();
        peer.write_all(&frame(BYE, 0, 0)).unwrap();
        drop(peer);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !t.departed(1) {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(t.check().is_ok(), "leaving cleanly is not a failure");
    }
}
