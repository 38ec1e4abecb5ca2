//! Values sent by reference: checking and resolving what a peer sent,
//! choosing what this rank lends, and running a step whose inputs lie in
//! peers' memory.

use super::compute::{Sink, compute, overlap, sub_spans};
use super::*;

/// Bytes of bounce buffers a by-reference step reduces through at a time,
/// shared by its incoming references: small enough to stay in L2.
const BOUNCE_BYTES: usize = 512 << 10;

/// The pieces of a message sent by reference, checked: only a group
/// with shared heaps sends them, and they must name the message's length
/// exactly.
pub(super) fn reference<L: Links + ?Sized>(
    t: &mut L,
    msg: &Incoming,
    peer: Rank,
    bytes: usize,
) -> Result<Pieces, CommError> {
    let protocol = |e: String| protocol_error(peer, e);
    // Only shared memory lends, and its slots hold at least 64 bytes.
    let Some(room) = t.max_message().filter(|&r| r >= 64) else {
        return Err(protocol(
            "a message by reference over a transport without slots".into(),
        ));
    };
    // SAFETY: the payload sits in a slot of `room` bytes, 8-aligned.
    unsafe { zero_copy::read_reference(msg.payload, room, bytes) }.map_err(protocol)
}

pub(super) fn protocol_error(peer: Rank, e: String) -> CommError {
    CommError::PeerFailed {
        rank: peer,
        reason: format!("protocol error: {e}"),
    }
}

/// A checked reference as something this rank can read: heap offsets
/// inside the sender's heap, as pieces of that heap mapped here (read with
/// plain loads).
pub(super) fn resolve(
    header: &Header,
    pieces: Pieces,
    peer: Rank,
    (heaps, element): (Option<&HeapMap>, usize),
) -> Result<Pieces, CommError> {
    // Kernels read whole, aligned elements; an honest sender's pieces are.
    if let Some(&(at, n)) = pieces
        .iter()
        .find(|&&(at, n)| at % element != 0 || n % element != 0)
    {
        return Err(protocol_error(
            peer,
            format!("a reference to [{at:#x}, +{n}) is not whole {element}-byte elements"),
        ));
    }
    if !header.in_heap() {
        return Err(protocol_error(
            peer,
            "a reference outside the shared heap (this group reads no private memory)".into(),
        ));
    }
    let heaps = heaps.ok_or_else(|| {
        protocol_error(
            peer,
            "a shared-heap reference in a group without heaps".into(),
        )
    })?;
    heaps
        .translate(peer, &pieces)
        .map_err(|e| protocol_error(peer, e))
}

/// How this step sends its value, when not as a copy: the offsets of the
/// value in this rank's shared heap — only where it lies there, and where
/// the plan keeps it stable until every receiver has read it.
pub(super) fn lend<T>(
    ins: &Instruction,
    bytes: usize,
    read: Option<&[Span]>,
    write: Option<&[Span]>,
    heaps: Option<&HeapMap>,
) -> Option<Pieces> {
    if bytes == 0 || ins.send.is_empty() {
        return None;
    }
    let pieces = match ins.source {
        Source::Write => as_pieces::<T>(write?),
        Source::Read => as_pieces::<T>(read?),
        Source::Slot => return None,
    };
    heaps.and_then(|h| h.offsets(&pieces))
}

/// Local spans as (address, bytes) pieces.
pub(super) fn as_pieces<T>(spans: &[Span]) -> Pieces {
    let size = std::mem::size_of::<T>();
    spans.iter().map(|&(_, a, n)| (a, n * size)).collect()
}

/// One step whose incoming messages include references.
pub(super) struct Step<'a, T> {
    pub(super) op: ReduceOp,
    pub(super) incoming: &'a [Incoming],
    pub(super) references: &'a [Option<Pieces>],
    pub(super) read: Option<&'a [Span]>,
    pub(super) write: Option<&'a [Span]>,
    pub(super) rooms: &'a [*mut T],
    /// What the rooms are: hand-offs when they are all slots.
    pub(super) to: Sink,
    pub(super) len: usize,
}

