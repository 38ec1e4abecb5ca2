//! Frames as MPI messages: the buffers a send or receive holds until MPI
//! is done with them, and where a frame's parts lie in them.
//!
//! A frame is the message transports' frame (`message::frame`) in one
//! buffer of `u64`s: the 16-byte prefix, for data the 128-byte header,
//! then the payload — 8-aligned, since both fronts are multiples of 8.

use ferrocoll_core::Rank;
use ferrocoll_core::link::{HEADER_BYTES, Header};

use super::super::message::frame::{
    self, ACK, DATA, FAIL, FAIL_AT_BYTES, Frame, PREFIX_BYTES, encode_prefix, protocol_error,
};
use crate::mpi::MpiError;
use crate::mpi::raw::{Comm, Matched, Request};

/// Bytes in front of a data payload: the prefix and the header.
const FRONT: usize = PREFIX_BYTES + HEADER_BYTES;
const _: () = assert!(FRONT % 8 == 0, "payloads must stay 8-aligned");

/// Bytes of a data frame with `len` payload bytes.
pub(super) fn frame_bytes(len: usize) -> usize {
    FRONT.saturating_add(len)
}

/// `u64`s a data frame with `len` payload bytes needs.
pub(super) fn frame_words(len: usize) -> usize {
    frame_bytes(len).div_ceil(8)
}

/// Where the payload of a data frame starts in `frame`.
pub(super) fn payload_of(frame: &mut [u64]) -> *mut u8 {
    frame[FRONT / 8..].as_mut_ptr() as *mut u8
}

fn bytes_of(frame: &mut [u64]) -> &mut [u8] {
    // SAFETY: viewing a live u64 buffer as its bytes; any byte pattern is
    // a valid u64.
    unsafe { std::slice::from_raw_parts_mut(frame.as_mut_ptr() as *mut u8, frame.len() * 8) }
}

/// Write a data frame's prefix and header in front of the payload already
/// in `frame`; the frame's length in bytes.
pub(super) fn seal_data(frame: &mut [u64], channel: u32, header: &Header) -> usize {
    let len = header.len as usize;
    let bytes = bytes_of(frame);
    bytes[..PREFIX_BYTES].copy_from_slice(&encode_prefix(DATA, channel, HEADER_BYTES + len));
    bytes[PREFIX_BYTES..FRONT].copy_from_slice(&header.encode());
    frame_bytes(len)
}

/// A frame of `kind` with `body` after its prefix.
fn small_frame(kind: u32, channel: u32, body: &[u8]) -> Vec<u64> {
    let mut frame = vec![0u64; (PREFIX_BYTES + body.len()).div_ceil(8)];
    let bytes = bytes_of(&mut frame);
    bytes[..PREFIX_BYTES].copy_from_slice(&encode_prefix(kind, channel, body.len()));
    bytes[PREFIX_BYTES..PREFIX_BYTES + body.len()].copy_from_slice(body);
    frame
}

/// `count` credits returned on `channel`.
pub(super) fn ack_frame(channel: u32, count: u64) -> (Vec<u64>, usize) {
    (
        small_frame(ACK, channel, &count.to_le_bytes()),
        PREFIX_BYTES + 8,
    )
}

/// A frame with no body (a goodbye).
pub(super) fn control_frame(kind: u32, channel: u32) -> (Vec<u64>, usize) {
    (small_frame(kind, channel, &[]), PREFIX_BYTES)
}

/// This rank failed because `culprit` did, at position `at`.
pub(super) fn fail_frame(culprit: Rank, at: u64, reason: &str) -> (Vec<u64>, usize) {
    let mut body = at.to_le_bytes().to_vec();
    body.extend_from_slice(reason.as_bytes());
    let len = PREFIX_BYTES + FAIL_AT_BYTES + reason.len();
    (small_frame(FAIL, culprit, &body), len)
}

/// Frames up to this many words get a buffer of their own: a spare one
/// (a large message's) would leave the pool with a credit or an
/// announcement, whose buffer is not given back.
const SMALL_WORDS: usize = 512;

/// A buffer of at least `words`: the smallest spare one that fits, else a
/// new one.
pub(super) fn take_spare(spare: &mut Vec<Vec<u64>>, words: usize) -> Vec<u64> {
    if words <= SMALL_WORDS {
        return vec![0u64; words];
    }
    let best = (0..spare.len())
        .filter(|&i| spare[i].len() >= words)
        .min_by_key(|&i| spare[i].len());
    match best {
        Some(i) => spare.swap_remove(i),
        None => vec![0u64; words],
    }
}

/// The tag of a frame sent as one MPI message.
pub(super) const WHOLE: i32 = 1;
/// The tag of a fragment after a frame's first.
pub(super) const MORE: i32 = 2;
/// The tag of a frame's first fragment is `FIRST + k`, where `k` more
/// fragments follow (tags below 32767, the least `MPI_TAG_UB` MPI allows).
pub(super) const FIRST: i32 = 1024;
/// The most fragments after the first one frame may have.
pub(super) const MAX_MORE: usize = 30_000;

