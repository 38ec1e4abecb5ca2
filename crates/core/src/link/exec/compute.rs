//! A step's arithmetic on host memory: reducing messages and the local
//! read into rooms and the write, fused where the kernel allows, staged
//! where a room is a source's very bytes.

use super::*;
use crate::kernels::{Destination, KernelChoice, STREAM_MIN_BYTES};

/// Where a long write goes, and the call's kernel variant that decides
/// its stores: outputs and hand-offs take theirs by the call's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sink {
    pub kernels: KernelChoice,
    pub to: Destination,
}

impl Sink {
    /// The variant as it writes here.
    fn choice(self) -> KernelChoice {
        self.kernels.to(self.to)
    }

    /// The same call, writing to an output.
    pub(super) fn output(self) -> Sink {
        Sink {
            to: Destination::Output,
            ..self
        }
    }

    /// The same call, writing to a hand-off.
    fn handoff(self) -> Sink {
        Sink {
            to: Destination::Handoff,
            ..self
        }
    }
}

/// The step's value — the reduction of the messages and the local read —
/// into the first outgoing room (or the write), then copied to the rest;
/// the rooms are `to` (hand-offs when they are all slots).
///
/// # Safety
/// See the call site: every pointer is valid for the stated lengths,
/// rooms overlap nothing else, and messages overlap no local memory.
pub(super) unsafe fn compute<T: Reduce>(
    op: ReduceOp,
    messages: &[*const T],
    read: Option<&[Span]>,
    write: Option<&[Span]>,
    outgoing: &[*mut T],
    to: Sink,
    len: usize,
) {
    // SAFETY: as below; the fused path checks that no destination
    // overlaps a source.
    if unsafe { fused(op, messages, read, write, outgoing, to, len) } {
        return;
    }
    // A room may be the very bytes a message is read from (a peer lends a
    // block and posts the same block for the answer): only the fused
    // kernel may write over a source; here, stage the value first.
    let size = std::mem::size_of::<T>();
    let span = |p: usize, n: usize| p..p + n * size;
    let room_meets = |room: usize| {
        messages
            .iter()
            .any(|&m| ranges_meet(&span(room, len), &span(m as usize, len)))
            || read.is_some_and(|r| {
                r.iter()
                    .any(|&(_, a, n)| ranges_meet(&span(room, len), &span(a, n)))
            })
    };
    if outgoing.iter().any(|&r| room_meets(r as usize)) {
        let mut value: Vec<T> = Vec::with_capacity(len);
        // SAFETY: the staged value is fresh memory of `len` elements; the
        // sources are valid as the caller guarantees; every room and the
        // write then get a copy of it.
        unsafe {
            combine(op, messages, read, value.as_mut_ptr(), len, to.handoff());
            value.set_len(len);
            for &room in outgoing {
                copy_long(value.as_ptr().cast(), room.cast(), len * size, to);
            }
            if let Some(write) = write {
                scatter(value.as_ptr(), write, to);
            }
        }
        return;
    }
    // SAFETY: every pointer below is valid for the lengths used, as the
    // caller guarantees; the one in-place kernel call passes its
    // destination as exactly its first source, as `Reduce::reduce` allows.
    unsafe {
        if let Some((&first, rest)) = outgoing.split_first() {
            combine(op, messages, read, first, len, to);
            for &room in rest {
                std::ptr::copy_nonoverlapping(first, room, len);
            }
            if let Some(write) = write {
                scatter(first, write, to);
            }
            return;
        }
        let Some(write) = write else { return };
        match read {
            // The common in-place case (reduce into what was read): the
            // kernel may write over its first source element for element.
            Some(read) if read == write => {
                for &(offset, address, n) in write {
                    let mut srcs = vec![address as *const T];
                    srcs.extend(messages.iter().map(|m| m.add(offset)));
                    if srcs.len() > 1 {
                        T::reduce(op, &srcs, address as *mut T, n);
                    }
                }
            }
            None => {
                for &(offset, address, n) in write {
                    let srcs: Vec<*const T> = messages.iter().map(|m| m.add(offset)).collect();
                    put(op, &srcs, address as *mut T, n, to.output());
                }
            }
            // Read and write apart (out of place): reduce straight into the
            // write, piece by piece where the two regions' pieces meet.
            Some(read) if !overlap::<T>(read, write) => {
                let size = std::mem::size_of::<T>();
                for &(offset, address, n) in write {
                    for (at, from, m) in sub_spans::<T>(read, offset, n) {
                        let mut srcs = vec![from as *const T];
                        srcs.extend(messages.iter().map(|p| p.add(offset + at)));
                        put(op, &srcs, (address + at * size) as *mut T, m, to.output());
                    }
                }
            }
            // Read and write overlap without coinciding: stage.
            Some(read) => {
                let mut value: Vec<T> = Vec::with_capacity(len);
                combine(
                    op,
                    messages,
                    Some(read),
                    value.as_mut_ptr(),
                    len,
                    to.handoff(),
                );
                value.set_len(len);
                scatter(value.as_ptr(), write, to);
            }
        }
    }
}

