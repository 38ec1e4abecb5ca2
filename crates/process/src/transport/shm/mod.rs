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
pub(crate) mod liveness;
pub(crate) mod segment;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use super::{Incoming, Transport};
use crate::wire::{HEADER_BYTES, Header};
use crate::zero_copy::{self, PeerReader};
use heap::{Heap, Heaps};
use segment::Segment;

const MAGIC: u64 = u64::from_le_bytes(*b"fcollshm");
/// Control block: magic, pid, doorbell, state, announced call, failure reason.
const CONTROL_BYTES: usize = 4096;
const PID_AT: usize = 8;
const DOORBELL_AT: usize = 64;
const STATE_AT: usize = 128;
const REASON_LEN_AT: usize = 132;
const CULPRIT_AT: usize = 136;
/// Where this process's probe word lies in its own memory (see
/// [`crate::zero_copy`]).
const PROBE_AT: usize = 144;
/// The announcement board: a sequence word, then a [`Header`] as words.
const BOARD_SEQ_AT: usize = 256;
const BOARD_AT: usize = 264;
const BOARD_WORDS: usize = HEADER_BYTES / 8;
const REASON_AT: usize = 512;
const REASON_BYTES: usize = CONTROL_BYTES - REASON_AT;
/// A link's counters, each on its own cache line.
const LINK_CONTROL_BYTES: usize = 128;
const POPPED_AT: usize = 64;
/// A direct-write post on the link, written by the receiver (after
/// `popped`, on its line): the message number it is for + 1 (0: none,
/// [`TAKEN`]: the sender is writing it), then where in the receiver's
/// heap the value goes, and its length.
const POST_SEQ_AT: usize = 72;
const POST_OFFSET_AT: usize = 80;
const POST_LEN_AT: usize = 88;
/// Set on a post the sender took (it writes, or wrote, the value there);
/// the message number stays, so consuming an earlier message never
/// clears it.
const TAKEN: u64 = 1 << 63;

const LIVE: u32 = 0;
const WRITING: u32 = 1;
const FAILED: u32 = 2;
const DEPARTED: u32 = 3;

/// How often a sleeping rank looks at its peers' processes.
const HEALTH_PERIOD: Duration = Duration::from_millis(20);
/// How long a waiter spins before it sleeps, when ranks have cores of their own.
const SPIN: Duration = Duration::from_micros(30);

/// The shape of every segment of a group; every rank computes the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub world_size: u32,
    /// Channels including the point-to-point one (the last).
    pub channels: u32,
    pub slots: u32,
    pub slot_bytes: usize,
    /// Each half of a rank's one-shot staging (0: no one-shot calls).
    pub staging_bytes: usize,
    /// The shared heap at the end of each segment.
    pub heap_bytes: usize,
}

impl Shape {
    fn slot_stride(&self) -> usize {
        HEADER_BYTES + self.slot_bytes.next_multiple_of(64)
    }

    fn link_bytes(&self) -> usize {
        LINK_CONTROL_BYTES + self.slots as usize * self.slot_stride()
    }

    /// Where the two halves of the one-shot staging start: after the
    /// control block and one link per (other rank, channel).
    fn staging_at(&self) -> usize {
        CONTROL_BYTES
            + (self.world_size as usize).saturating_sub(1)
                * self.channels as usize
                * self.link_bytes()
    }

    /// Where the shared heap starts, on a page of its own.
    fn heap_at(&self) -> usize {
        (self.staging_at() + 2 * self.staging_bytes).next_multiple_of(4096)
    }

    /// Bytes of one rank's segment: links, then the shared heap.
    pub fn segment_bytes(&self) -> usize {
        self.heap_at() + self.heap_bytes
    }

    /// [`segment_bytes`](Self::segment_bytes), or `None` when it does not
    /// fit a `usize` (an absurd world size or slot size).
    pub fn checked_segment_bytes(&self) -> Option<usize> {
        let stride = self
            .slot_bytes
            .checked_next_multiple_of(64)?
            .checked_add(HEADER_BYTES)?;
        let link = stride
            .checked_mul(self.slots as usize)?
            .checked_add(LINK_CONTROL_BYTES)?;
        (self.world_size as usize)
            .saturating_sub(1)
            .checked_mul(self.channels as usize)?
            .checked_mul(link)?
            .checked_add(CONTROL_BYTES)?
            .checked_add(self.staging_bytes.checked_mul(2)?)?
            .checked_next_multiple_of(4096)?
            .checked_add(self.heap_bytes)
    }

    /// Offset of the link from `from` on `channel` in `owner`'s segment.
    fn link_at(&self, owner: Rank, from: Rank, channel: u32) -> usize {
        debug_assert_ne!(owner, from);
        let peer = if from < owner { from } else { from - 1 } as usize;
        CONTROL_BYTES + (peer * self.channels as usize + channel as usize) * self.link_bytes()
    }
}

