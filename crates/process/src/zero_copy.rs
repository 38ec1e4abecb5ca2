//! Zero copy between processes of one host: a message may carry, instead
//! of the value, where the value lies in the sender's memory, and the
//! receiver reads it from there itself with cross-memory attach
//! (`process_vm_readv`, Linux 3.2+) — straight into its output, or a
//! block at a time into a buffer that stays in cache while it reduces.
//! That removes the copy into the shared-memory slot and the read back
//! out of it: what threads get by reading a peer's memory in place.
//!
//! Reading another process's memory needs ptrace permission over it: the
//! same user, and Yama's `ptrace_scope` (when present) at 0 — at 1 only a
//! parent may, and sibling ranks are not each other's parents. Seccomp
//! profiles of some container runtimes also refuse the call. So a group
//! *probes* at setup: every rank reads a known word from every peer, all
//! ranks publish whether that worked, and only a group where every rank
//! can read every other sends by reference; otherwise it keeps copying
//! through the slots, as before. `ProcessConfig::peer_reads` (or
//! `FERROCOLL_PEER_READS=0`) turns it off.
//!
//! Lifetimes: the plan says which values stay unchanged until every
//! receiver has read them ([`ferrocoll_core::plan::Source`]); a sender
//! returns from a call only once every message it sent by reference was
//! consumed; and a receiver checks the group's health after each read, so
//! a sender that failed (and may have handed its buffers back to its
//! caller) turns the read into an error, never into a silently wrong
//! result.

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

/// Where a value lies in the sender's memory: (address, bytes) pieces,
/// in value order.
pub(crate) type Pieces = Vec<(usize, usize)>;

/// The word every rank's probe target holds.
pub(crate) const PROBE_VALUE: u64 = u64::from_le_bytes(*b"fcprobe!");

/// What a peer reads to learn whether it may read this process.
static PROBE_TARGET: u64 = PROBE_VALUE;

/// The address peers read in the probe.
pub(crate) fn probe_address() -> usize {
    std::ptr::addr_of!(PROBE_TARGET) as usize
}

/// Payload bytes of a reference with `pieces` pieces.
pub(crate) fn reference_bytes(pieces: usize) -> usize {
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

/// Reads the memory of a group's other processes.
#[derive(Debug)]
pub(crate) struct PeerReader {
    pids: Vec<u32>,
}

impl PeerReader {
    /// A reader for the group whose rank `r` runs as `pids[r]`.
    pub fn new(pids: Vec<u32>) -> Self {
        PeerReader { pids }
    }

    /// Copy `remote` (pieces of `peer`'s memory) into `local` (pieces of
    /// ours), the two describing the same number of bytes.
    pub fn read(
        &self,
        peer: Rank,
        remote: &[(usize, usize)],
        local: &[(usize, usize)],
    ) -> Result<(), CommError> {
        let pid = self.pids[peer as usize];
        for (from, to, bytes) in pair_up(remote, local) {
            read_exact(pid, from, to, bytes).map_err(|e| CommError::PeerFailed {
                rank: peer,
                reason: format!("reading its memory (cross-memory attach) failed: {e}"),
            })?;
        }
        Ok(())
    }
}

/// Matching runs of two piece lists: (remote, local, bytes).
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

/// Read `bytes` at `from` in process `pid` into `to`, retrying short reads.
#[cfg(target_os = "linux")]
fn read_exact(pid: u32, mut from: usize, mut to: usize, mut bytes: usize) -> std::io::Result<()> {
    while bytes > 0 {
        let local = libc::iovec {
            iov_base: to as *mut libc::c_void,
            iov_len: bytes,
        };
        let remote = libc::iovec {
            iov_base: from as *mut libc::c_void,
            iov_len: bytes,
        };
        // SAFETY: `local` describes memory of ours the caller lets us
        // write (an output span or a bounce buffer); the kernel checks
        // `remote` against the other process's mappings and fails with
        // EFAULT rather than touching anything outside them.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "no bytes read",
            ));
        }
        let n = n as usize;
        (from, to, bytes) = (from + n, to + n, bytes - n);
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn read_exact(_pid: u32, _from: usize, _to: usize, _bytes: usize) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "cross-memory attach is Linux-only",
    ))
}

/// Whether this process may read process `pid`'s memory: its probe word
/// at `address` reads back as [`PROBE_VALUE`].
pub(crate) fn can_read(pid: u32, address: usize) -> bool {
    let mut word = 0u64;
    let to = std::ptr::addr_of_mut!(word) as usize;
    read_exact(pid, address, to, 8).is_ok() && word == PROBE_VALUE
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

    #[test]
    fn a_process_reads_its_own_probe_and_not_a_stranger() {
        let me = std::process::id();
        #[cfg(target_os = "linux")]
        assert!(can_read(me, probe_address()));
        // pid 0 is no process to read.
        assert!(!can_read(0, probe_address()));
        let reader = PeerReader::new(vec![me]);
        let source = [7u8; 100];
        let mut dest = [0u8; 100];
        let r = reader.read(
            0,
            &[(source.as_ptr() as usize, 100)],
            &[
                (dest.as_mut_ptr() as usize, 60),
                (dest.as_mut_ptr() as usize + 60, 40),
            ],
        );
        #[cfg(target_os = "linux")]
        {
            r.unwrap();
            assert_eq!(dest, source);
        }
        let _ = r;
        let bad = reader.read(0, &[(8, 100)], &[(dest.as_mut_ptr() as usize, 100)]);
        assert!(matches!(bad, Err(CommError::PeerFailed { .. })), "{bad:?}");
    }
}