/// The value reduced into every room and the write in one pass (the
/// fused streaming kernel: f32/f64 sums) — the pass that makes a direct
/// write cost nothing extra, and reduces in place (the write exactly the
/// read) with stores through the cache. Only for long values whose read and write are
/// each one whole span and whose destinations overlap no source; `false`
/// (having done nothing) otherwise.
///
/// # Safety
/// As [`compute`].
pub(super) unsafe fn fused<T: Reduce>(
    op: ReduceOp,
    messages: &[*const T],
    read: Option<&[Span]>,
    write: Option<&[Span]>,
    outgoing: &[*mut T],
    to: Sink,
    len: usize,
) -> bool {
    let size = std::mem::size_of::<T>();
    let whole = |s: &[Span]| matches!(s, [(0, _, n)] if *n == len);
    if len * size < STREAM_MIN_BYTES
        || (outgoing.is_empty() && write.is_none())
        || !read.is_none_or(whole)
        || !write.is_none_or(whole)
    {
        return false;
    }
    let mut srcs: Vec<*const T> = messages.to_vec();
    srcs.extend(read.map(|r| r[0].1 as *const T));
    let mut dsts: Vec<*mut T> = outgoing.to_vec();
    dsts.extend(write.map(|w| w[0].1 as *mut T));
    // With this rank's output among the destinations, the output's
    // stores; rooms alone take theirs. In place the write is exactly the
    // read, which the kernel allows.
    let kind = if write.is_some() { to.output() } else { to };
    let src_at: Vec<usize> = srcs.iter().map(|&p| p as usize).collect();
    let dst_at: Vec<usize> = dsts.iter().map(|&p| p as usize).collect();
    let Some(choice) = kind.choice().for_fused_pass(&src_at, &dst_at, len * size) else {
        return false;
    };
    // SAFETY: every pointer covers `len` elements (the caller's contract);
    // destinations overlap no source but exactly (checked) and no other
    // destination (rooms, peers' posts and this rank's write are distinct
    // buffers).
    srcs.len() > 1 && unsafe { T::reduce_stream_with(choice, op, &srcs, &dsts, len) }
}

pub(super) fn ranges_meet(a: &std::ops::Range<usize>, b: &std::ops::Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// `dst[..len]` = reduction of the messages and the read pieces, `dst`
/// being a `to`.
pub(super) unsafe fn combine<T: Reduce>(
    op: ReduceOp,
    messages: &[*const T],
    read: Option<&[Span]>,
    dst: *mut T,
    len: usize,
    to: Sink,
) {
    // SAFETY: forwarded from `compute`'s caller.
    unsafe {
        match read {
            Some(read) => {
                for &(offset, address, n) in read {
                    let mut srcs = vec![address as *const T];
                    srcs.extend(messages.iter().map(|m| m.add(offset)));
                    put(op, &srcs, dst.add(offset), n, to);
                }
            }
            None => put(op, messages, dst, len, to),
        }
    }
}

/// Reduce `srcs` into `dst` (a `to`), or copy a single source. Long
/// reductions take the fused streaming kernel where the type and op have
/// one, with the stores calibrated for that kind of destination.
pub(super) unsafe fn put<T: Reduce>(
    op: ReduceOp,
    srcs: &[*const T],
    dst: *mut T,
    n: usize,
    to: Sink,
) {
    // SAFETY: forwarded; `dst` overlaps no source here.
    unsafe {
        match srcs {
            [] => {}
            [one] => copy_long(one.cast(), dst.cast(), n * std::mem::size_of::<T>(), to),
            _ if n * std::mem::size_of::<T>() >= STREAM_MIN_BYTES
                && T::reduce_stream_with(to.choice(), op, srcs, &[dst], n) => {}
            _ => T::reduce(op, srcs, dst, n),
        }
    }
}

/// Copy `bytes` to a `to`; long copies stream past the cache when the
/// calibration chose non-temporal stores for that kind of destination (no
/// read-for-ownership of each line).
///
/// # Safety
/// As `copy_nonoverlapping`.
pub(super) unsafe fn copy_long(src: *const u8, dst: *mut u8, bytes: usize, to: Sink) {
    use crate::kernels::{Stores, stream_copy};
    // SAFETY: forwarded from the caller.
    unsafe {
        if bytes >= STREAM_MIN_BYTES && to.choice().stores() == Stores::NonTemporal {
            stream_copy(src, dst, bytes);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, bytes);
        }
    }
}

/// Copy the value held by `write` (its spans, in value order) into one
/// contiguous room (a `to`) of `len` elements.
///
/// # Safety
/// The spans and the room are valid for the value's length and apart.
pub(super) unsafe fn scatter_from<T>(write: &[Span], room: *mut T, len: usize, to: Sink) {
    let size = std::mem::size_of::<T>();
    for &(offset, address, n) in write {
        debug_assert!(offset + n <= len);
        // SAFETY: forwarded from the caller.
        unsafe { copy_long(address as *const u8, room.add(offset).cast(), n * size, to) };
    }
}

/// Copy a contiguous value out to the write pieces.
pub(super) unsafe fn scatter<T>(value: *const T, write: &[Span], to: Sink) {
    for &(offset, address, n) in write {
        // SAFETY: forwarded; the value is a message room or a staging
        // vector, never the destination.
        unsafe {
            copy_long(
                value.add(offset).cast(),
                address as *mut u8,
                n * std::mem::size_of::<T>(),
                to.output(),
            )
        };
    }
}

/// The spans of elements `[start, start + n)` of a value, re-based so the
/// block starts at offset 0.
pub(super) fn sub_spans<T>(spans: &[Span], start: usize, n: usize) -> Vec<Span> {
    let size = std::mem::size_of::<T>();
    spans
        .iter()
        .filter_map(|&(offset, address, elems)| {
            let (lo, hi) = (offset.max(start), (offset + elems).min(start + n));
            (lo < hi).then(|| (lo - start, address + (lo - offset) * size, hi - lo))
        })
        .collect()
}

/// Whether any read span shares bytes with any write span.
pub(super) fn overlap<T>(read: &[Span], write: &[Span]) -> bool {
    let size = std::mem::size_of::<T>();
    read.iter().any(|&(_, r, rn)| {
        write
            .iter()
            .any(|&(_, w, wn)| r < w + wn * size && w < r + rn * size)
    })
}