/// The segments of a group as one rank sees them.
struct Segments {
    shape: Shape,
    all: Vec<Segment>,
}

impl Segments {
    fn word32(&self, rank: Rank, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is a 4-aligned offset inside the control block of a
        // live mapping, and that word is only ever accessed atomically.
        unsafe { AtomicU32::from_ptr(self.all[rank as usize].base().add(at) as *mut u32) }
    }

    fn counter(&self, owner: Rank, from: Rank, channel: u32, at: usize) -> &AtomicU64 {
        let offset = self.shape.link_at(owner, from, channel) + at;
        // SAFETY: link offsets are 64-aligned inside the mapping, and the
        // counters are only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.all[owner as usize].base().add(offset) as *mut u64) }
    }

    fn slot(&self, owner: Rank, from: Rank, channel: u32, index: u64) -> *mut u8 {
        let s = &self.shape;
        let offset = s.link_at(owner, from, channel)
            + LINK_CONTROL_BYTES
            + (index % u64::from(s.slots)) as usize * s.slot_stride();
        // SAFETY: the offset stays inside the owner's mapping by construction.
        unsafe { self.all[owner as usize].base().add(offset) }
    }

    fn ring(&self, rank: Rank) {
        doorbell::ring(self.word32(rank, DOORBELL_AT));
    }

    /// Record `rank`'s failure, caused by `culprit` (first one wins), and
    /// wake everyone.
    fn fail(&self, rank: Rank, culprit: Rank, reason: &str) {
        let state = self.word32(rank, STATE_AT);
        if state
            .compare_exchange(LIVE, WRITING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let bytes = &reason.as_bytes()[..reason.len().min(REASON_BYTES)];
            let base = self.all[rank as usize].base();
            // SAFETY: the WRITING state gives this thread the reason field
            // alone; readers look at it only after seeing FAILED.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(REASON_AT), bytes.len());
            }
            self.word32(rank, REASON_LEN_AT)
                .store(bytes.len() as u32, Ordering::Relaxed);
            self.word32(rank, CULPRIT_AT)
                .store(culprit, Ordering::Relaxed);
            state.store(FAILED, Ordering::Release);
            // Peers that read this rank's heap check this flag after the
            // read: order it before anything the caller writes next.
            fence(Ordering::SeqCst);
        }
        for r in 0..self.shape.world_size {
            self.ring(r);
        }
    }

    fn word64(&self, rank: Rank, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is an 8-aligned offset inside the control block of a
        // live mapping, and that word is only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.all[rank as usize].base().add(at) as *mut u64) }
    }

    /// Publish `header` on `rank`'s board (a seqlock: only `rank` writes it).
    fn post(&self, rank: Rank, header: &Header) {
        let seq = self.word64(rank, BOARD_SEQ_AT);
        let odd = seq.load(Ordering::Relaxed) | 1;
        seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        for (i, word) in header.encode().chunks_exact(8).enumerate() {
            let value = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            self.word64(rank, BOARD_AT + 8 * i)
                .store(value, Ordering::Relaxed);
        }
        seq.store(odd + 1, Ordering::Release);
    }

    /// What `rank`'s board holds: `None` before its first post, or while a
    /// post keeps racing the read.
    fn board(&self, rank: Rank) -> Option<Header> {
        let seq = self.word64(rank, BOARD_SEQ_AT);
        for _ in 0..64 {
            let before = seq.load(Ordering::Acquire);
            if before == 0 {
                return None;
            }
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let mut bytes = [0u8; HEADER_BYTES];
            for i in 0..BOARD_WORDS {
                let w = self.word64(rank, BOARD_AT + 8 * i).load(Ordering::Relaxed);
                bytes[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
            }
            fence(Ordering::Acquire);
            if seq.load(Ordering::Relaxed) == before {
                return Some(Header::decode(&bytes));
            }
        }
        None
    }

    /// `rank`'s failure: the rank that caused it, and why.
    fn failure(&self, rank: Rank) -> Option<(Rank, String)> {
        if self.word32(rank, STATE_AT).load(Ordering::Acquire) != FAILED {
            return None;
        }
        let len =
            (self.word32(rank, REASON_LEN_AT).load(Ordering::Relaxed) as usize).min(REASON_BYTES);
        let mut bytes = vec![0u8; len];
        // SAFETY: FAILED is stored after the reason, which never changes again.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.all[rank as usize].base().add(REASON_AT),
                bytes.as_mut_ptr(),
                len,
            );
        }
        let culprit = self.word32(rank, CULPRIT_AT).load(Ordering::Relaxed);
        Some((culprit, String::from_utf8_lossy(&bytes).into_owned()))
    }
}