/// A send MPI may still be reading the buffer of: one frame, as one
/// message or as fragments.
pub(super) struct Sending {
    requests: Vec<Request>,
    buffer: Vec<u64>,
    to: Rank,
}

impl Sending {
    /// Start sending a small frame (and its length in bytes) to `to`.
    pub fn start(comm: &Comm, to: Rank, (frame, len): (Vec<u64>, usize)) -> Result<Self, MpiError> {
        Sending::start_len(comm, to, frame, len, 0)
    }

    /// Start sending the first `len` bytes of `buffer` to `to`, in
    /// fragments of at most `fragment` bytes (0: one message).
    pub fn start_len(
        comm: &Comm,
        to: Rank,
        buffer: Vec<u64>,
        len: usize,
        fragment: usize,
    ) -> Result<Self, MpiError> {
        assert!(len <= buffer.len() * 8, "a frame longer than its buffer");
        let pieces = fragments(len, fragment);
        let more = pieces.len() - 1;
        let mut sending = Sending {
            requests: Vec::with_capacity(pieces.len()),
            buffer,
            to,
        };
        for (i, (at, n)) in pieces.into_iter().enumerate() {
            let tag = match (i, more) {
                (_, 0) => WHOLE,
                (0, more) => FIRST + more as i32,
                _ => MORE,
            };
            // SAFETY: the range lies in the buffer (`fragments` cuts `len`,
            // checked above), which this value keeps — its allocation does
            // not move — until every request completes or is abandoned
            // with the buffer leaked.
            let sent =
                unsafe { comm.isend((sending.buffer.as_ptr() as *const u8).add(at), n, to, tag) };
            match sent {
                Ok(r) => sending.requests.push(r),
                Err(e) => {
                    // Fragments already started must finish before the
                    // buffer may go: they are abandoned with it.
                    sending.abandon();
                    return Err(e);
                }
            }
        }
        Ok(sending)
    }

    /// Whether MPI is done with the buffer.
    pub fn test(&mut self) -> Result<bool, MpiError> {
        while let Some(last) = self.requests.last_mut() {
            if !last.test()? {
                return Ok(false);
            }
            self.requests.pop();
        }
        Ok(true)
    }

    /// The peer it goes to.
    pub fn to(&self) -> Rank {
        self.to
    }

    /// The buffer, for reuse (only once the send completed).
    pub fn into_buffer(self) -> Vec<u64> {
        self.buffer
    }

    /// Cancel it; the buffer is leaked, since MPI may still read it.
    pub fn abandon(self) {
        for r in self.requests {
            r.abandon();
        }
        std::mem::forget(self.buffer);
    }
}

/// `(offset, bytes)` of each MPI message a frame of `len` bytes goes as,
/// in fragments of at most `fragment` bytes (0: whole); never more than
/// [`MAX_MORE`] after the first (the fragments grow instead).
pub(super) fn fragments(len: usize, fragment: usize) -> Vec<(usize, usize)> {
    if fragment == 0 || len <= fragment {
        return vec![(0, len)];
    }
    let fragment = fragment.max(len.div_ceil(MAX_MORE + 1));
    (0..len)
        .step_by(fragment)
        .map(|at| (at, fragment.min(len - at)))
        .collect()
}

/// A frame being received: its first message matched, and as many of the
/// fragments announced as have been.
pub(super) struct Receiving {
    requests: Vec<Request>,
    buffer: Vec<u64>,
    /// Bytes matched so far (where the next fragment goes).
    bytes: usize,
    /// Fragments announced and not matched yet.
    pub more: usize,
    /// Larger than any frame a peer may send: received into a scratch
    /// buffer only to take it off MPI's queue, then a protocol error.
    oversized: bool,
    /// Where fragments of a broken frame went.
    scratch: Vec<Vec<u64>>,
}

impl Receiving {
    /// Start receiving a frame whose first message is `matched`: at most
    /// `max_payload` payload bytes in all (a larger one is received into a
    /// scratch buffer, as an error). Its buffer comes from `spare` when
    /// one there is large enough.
    pub fn start(
        matched: Matched,
        max_payload: usize,
        spare: &mut Vec<Vec<u64>>,
    ) -> Result<Self, MpiError> {
        let more = if matched.tag >= FIRST {
            (matched.tag - FIRST) as usize
        } else {
            0
        };
        let bytes = matched.bytes;
        let limit = frame_bytes(max_payload);
        let oversized =
            bytes > limit || bytes < PREFIX_BYTES || matched.tag == MORE || more > MAX_MORE;
        // A fragmented frame's length is known only once its fragments
        // are matched: room for the largest there may be.
        let room = match (oversized, more) {
            (true, _) => 16,
            (false, 0) => bytes,
            (false, _) => limit,
        };
        let mut buffer = take_spare(spare, room.div_ceil(8));
        let mut receiving = Receiving {
            requests: Vec::with_capacity(more + 1),
            bytes: 0,
            more,
            oversized,
            buffer: Vec::new(),
            scratch: Vec::new(),
        };
        let len = if oversized { 16 } else { bytes };
        // SAFETY: the buffer moves into the returned value, which keeps it
        // (its allocation does not move) until the request completes or is
        // abandoned with it leaked; an oversized message overflows nothing
        // (MPI reports truncation).
        let request = unsafe { matched.receive(buffer.as_mut_ptr() as *mut u8, len)? };
        receiving.requests.push(request);
        receiving.buffer = buffer;
        receiving.bytes = bytes;
        Ok(receiving)
    }

