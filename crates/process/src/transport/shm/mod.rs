//! The shared-memory transport: processes of one host.
//!
//! Each rank owns one segment (a tmpfs file every rank maps) holding a
//! control block and its **incoming** links: for every (sender, channel), a
//! ring of `slots` slots of a fixed size, each a header and a payload. The
//! sender writes a slot and then publishes it by bumping the link's
//! `pushed` counter; the receiver reduces straight out of the slot and
//! frees it by bumping `popped`. Each counter has exactly one writer, so
//! the ring needs no lock — only release/acquire ordering. A message
//! therefore costs one copy into the receiver's segment, the same as a
//! pipe or MPI's shared-memory path, and none out of it.
//!
//! Waiting sleeps on the rank's doorbell word (a futex on Linux), which
//! every sender and every consumer rings. While asleep, a rank checks
//! every few milliseconds that its peers' processes still run, so a killed
//! peer becomes an error long before the timeout.

mod doorbell;
pub(crate) mod heap;
mod layout;
pub(crate) mod liveness;
pub(crate) mod segment;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use super::{Position, Transport};
use ferrocoll_core::link::{HEADER_BYTES, Header};
use ferrocoll_core::link::{HeapMap, Incoming, Links};
use heap::{Heap, Heaps};
pub(crate) use layout::Shape;
use layout::*;
use segment::Segment;

/// One rank's end of the shared-memory transport.
pub(crate) struct ShmTransport {
    rank: Rank,
    /// This rank's number in the whole group, which failures name: its
    /// `rank` among the segments where shared memory links only the ranks
    /// of one host in a larger group.
    name: Rank,
    segments: Arc<Segments>,
    pids: Vec<u32>,
    spin: bool,
    last_health: Instant,
    /// Per peer, why it is gone when its process ended without leaving.
    lost: Vec<Option<String>>,
    /// This rank's position (shared with its aborter).
    position: Arc<AtomicU64>,
    /// The call this rank's board holds.
    posted: Option<u64>,
    /// The group's shared heaps, when it has them.
    heaps: Option<Heaps>,
}

impl ShmTransport {
    /// Create this rank's segment at `path`, sized for `shape`.
    pub fn create_segment(path: &std::path::Path, shape: &Shape) -> std::io::Result<Segment> {
        let segment = Segment::create(path, shape.segment_bytes())?;
        // SAFETY: a fresh mapping no one else has opened yet.
        unsafe {
            (segment.base() as *mut u64).write(MAGIC);
            (segment.base().add(PID_AT) as *mut u32).write(std::process::id());
        }
        Ok(segment)
    }

    /// Check a peer's freshly opened segment.
    pub fn validate(segment: &Segment) -> std::io::Result<u32> {
        // SAFETY: the segment is at least CONTROL_BYTES long (`open` checked
        // the length) and its creator wrote these words before publishing it.
        let (magic, pid) = unsafe {
            (
                (segment.base() as *const u64).read(),
                (segment.base().add(PID_AT) as *const u32).read(),
            )
        };
        if magic != MAGIC {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not a ferrocoll segment",
            ));
        }
        Ok(pid)
    }

    /// The transport over every rank's mapped segment (`all[rank]` is ours).
    pub fn new(rank: Rank, shape: Shape, all: Vec<Segment>, pids: Vec<u32>) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let segments = Arc::new(Segments { shape, all });
        let heaps = (shape.heap_bytes > 0).then(|| {
            let at = |r: usize| segments.all[r].base() as usize + shape.heap_at();
            let mapped: Vec<(usize, usize)> = (0..segments.all.len())
                .map(|r| (at(r), shape.heap_bytes))
                .collect();
            Heaps {
                own: Arc::new(Heap::new(
                    segments.clone(),
                    at(rank as usize),
                    shape.heap_bytes,
                )),
                map: Arc::new(HeapMap::new(rank, mapped)),
            }
        });
        ShmTransport {
            rank,
            name: rank,
            spin: shape.world_size as usize <= cores,
            heaps,
            segments,
            pids,
            last_health: Instant::now(),
            lost: vec![None; shape.world_size as usize],
            position: Arc::new(AtomicU64::new(0)),
            posted: None,
        }
    }

    /// The same transport inside a larger group, where this rank is `name`
    /// (the peers link by segment index, failures name group ranks).
    pub fn named(mut self, name: Rank) -> Self {
        self.name = name;
        self
    }

    /// Sleep on this rank's doorbell until it moves past `seen` or
    /// `until`, without spinning first (a caller that also watches other
    /// links spins over all of them itself).
    pub fn doze(&mut self, seen: u64, until: Instant) {
        let now = Instant::now();
        if self.ticket() == seen && now < until {
            let limit = (until - now).min(HEALTH_PERIOD);
            doorbell::sleep(self.segments.bell(self.rank), seen as u32, limit);
        }
        if self.last_health.elapsed() >= HEALTH_PERIOD {
            self.health();
        }
    }

    /// Note the peers whose processes ended without leaving: gone, not
    /// failed — a call fails only where it waits on one of them.
    fn health(&mut self) {
        self.last_health = Instant::now();
        for peer in 0..self.segments.shape.world_size {
            if peer == self.rank || self.lost[peer as usize].is_some() {
                continue;
            }
            let state = self.segments.word32(peer, STATE_AT).load(Ordering::Acquire);
            if state == DEPARTED || state == FAILED {
                continue;
            }
            let pid = self.pids[peer as usize];
            if !liveness::alive(pid) {
                self.lost[peer as usize] = Some(format!(
                    "lost: its process {pid} exited without leaving the group (killed or crashed)"
                ));
                // Whoever waits on it looks again.
                self.segments.ring(self.rank);
            }
        }
    }
}

