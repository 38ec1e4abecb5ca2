//! The layout of a shared-memory segment — control block, links, one-shot
//! staging, shared heap — and typed access to its words, as one rank
//! sees every segment of its group.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::time::Duration;

use ferrocoll_core::Rank;

use super::doorbell;
use super::segment::Segment;
use ferrocoll_core::link::{HEADER_BYTES, Header};

pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"fcollshm");
/// Control block: magic, pid, doorbell, state, announced call, failure reason.
pub(super) const CONTROL_BYTES: usize = 4096;
pub(super) const PID_AT: usize = 8;
pub(super) const DOORBELL_AT: usize = 64;
/// Processes asleep (or about to be) on the doorbell: a ring wakes them
/// only when there are some, so the common ring — the owner is spinning —
/// is one atomic add, not a system call.
pub(super) const SLEEPERS_AT: usize = 68;
pub(super) const STATE_AT: usize = 128;
pub(super) const REASON_LEN_AT: usize = 132;
pub(super) const CULPRIT_AT: usize = 136;
// Bytes 144..152 are unused (they held the cross-memory probe's address).
/// The [`Position`](crate::transport::Position) this rank failed at.
pub(super) const FAILED_AT_AT: usize = 152;
/// The announcement board: a sequence word, then a [`Header`] as words.
pub(super) const BOARD_SEQ_AT: usize = 256;
pub(super) const BOARD_AT: usize = 264;
pub(super) const BOARD_WORDS: usize = HEADER_BYTES / 8;
pub(super) const REASON_AT: usize = 512;
pub(super) const REASON_BYTES: usize = CONTROL_BYTES - REASON_AT;
/// A link's counters, each on its own cache line.
pub(super) const LINK_CONTROL_BYTES: usize = 128;
pub(super) const POPPED_AT: usize = 64;
/// A direct-write post on the link, written by the receiver (after
/// `popped`, on its line): the message number it is for + 1 (0: none,
/// [`TAKEN`]: the sender is writing it), then where in the receiver's
/// heap the value goes, and its length.
pub(super) const POST_SEQ_AT: usize = 72;
pub(super) const POST_OFFSET_AT: usize = 80;
pub(super) const POST_LEN_AT: usize = 88;
/// Set on a post the sender took (it writes, or wrote, the value there);
/// the message number stays, so consuming an earlier message never
/// clears it.
pub(super) const TAKEN: u64 = 1 << 63;

pub(super) const LIVE: u32 = 0;
pub(super) const WRITING: u32 = 1;
pub(super) const FAILED: u32 = 2;
pub(super) const DEPARTED: u32 = 3;

/// How often a sleeping rank looks at its peers' processes.
pub(super) const HEALTH_PERIOD: Duration = Duration::from_millis(20);
/// How long a waiter spins before it sleeps, when ranks have cores of their own.
pub(super) const SPIN: Duration = Duration::from_micros(30);

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
    pub(super) fn slot_stride(&self) -> usize {
        HEADER_BYTES + self.slot_bytes.next_multiple_of(64)
    }

    pub(super) fn link_bytes(&self) -> usize {
        LINK_CONTROL_BYTES + self.slots as usize * self.slot_stride()
    }

    /// Where the two halves of the one-shot staging start: after the
    /// control block and one link per (other rank, channel).
    pub(super) fn staging_at(&self) -> usize {
        CONTROL_BYTES
            + (self.world_size as usize).saturating_sub(1)
                * self.channels as usize
                * self.link_bytes()
    }

    /// Where the shared heap starts, on a page of its own.
    pub(super) fn heap_at(&self) -> usize {
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
    pub(super) fn link_at(&self, owner: Rank, from: Rank, channel: u32) -> usize {
        debug_assert_ne!(owner, from);
        let peer = if from < owner { from } else { from - 1 } as usize;
        CONTROL_BYTES + (peer * self.channels as usize + channel as usize) * self.link_bytes()
    }
}

/// The segments of a group as one rank sees them.
pub(super) struct Segments {
    pub(super) shape: Shape,
    pub(super) all: Vec<Segment>,
}

impl Segments {
    pub(super) fn word32(&self, rank: Rank, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is a 4-aligned offset inside the control block of a
        // live mapping, and that word is only ever accessed atomically.
        unsafe { AtomicU32::from_ptr(self.all[rank as usize].base().add(at) as *mut u32) }
    }

    pub(super) fn counter(&self, owner: Rank, from: Rank, channel: u32, at: usize) -> &AtomicU64 {
        let offset = self.shape.link_at(owner, from, channel) + at;
        // SAFETY: link offsets are 64-aligned inside the mapping, and the
        // counters are only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.all[owner as usize].base().add(offset) as *mut u64) }
    }

    pub(super) fn slot(&self, owner: Rank, from: Rank, channel: u32, index: u64) -> *mut u8 {
        let s = &self.shape;
        let offset = s.link_at(owner, from, channel)
            + LINK_CONTROL_BYTES
            + (index % u64::from(s.slots)) as usize * s.slot_stride();
        // SAFETY: the offset stays inside the owner's mapping by construction.
        unsafe { self.all[owner as usize].base().add(offset) }
    }

    pub(super) fn ring(&self, rank: Rank) {
        doorbell::ring(self.bell(rank));
    }

    /// `rank`'s doorbell and its count of sleepers.
    pub(super) fn bell(&self, rank: Rank) -> doorbell::Bell<'_> {
        doorbell::Bell {
            word: self.word32(rank, DOORBELL_AT),
            sleepers: self.word32(rank, SLEEPERS_AT),
        }
    }

    /// Record `rank`'s failure, caused by `culprit` (first one wins), and
    /// wake everyone.
    pub(super) fn fail(&self, rank: Rank, culprit: Rank, reason: &str, at: u64) {
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
            self.word64(rank, FAILED_AT_AT).store(at, Ordering::Relaxed);
            state.store(FAILED, Ordering::Release);
            // Peers that read this rank's heap check this flag after the
            // read: order it before anything the caller writes next.
            fence(Ordering::SeqCst);
        }
        for r in 0..self.shape.world_size {
            self.ring(r);
        }
    }

    pub(super) fn word64(&self, rank: Rank, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is an 8-aligned offset inside the control block of a
        // live mapping, and that word is only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.all[rank as usize].base().add(at) as *mut u64) }
    }

    /// Publish `header` on `rank`'s board (a seqlock: only `rank` writes it).
    pub(super) fn post(&self, rank: Rank, header: &Header) {
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
    pub(super) fn board(&self, rank: Rank) -> Option<Header> {
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

    /// `rank`'s failure: the rank that caused it, why, and the position
    /// `rank` failed at.
    pub(super) fn failure(&self, rank: Rank) -> Option<(Rank, String, u64)> {
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
        // Another process wrote it: shown, never obeyed by a terminal.
        let reason = ferrocoll_core::comm::printable(&String::from_utf8_lossy(&bytes));
        let at = self.word64(rank, FAILED_AT_AT).load(Ordering::Relaxed);
        Some((culprit, reason, at))
    }
}