/// Run a step with values read by reference from peers' mapped heaps: one
/// reference with nothing else to do is copied straight into the output;
/// references of one piece each are reduced from where they lie; the rest
/// (values in several pieces of a heap) a block at a time through bounce
/// buffers that stay in cache, each block computed as [`compute`] would
/// (whole, when read and write overlap in a way blocks could break).
///
/// # Safety
/// As [`compute`]: spans, rooms and slot payloads are valid for the
/// step's length; mapped references were checked to lie in the sender's
/// heap.
pub(super) unsafe fn fire_by_reference<T: Reduce>(s: &Step<'_, T>) {
    let size = std::mem::size_of::<T>();
    let fetch = |p: &Pieces, from: usize, len: usize, to: &[(usize, usize)]| {
        for (src, dst, n) in zero_copy::pair_up(&zero_copy::range(p, from, len), to) {
            // SAFETY: `src` lies in a peer's mapped heap (checked), `dst`
            // in this rank's output or bounce buffer.
            unsafe { copy_long(src as *const u8, dst as *mut u8, n, s.to.output()) };
        }
    };
    if let ([Some(r)], None, Some(write), []) = (s.references, s.read, s.write, s.rooms) {
        return fetch(r, 0, s.len * size, &as_pieces::<T>(write));
    }
    let in_place: Option<Vec<*const T>> = s
        .references
        .iter()
        .zip(s.incoming)
        .map(|(r, msg)| match r {
            None => Some(msg.payload as *const T),
            Some(p) if p.len() == 1 => Some(p[0].0 as *const T),
            Some(_) => None,
        })
        .collect();
    if let Some(sources) = in_place {
        // SAFETY: every source covers `len` elements (a slot payload, or a
        // checked heap range of exactly the message's bytes).
        unsafe { compute(s.op, &sources, s.read, s.write, s.rooms, s.to, s.len) };
        return;
    }
    let lent = s.references.iter().filter(|r| r.is_some()).count().max(1);
    let blockwise = match (s.read, s.write) {
        (Some(r), Some(w)) => r == w || !overlap::<T>(r, w),
        _ => true,
    };
    let block = if blockwise {
        (BOUNCE_BYTES / lent / size).max(64)
    } else {
        s.len.max(1)
    };
    let mut bounces: Vec<Vec<u64>> = s
        .references
        .iter()
        .map(|r| match r {
            Some(_) => vec![0u64; (block.min(s.len) * size).div_ceil(8)],
            None => Vec::new(),
        })
        .collect();
    let mut start = 0;
    while start < s.len {
        let n = block.min(s.len - start);
        let mut sources: Vec<*const T> = Vec::with_capacity(s.references.len());
        for (i, r) in s.references.iter().enumerate() {
            match r {
                Some(r) => {
                    let bounce = bounces[i].as_mut_ptr() as usize;
                    fetch(r, start * size, n * size, &[(bounce, n * size)]);
                    sources.push(bounce as *const T);
                }
                // SAFETY: the payload holds `len` elements.
                None => sources.push(unsafe { (s.incoming[i].payload as *const T).add(start) }),
            }
        }
        let read = s.read.map(|r| sub_spans::<T>(r, start, n));
        let write = s.write.map(|w| sub_spans::<T>(w, start, n));
        // SAFETY: rooms hold `len` elements.
        let rooms: Vec<*mut T> = s.rooms.iter().map(|p| unsafe { p.add(start) }).collect();
        // SAFETY: every pointer covers this block (the caller's contract,
        // cut to the block).
        unsafe {
            compute(
                s.op,
                &sources,
                read.as_deref(),
                write.as_deref(),
                &rooms,
                s.to,
                n,
            )
        };
        start += n;
    }
}