// SAFETY: rooms and payloads are slots of segments every rank maps for the
// group's life, each sized by the shape and indexed by counters checked
// against it; the heap map names those mappings; a post is taken only
// after its offset and length were checked against the receiver's heap;
// a peer's heap stays mapped after any failure, so giving up needs nothing.
unsafe impl Links for ShmTransport {
    fn reserve(
        &mut self,
        to: Rank,
        channel: u32,
        len: usize,
    ) -> Result<Option<*mut u8>, CommError> {
        let s = &self.segments;
        if len > s.shape.slot_bytes {
            return Err(CommError::Capacity {
                what: format!(
                    "a {len}-byte message does not fit the {}-byte shared-memory slots (raise ProcessConfig::max_message_bytes)",
                    s.shape.slot_bytes
                ),
            });
        }
        let pushed = s.counter(to, self.rank, channel, 0).load(Ordering::Relaxed);
        let popped = s
            .counter(to, self.rank, channel, POPPED_AT)
            .load(Ordering::Acquire);
        if pushed.saturating_sub(popped) >= u64::from(s.shape.slots) {
            return Ok(None);
        }
        // SAFETY: the payload follows the header inside the slot.
        Ok(Some(unsafe {
            s.slot(to, self.rank, channel, pushed).add(HEADER_BYTES)
        }))
    }

