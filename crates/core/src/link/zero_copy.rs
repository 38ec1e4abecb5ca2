//! Zero copy between ranks of one host: a message may carry, instead of
//! the value, where the value lies in the sender's heap (offsets into a
//! mapping every rank of the group has — for threads, the address space
//! itself), and the receiver reads it from there itself — straight into
//! its output, or reduced from where it lies. That removes the copy into
//! the slot and the read back out of it.
//!
//! Private buffers are copied through the slots. Reading them with
//! cross-memory attach (`process_vm_readv`) was tried and removed: 1.2–3×
//! slower than the slot copies at every size from 1 to 64 MiB on one host,
//! mixed on another, and always well behind the shared heap
//! (docs/benchmarks.md).
//!
//! Lifetimes: the plan says which values stay unchanged until every
//! receiver has read them ([`crate::plan::Source`]); a sender
//! returns from a call only once every message it sent by reference was
//! consumed; and a receiver checks the group's health after each read, so
//! a sender that failed (and may have handed its buffers back to its
//! caller) turns the read into an error, never into a silently wrong
//! result. Where the heap is the caller's own memory (threads), the
//! links' movement lock also keeps a failed sender from returning while
//! a peer still reads it.

/// Where a value lies in the sender's memory: (address, bytes) pieces,
/// in value order.
pub(crate) type Pieces = Vec<(usize, usize)>;

/// Payload bytes of a reference with `pieces` pieces.
pub fn reference_bytes(pieces: usize) -> usize {
    8 + 16 * pieces
}

/// Write `pieces` as a reference payload into `room`.
///
/// # Safety
/// `room` is valid for [`reference_bytes`]`(pieces.len())` writes and
/// 8-aligned.
pub(crate) unsafe fn write_reference(room: *mut u8, pieces: &[(usize, usize)]) {
    let words = room.cast::<u64>();
    // SAFETY: the caller vouches for the room's size and alignment.
    unsafe {
        words.write(pieces.len() as u64);
        for (i, &(address, bytes)) in pieces.iter().enumerate() {
            words.add(1 + 2 * i).write(address as u64);
            words.add(2 + 2 * i).write(bytes as u64);
        }
    }
}

/// Read a reference payload of at most `room` bytes that must describe
/// exactly `len` bytes. Everything in it came from another process:
/// checked, never trusted.
///
/// # Safety
/// `payload` is valid for `room` reads and 8-aligned.
pub(crate) unsafe fn read_reference(
    payload: *const u8,
    room: usize,
    len: usize,
) -> Result<Pieces, String> {
    let words = payload.cast::<u64>();
    // SAFETY: the first word lies in the room (callers pass shared-memory
    // slots, at least 64 bytes).
    let count = unsafe { words.read() } as usize;
    if count > room.saturating_sub(8) / 16 {
        return Err(format!(
            "a reference of {count} pieces in a {room}-byte slot"
        ));
    }
    let mut pieces = Vec::with_capacity(count);
    let mut total = 0usize;
    for i in 0..count {
        // SAFETY: `count` pieces fit the room (checked above).
        let (address, bytes) = unsafe {
            (
                words.add(1 + 2 * i).read() as usize,
                words.add(2 + 2 * i).read() as usize,
            )
        };
        total = total.saturating_add(bytes);
        pieces.push((address, bytes));
    }
    if total != len {
        return Err(format!(
            "a reference to {total} bytes for a {len}-byte message"
        ));
    }
    Ok(pieces)
}

/// Bytes `[from, from + len)` of the value that `pieces` hold, as pieces.
pub(crate) fn range(pieces: &[(usize, usize)], from: usize, len: usize) -> Pieces {
    let (end, mut at) = (from.saturating_add(len), 0usize);
    let mut out = Vec::new();
    for &(address, bytes) in pieces {
        let (lo, hi) = (at.max(from), at.saturating_add(bytes).min(end));
        if lo < hi {
            out.push((address.wrapping_add(lo - at), hi - lo));
        }
        at = at.saturating_add(bytes);
        if at >= end {
            break;
        }
    }
    out
}

/// Matching runs of two piece lists: (source, destination, bytes).
pub(crate) fn pair_up(
    remote: &[(usize, usize)],
    local: &[(usize, usize)],
) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let (mut r, mut l) = (remote.iter().copied(), local.iter().copied());
    let (mut a, mut b) = (r.next(), l.next());
    while let (Some((ra, rn)), Some((la, ln))) = (a, b) {
        let n = rn.min(ln);
        if n > 0 {
            out.push((ra, la, n));
        }
        a = if rn > n {
            Some((ra.wrapping_add(n), rn - n))
        } else {
            r.next()
        };
        b = if ln > n {
            Some((la.wrapping_add(n), ln - n))
        } else {
            l.next()
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_round_trip_and_lies_are_refused() {
        let pieces = vec![(0x1000, 24), (0x9000, 40)];
        let mut room = vec![0u64; 8];
        // SAFETY: 64 bytes, 8-aligned, enough for two pieces (40 bytes).
        unsafe { write_reference(room.as_mut_ptr().cast(), &pieces) };
        // SAFETY: the room is 64 bytes, 8-aligned.
        let read = |room: &[u64], len| unsafe { read_reference(room.as_ptr().cast(), 64, len) };
        assert_eq!(read(&room, 64), Ok(pieces.clone()));
        assert!(read(&room, 63).is_err(), "a length that does not match");
        room[0] = 1 << 40;
        assert!(read(&room, 64).is_err(), "more pieces than the room holds");
    }

    #[test]
    fn ranges_and_pairs_cut_pieces_where_they_meet() {
        let pieces = [(100, 10), (500, 10), (900, 10)];
        assert_eq!(range(&pieces, 5, 10), [(105, 5), (500, 5)]);
        assert_eq!(range(&pieces, 20, 10), [(900, 10)]);
        assert_eq!(range(&pieces, 0, 0), []);
        assert_eq!(
            pair_up(&[(0, 8), (100, 8)], &[(1000, 4), (2000, 12)]),
            [(0, 1000, 4), (4, 2000, 4), (100, 2004, 8)]
        );
    }
}