    /// Receive `matched`, the next fragment of this frame, after the bytes
    /// before it; `Err` when it would overflow the room (a broken peer).
    pub fn add(&mut self, matched: Matched) -> Result<(), MpiError> {
        let room = self.buffer.len() * 8;
        self.more -= 1;
        if self.oversized || matched.tag != MORE || self.bytes.saturating_add(matched.bytes) > room
        {
            self.oversized = true;
            let mut scratch = vec![0u64; 2];
            // SAFETY: as in `start`: the scratch buffer moves into this
            // value (its allocation stays put), kept as long as the buffer.
            let request = unsafe { matched.receive(scratch.as_mut_ptr() as *mut u8, 16)? };
            self.requests.push(request);
            self.scratch.push(scratch);
            return Ok(());
        }
        let len = matched.bytes;
        // SAFETY: `bytes + len <= room` (checked above), so the range lies
        // in the buffer this value keeps until the request completes or is
        // abandoned with the buffer leaked.
        let request = unsafe {
            let at = (self.buffer.as_mut_ptr() as *mut u8).add(self.bytes);
            matched.receive(at, len)?
        };
        self.requests.push(request);
        self.bytes += len;
        Ok(())
    }

    /// Whether every fragment of the frame is in; `Err` when a receive
    /// failed.
    pub fn test(&mut self) -> Result<bool, MpiError> {
        if self.more > 0 {
            return Ok(false);
        }
        while let Some(last) = self.requests.last_mut() {
            match last.test() {
                Ok(false) => return Ok(false),
                Ok(true) => {}
                // Truncation of an oversized frame is expected: reported below.
                Err(_) if self.oversized => {}
                Err(e) => return Err(e),
            }
            self.requests.pop();
        }
        Ok(true)
    }

    /// The frame received, checked as the TCP transport checks its frames.
    pub fn into_frame(self, max_payload: usize, world_size: u32) -> std::io::Result<Frame> {
        if self.oversized {
            return Err(protocol_error(format!(
                "an MPI message of {} bytes or a fragment out of place (frames carry at most {} here)",
                self.bytes,
                frame_bytes(max_payload)
            )));
        }
        let mut buffer = self.buffer;
        let bytes = &bytes_of(&mut buffer)[..self.bytes];
        let head: &[u8; PREFIX_BYTES] = bytes[..PREFIX_BYTES].try_into().expect("checked size");
        let prefix = frame::parse_prefix(head, max_payload)?;
        if prefix.len != self.bytes - PREFIX_BYTES {
            return Err(protocol_error(format!(
                "a {}-byte MPI frame whose prefix announces {} bytes",
                self.bytes, prefix.len
            )));
        }
        if prefix.kind != DATA {
            return frame::decode(&prefix, &bytes[PREFIX_BYTES..], world_size);
        }
        let head: &[u8; HEADER_BYTES] =
            bytes[PREFIX_BYTES..FRONT].try_into().expect("checked size");
        let header = frame::data_header(&prefix, head)?;
        Ok(Frame::Data {
            channel: prefix.channel,
            header,
            data: buffer,
            start: FRONT / 8,
        })
    }

    /// Cancel it; the buffers are leaked, since MPI may still write them.
    pub fn abandon(self) {
        for r in self.requests {
            r.abandon();
        }
        std::mem::forget(self.buffer);
        std::mem::forget(self.scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_MORE, fragments};

    #[test]
    fn fragments_cover_the_frame_once_in_order() {
        for (len, fragment) in [
            (0, 0),
            (10, 0),
            (10, 10),
            (11, 10),
            (64_000, 4096),
            (1 << 20, 1),
        ] {
            let pieces = fragments(len, fragment);
            assert!(pieces.len() <= MAX_MORE + 1, "{len} {fragment}");
            let mut at = 0;
            for &(start, n) in &pieces {
                assert_eq!(start, at);
                assert!(n > 0 || len == 0);
                assert!(fragment == 0 || n <= fragment.max(len.div_ceil(MAX_MORE + 1)));
                at += n;
            }
            assert_eq!(at, len);
        }
    }
}