    fn commit(&mut self, to: Rank, channel: u32, header: &Header) -> Result<(), CommError> {
        let s = &self.segments;
        let pushed = s.counter(to, self.rank, channel, 0);
        let index = pushed.load(Ordering::Relaxed);
        let bytes = header.encode();
        // SAFETY: the slot is free (reserve saw room and only this rank
        // sends on the link), and the header region is HEADER_BYTES long.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                s.slot(to, self.rank, channel, index),
                HEADER_BYTES,
            );
        }
        pushed.store(index + 1, Ordering::Release);
        s.ring(to);
        Ok(())
    }

    fn peek(&mut self, from: Rank, channel: u32) -> Result<Option<Incoming>, CommError> {
        let Some((header, slot)) = self.peek_header_at(from, channel) else {
            return Ok(None);
        };
        // The length comes from another process: never read past the slot.
        // Only a value's own bytes lie in the slot; a reference (checked
        // against the slot when read) or a value written to this rank's
        // post may describe more, and whoever reads such a message must
        // refuse it unless it reads it as such.
        if header.holds_value() && header.len > self.segments.shape.slot_bytes as u64 {
            return Err(CommError::PeerFailed {
                rank: from,
                reason: format!(
                    "protocol error: a message of {} bytes in a {}-byte slot",
                    header.len, self.segments.shape.slot_bytes
                ),
            });
        }
        Ok(Some(Incoming {
            call: header.call,
            len: header.len as usize,
            // SAFETY: the payload follows the header inside the slot.
            payload: unsafe { slot.add(HEADER_BYTES) },
        }))
    }

    fn peek_header(&mut self, from: Rank, channel: u32) -> Option<Header> {
        self.peek_header_at(from, channel).map(|(h, _)| h)
    }

    fn release(&mut self, from: Rank, channel: u32) -> Result<(), CommError> {
        let s = &self.segments;
        let popped = s.counter(self.rank, from, channel, POPPED_AT);
        popped.store(popped.load(Ordering::Relaxed) + 1, Ordering::Release);
        s.ring(from);
        Ok(())
    }

    fn unconsumed(&mut self, to: Rank, channel: u32) -> u64 {
        let s = &self.segments;
        s.counter(to, self.rank, channel, 0)
            .load(Ordering::Relaxed)
            .saturating_sub(
                s.counter(to, self.rank, channel, POPPED_AT)
                    .load(Ordering::Acquire),
            )
    }

    fn ticket(&self) -> u64 {
        u64::from(
            self.segments
                .word32(self.rank, DOORBELL_AT)
                .load(Ordering::Acquire),
        )
    }

    fn wait(&mut self, seen: u64, until: Instant) {
        let bell = self.segments.word32(self.rank, DOORBELL_AT);
        let seen = seen as u32;
        let spin_until = Instant::now() + SPIN;
        let mut spins = 0u32;
        while bell.load(Ordering::Acquire) == seen {
            if self.spin {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            spins += 1;
            if spins % 64 == 0 && Instant::now() >= spin_until {
                break;
            }
        }
        let now = Instant::now();
        if bell.load(Ordering::Acquire) == seen && now < until {
            let limit = (until - now).min(HEALTH_PERIOD);
            doorbell::sleep(self.segments.bell(self.rank), seen, limit);
        }
        if self.last_health.elapsed() >= HEALTH_PERIOD {
            self.health();
        }
    }

    fn check(&mut self) -> Result<(), CommError> {
        let s = &self.segments;
        if let Some((rank, reason, _)) = s.failure(self.rank) {
            return Err(CommError::PeerFailed { rank, reason });
        }
        let here = self.position.load(Ordering::Relaxed);
        // Of the failures that concern this position, the earliest.
        let first = (0..s.shape.world_size)
            .filter_map(|peer| s.failure(peer))
            .filter(|&(_, _, at)| at <= here)
            .min_by_key(|&(_, _, at)| at);
        match first {
            Some((rank, reason, _)) => Err(CommError::PeerFailed { rank, reason }),
            None => Ok(()),
        }
    }

    fn max_channel(&self) -> Option<u32> {
        Some(self.segments.shape.channels - 1)
    }

    fn max_message(&self) -> Option<usize> {
        Some(self.segments.shape.slot_bytes)
    }

    fn departed(&mut self, peer: Rank) -> bool {
        self.departed_peer(peer) || self.lost[peer as usize].is_some()
    }

    fn farewell(&self, peer: Rank) -> String {
        self.lost[peer as usize]
            .clone()
            .unwrap_or_else(|| "left the group (its communicator was dropped)".to_owned())
    }

    fn heaps(&self) -> Option<Arc<HeapMap>> {
        self.heaps.as_ref().map(|h| h.map.clone())
    }

    fn consumed(&self, from: Rank, channel: u32) -> u64 {
        self.segments
            .counter(self.rank, from, channel, POPPED_AT)
            .load(Ordering::Relaxed)
    }

    fn post(&mut self, from: Rank, channel: u32, seq: u64, offset: usize, len: usize) {
        let s = &self.segments;
        let post = s.counter(self.rank, from, channel, POST_SEQ_AT);
        // One post at a time, and only for a message not sent yet.
        if post.load(Ordering::Acquire) != 0
            || s.counter(self.rank, from, channel, 0)
                .load(Ordering::Acquire)
                > seq
        {
            return;
        }
        s.counter(self.rank, from, channel, POST_OFFSET_AT)
            .store(offset as u64, Ordering::Relaxed);
        s.counter(self.rank, from, channel, POST_LEN_AT)
            .store(len as u64, Ordering::Relaxed);
        post.store(seq + 1, Ordering::Release);
    }

    fn post_taken(&mut self, from: Rank, channel: u32, seq: u64) -> bool {
        self.segments
            .counter(self.rank, from, channel, POST_SEQ_AT)
            .load(Ordering::Acquire)
            == TAKEN | (seq + 1)
    }

    fn clear_post(&mut self, from: Rank, channel: u32, seq: u64) {
        let post = self.segments.counter(self.rank, from, channel, POST_SEQ_AT);
        // The post for this message, used or not, is spent.
        for was in [seq + 1, TAKEN | (seq + 1)] {
            if post
                .compare_exchange(was, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    fn withdraw_post(&mut self, from: Rank, channel: u32) -> Option<u64> {
        let post = self.segments.counter(self.rank, from, channel, POST_SEQ_AT);
        loop {
            let now = post.load(Ordering::Acquire);
            if now == 0 {
                return None;
            }
            if now & TAKEN != 0 {
                return Some((now & !TAKEN) - 1);
            }
            if post
                .compare_exchange(now, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return None;
            }
        }
    }

    fn sent_to_me(&self, from: Rank, channel: u32) -> u64 {
        self.segments
            .counter(self.rank, from, channel, 0)
            .load(Ordering::Acquire)
    }

    fn give_back_post(&mut self, to: Rank, channel: u32) {
        let s = &self.segments;
        let next = s.counter(to, self.rank, channel, 0).load(Ordering::Relaxed);
        let _ = s
            .counter(to, self.rank, channel, POST_SEQ_AT)
            .compare_exchange(TAKEN | (next + 1), 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    fn take_post(&mut self, to: Rank, channel: u32, len: usize) -> Option<*mut u8> {
        let s = &self.segments;
        let heaps = self.heaps.as_ref()?;
        let next = s.counter(to, self.rank, channel, 0).load(Ordering::Relaxed);
        let post = s.counter(to, self.rank, channel, POST_SEQ_AT);
        if post.load(Ordering::Acquire) != next + 1 {
            return None;
        }
        let offset = s
            .counter(to, self.rank, channel, POST_OFFSET_AT)
            .load(Ordering::Relaxed);
        let posted = s
            .counter(to, self.rank, channel, POST_LEN_AT)
            .load(Ordering::Relaxed);
        // The receiver's own numbers, checked like anything from a peer.
        let (base, heap) = heaps.map.of(to)?;
        let fits = posted == len as u64
            && offset
                .checked_add(posted)
                .is_some_and(|end| end <= heap as u64);
        if !fits
            || post
                .compare_exchange(
                    next + 1,
                    TAKEN | (next + 1),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return None;
        }
        Some((base + offset as usize) as *mut u8)
    }
}

impl Transport for ShmTransport {
    fn own_heap(&self) -> Option<Arc<Heap>> {
        self.heaps.as_ref().map(|h| h.own.clone())
    }

    fn set_position(&mut self, position: Position) {
        self.position.store(position, Ordering::Relaxed);
    }

    fn fail(&mut self, culprit: Rank, reason: &str) {
        let at = self.position.load(Ordering::Relaxed);
        self.segments.fail(self.rank, culprit, reason, at);
    }

    fn aborter(&self) -> Box<dyn Fn(&str) + Send + Sync> {
        let (segments, rank, name) = (self.segments.clone(), self.rank, self.name);
        let position = self.position.clone();
        Box::new(move |reason| segments.fail(rank, name, reason, position.load(Ordering::Relaxed)))
    }

    fn depart(&mut self) {
        let s = &self.segments;
        let _ = s.word32(self.rank, STATE_AT).compare_exchange(
            LIVE,
            DEPARTED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        // Wake anyone blocked on this rank, so they see it left.
        for r in 0..s.shape.world_size {
            s.ring(r);
        }
    }

    fn staging(&self, rank: Rank, call: u64) -> Option<(*mut u8, usize)> {
        let s = &self.segments.shape;
        if s.staging_bytes == 0 {
            return None;
        }
        let at = s.staging_at() + (call % 2) as usize * s.staging_bytes;
        // SAFETY: the staging lies inside every segment by the shape.
        Some((
            unsafe { self.segments.all[rank as usize].base().add(at) },
            s.staging_bytes,
        ))
    }

    /// Post the call on this rank's own board (once), then ring `to`:
    /// announcing writes nothing into any peer's memory.
    fn announce(&mut self, to: Rank, header: &Header) -> Result<bool, CommError> {
        if self.posted != Some(header.call) {
            self.segments.post(self.rank, header);
            self.posted = Some(header.call);
        }
        self.segments.ring(to);
        Ok(true)
    }

    fn announcement(&mut self, from: Rank) -> Result<Option<Header>, CommError> {
        Ok(self.segments.board(from))
    }
}

impl ShmTransport {
    fn departed_peer(&self, peer: Rank) -> bool {
        self.segments.word32(peer, STATE_AT).load(Ordering::Acquire) == DEPARTED
    }

    fn peek_header_at(&self, from: Rank, channel: u32) -> Option<(Header, *mut u8)> {
        let s = &self.segments;
        let pushed = s
            .counter(self.rank, from, channel, 0)
            .load(Ordering::Acquire);
        let popped = s
            .counter(self.rank, from, channel, POPPED_AT)
            .load(Ordering::Relaxed);
        if pushed == popped {
            return None;
        }
        let slot = s.slot(self.rank, from, channel, popped);
        let mut bytes = [0u8; HEADER_BYTES];
        // SAFETY: the slot was published (acquire above) and stays ours
        // until we bump `popped`.
        unsafe { std::ptr::copy_nonoverlapping(slot, bytes.as_mut_ptr(), HEADER_BYTES) };
        Some((Header::decode(&bytes), slot))
    }
}