/// One rank's end of the shared-memory transport.
pub(crate) struct ShmTransport {
    rank: Rank,
    segments: Arc<Segments>,
    pids: Vec<u32>,
    spin: bool,
    last_health: Instant,
    lost: Option<(Rank, String)>,
    /// The call this rank's board holds.
    posted: Option<u64>,
    /// Reads peers' memory, when the whole group may.
    reader: Option<Arc<PeerReader>>,
    /// The group's shared heaps, when it has them.
    heaps: Option<Arc<Heaps>>,
}

impl ShmTransport {
    /// Create this rank's segment at `path`, sized for `shape`.
    pub fn create_segment(path: &std::path::Path, shape: &Shape) -> std::io::Result<Segment> {
        let segment = Segment::create(path, shape.segment_bytes())?;
        // SAFETY: a fresh mapping no one else has opened yet.
        unsafe {
            (segment.base() as *mut u64).write(MAGIC);
            (segment.base().add(PID_AT) as *mut u32).write(std::process::id());
            (segment.base().add(PROBE_AT) as *mut u64).write(zero_copy::probe_address() as u64);
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
            Arc::new(Heaps {
                own: Arc::new(Heap::new(
                    segments.clone(),
                    at(rank as usize),
                    shape.heap_bytes,
                )),
                mapped: (0..segments.all.len())
                    .map(|r| (at(r), shape.heap_bytes))
                    .collect(),
            })
        });
        ShmTransport {
            rank,
            spin: shape.world_size as usize <= cores,
            heaps,
            segments,
            pids,
            last_health: Instant::now(),
            lost: None,
            posted: None,
            reader: None,
        }
    }

    /// Whether this rank may read every peer's memory: each peer's probe
    /// word, at the address its segment names, reads back right.
    pub fn probe_peer_reads(&self) -> bool {
        (0..self.segments.shape.world_size)
            .filter(|&p| p != self.rank)
            .all(|p| {
                let address = self.segments.word64(p, PROBE_AT).load(Ordering::Relaxed) as usize;
                zero_copy::can_read(self.pids[p as usize], address)
            })
    }

    /// Send values by reference from now on (every rank of the group
    /// found it may read every other).
    pub fn enable_peer_reads(&mut self) {
        self.reader = Some(Arc::new(PeerReader::new(self.pids.clone())));
    }

    fn health(&mut self) {
        self.last_health = Instant::now();
        if self.lost.is_some() {
            return;
        }
        for peer in 0..self.segments.shape.world_size {
            if peer == self.rank {
                continue;
            }
            let state = self.segments.word32(peer, STATE_AT).load(Ordering::Acquire);
            if state == DEPARTED || state == FAILED {
                continue;
            }
            let pid = self.pids[peer as usize];
            if !liveness::alive(pid) {
                self.lost = Some((
                    peer,
                    format!(
                        "lost: its process {pid} exited without leaving the group (killed or crashed)"
                    ),
                ));
                return;
            }
        }
    }
}

impl Transport for ShmTransport {
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
        if header.len > self.segments.shape.slot_bytes as u64 {
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
            doorbell::sleep(bell, seen, (until - now).min(HEALTH_PERIOD));
        }
        if self.last_health.elapsed() >= HEALTH_PERIOD {
            self.health();
        }
    }

    fn check(&mut self) -> Result<(), CommError> {
        let s = &self.segments;
        if let Some((rank, reason)) = s.failure(self.rank) {
            return Err(CommError::PeerFailed { rank, reason });
        }
        for peer in 0..s.shape.world_size {
            if let Some((rank, reason)) = s.failure(peer) {
                return Err(CommError::PeerFailed { rank, reason });
            }
        }
        if let Some((rank, reason)) = &self.lost {
            return Err(CommError::PeerFailed {
                rank: *rank,
                reason: reason.clone(),
            });
        }
        Ok(())
    }

    fn fail(&mut self, culprit: Rank, reason: &str) {
        self.segments.fail(self.rank, culprit, reason);
    }

    fn max_channel(&self) -> Option<u32> {
        Some(self.segments.shape.channels - 1)
    }

    fn max_message(&self) -> Option<usize> {
        Some(self.segments.shape.slot_bytes)
    }

    fn aborter(&self) -> Box<dyn Fn(&str) + Send + Sync> {
        let (segments, rank) = (self.segments.clone(), self.rank);
        Box::new(move |reason| segments.fail(rank, rank, reason))
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

    fn departed(&mut self, peer: Rank) -> bool {
        self.departed_peer(peer)
    }

    fn peer_reader(&self) -> Option<Arc<PeerReader>> {
        self.reader.clone()
    }

    fn heaps(&self) -> Option<Arc<Heaps>> {
        self.heaps.clone()
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
        let (base, heap) = heaps.mapped[to as usize];
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
