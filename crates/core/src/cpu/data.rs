//! The data path of the CPU executor: reducing sources into destinations
//! given as byte extents of host memory, with non-temporal stores for
//! long stretches, and the final division of `Avg`.

use super::group::Extents;
use crate::kernels::{self, KernelChoice, Reduce, STREAM_MIN_BYTES, Stores};
use crate::types::ReduceOp;

/// Elements reduced into the first destination before it is copied to the
/// others: small enough that the copies read from L1/L2.
const FAN_OUT_BLOCK: usize = 4096;

/// Reduce `srcs` into every destination with `choice` (the call's
/// variant). Short stretches reduce into the first destination and copy
/// from it while it is in cache; long ones reduce a block at a time into
/// a small buffer that stays in L1 and stream it to every destination.
pub(crate) fn combine<T: Reduce>(
    choice: KernelChoice,
    op: ReduceOp,
    srcs: &[Extents],
    dsts: &[Extents],
) {
    let size = std::mem::size_of::<T>();
    let lists: Vec<&Extents> = srcs.iter().chain(dsts).collect();
    let mut streamed = false;
    walk(&lists, |addrs, bytes| {
        let (src_addrs, dst_addrs) = addrs.split_at(srcs.len());
        let stream = bytes >= STREAM_MIN_BYTES;
        streamed |= stream;
        if stream && fused::<T>(choice, op, src_addrs, dst_addrs, bytes) {
            return;
        }
        let mut done = 0;
        while done < bytes {
            let n = (bytes - done).min(FAN_OUT_BLOCK * size);
            let len = n / size;
            let mut src: Vec<*const T> =
                src_addrs.iter().map(|&a| (a + done) as *const T).collect();
            if stream {
                stream_block::<T>(choice, op, &src, dst_addrs, done, n);
            } else {
                let first = (dst_addrs[0] + done) as *mut T;
                // In place, the destination is one of the sources; the
                // kernel reads its first two sources before writing, so put
                // it first.
                if let Some(i) = src.iter().position(|&p| std::ptr::eq(p, first)) {
                    src.swap(0, i);
                }
                if !(src.len() == 1 && std::ptr::eq(src[0], first)) {
                    // SAFETY: the verifier proved every slice in bounds of
                    // its buffer (or of a slot sized for it), that a step's
                    // read and write coincide or do not overlap, and that no
                    // other step touches these bytes concurrently.
                    unsafe { T::reduce(op, &src, first, len) };
                }
                for &d in &dst_addrs[1..] {
                    let d = (d + done) as *mut T;
                    if d != first {
                        // SAFETY: as above; distinct destinations never overlap.
                        unsafe { std::ptr::copy_nonoverlapping(first as *const T, d, len) };
                    }
                }
            }
            done += n;
        }
    });
    if streamed {
        kernels::stream_fence();
    }
}

/// Try the element type's fused reduce-and-stream kernel for a whole
/// stretch; false when it has none, when a destination partly overlaps a
/// source, or when the only source is also a destination (the copy path
/// skips that destination instead of storing the value over itself).
///
/// A destination may be exactly a source (in place), with the stores
/// [`KernelChoice::for_fused_pass`] picks.
fn fused<T: Reduce>(
    choice: KernelChoice,
    op: ReduceOp,
    src_addrs: &[usize],
    dst_addrs: &[usize],
    bytes: usize,
) -> bool {
    if let [only] = src_addrs
        && dst_addrs.contains(only)
    {
        return false;
    }
    let Some(choice) = choice.for_fused_pass(src_addrs, dst_addrs, bytes) else {
        return false;
    };
    let srcs: Vec<*const T> = src_addrs.iter().map(|&a| a as *const T).collect();
    let dsts: Vec<*mut T> = dst_addrs.iter().map(|&a| a as *mut T).collect();
    // SAFETY: every address covers `bytes` bytes (verified slices or sized
    // slots); destinations are distinct from each other and, as checked
    // above, each either is exactly a source or overlaps none.
    unsafe { T::reduce_stream_with(choice, op, &srcs, &dsts, bytes / std::mem::size_of::<T>()) }
}

/// Bytes reduced at a time on the streaming path: small enough that the
/// stores to every destination interleave tightly with the loads (a large
/// staging block serialises the streams and loses a third of the rate).
const STREAM_BLOCK_BYTES: usize = 1024;

/// Reduce `n` bytes of `src` and stream the result to every destination
/// (offset by `done`), one small block at a time.
fn stream_block<T: Reduce>(
    choice: KernelChoice,
    op: ReduceOp,
    src: &[*const T],
    dst_addrs: &[usize],
    done: usize,
    n: usize,
) {
    let size = std::mem::size_of::<T>();
    let mut staging = [0u64; STREAM_BLOCK_BYTES / 8];
    let staging_ptr = staging.as_mut_ptr() as *mut T;
    let mut ptrs: Vec<*const T> = src.to_vec();
    let mut off = 0;
    while off < n {
        let m = (n - off).min(STREAM_BLOCK_BYTES);
        let len = m / size;
        let from: *const u8 = if ptrs.len() == 1 {
            ptrs[0] as *const u8
        } else {
            // SAFETY: the staging block holds STREAM_BLOCK_BYTES ≥ m bytes,
            // is aligned for every element type (u64 alignment) and
            // overlaps no source.
            unsafe { T::reduce_with(choice, op, &ptrs, staging_ptr, len) };
            staging_ptr as *const u8
        };
        for &d in dst_addrs {
            let d = (d + done + off) as *mut u8;
            if std::ptr::eq(d, from) {
                continue;
            }
            // A destination that is also a source (in place) was just read
            // into this core's cache: an ordinary store costs no extra
            // read there, and is cheaper than bypassing the cache.
            let just_read = ptrs.iter().any(|&p| std::ptr::eq(p as *const u8, d));
            let cached = just_read || choice.stores() == Stores::Cached;
            // SAFETY: destinations are in bounds (verified) and overlap
            // neither the staging block nor each other; a destination that
            // is also a source was read into staging already.
            unsafe {
                if cached {
                    std::ptr::copy_nonoverlapping(from, d, m);
                } else {
                    kernels::stream_copy(from, d, m);
                }
            }
        }
        for p in &mut ptrs {
            // SAFETY: stays within the stretch being reduced.
            *p = unsafe { p.add(len) };
        }
        off += m;
    }
}

/// Walk several lists of byte ranges of equal total length in lock step,
/// calling `f` with one address per list for each stretch that is
/// contiguous in all of them.
fn walk(lists: &[&Extents], mut f: impl FnMut(&[usize], usize)) {
    let mut pos: Vec<(usize, usize)> = vec![(0, 0); lists.len()];
    let mut addrs = vec![0usize; lists.len()];
    loop {
        let mut step = usize::MAX;
        for (l, &(i, off)) in lists.iter().zip(&pos) {
            // Skip empty pieces.
            match l.get(i) {
                Some(&(_, len)) => step = step.min(len - off),
                None => return,
            }
        }
        if step == 0 {
            for (l, p) in lists.iter().zip(pos.iter_mut()) {
                if l[p.0].1 == p.1 {
                    *p = (p.0 + 1, 0);
                }
            }
            continue;
        }
        for ((l, &(i, off)), a) in lists.iter().zip(&pos).zip(addrs.iter_mut()) {
            *a = l[i].0 + off;
        }
        f(&addrs, step);
        for (l, p) in lists.iter().zip(pos.iter_mut()) {
            p.1 += step;
            if p.1 == l[p.0].1 {
                *p = (p.0 + 1, 0);
            }
        }
    }
}

/// Divide every element of `extents` by `n` (the end of `Avg`).
///
/// # Safety
/// The extents address initialised elements of `T` that nothing else
/// touches during the call.
pub(crate) unsafe fn divide<T: Reduce>(extents: &Extents, n: u32) {
    let size = std::mem::size_of::<T>();
    for &(address, bytes) in extents {
        // SAFETY: forwarded from the caller.
        let out = unsafe { std::slice::from_raw_parts_mut(address as *mut T, bytes / size) };
        for x in out {
            *x = x.divide(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::reduce_slices;

    /// In place, a rank's value goes over its own read and over the blocks
    /// its peers lent: destinations that are exactly sources. Long enough
    /// for the fused kernel, misaligned, on every kernel variant, with a
    /// fresh destination beside them; every destination must hold the sum
    /// of the sources as they were before the call.
    fn sums_over_its_own_sources<T: Reduce + From<u16> + PartialEq>() {
        let len = (STREAM_MIN_BYTES / std::mem::size_of::<T>()) + 1001;
        for choice in KernelChoice::available() {
            let source =
                |k: u16| -> Vec<T> { (0..=len).map(|i| T::from((i % 251) as u16 + k)).collect() };
            let mut own = source(1);
            let mut lent = [source(2), source(3)];
            let other = source(4);
            let mut fresh = vec![T::from(0); len + 1];
            let want: Vec<T> = {
                let mut sum = vec![T::from(0); len];
                let all = [&own[1..], &lent[0][1..], &lent[1][1..], &other[1..]];
                reduce_slices(ReduceOp::Sum, &all, &mut sum);
                sum
            };
            let bytes = len * std::mem::size_of::<T>();
            // Element 1 onward: off the 64-byte line where the buffers start.
            let at = |p: *const T| vec![(p as usize + std::mem::size_of::<T>(), bytes)];
            let own_at = at(own.as_mut_ptr());
            let [lent_0_at, lent_1_at] = lent.each_mut().map(|v| at(v.as_mut_ptr()));
            let srcs = [
                own_at.clone(),
                lent_0_at.clone(),
                lent_1_at.clone(),
                at(other.as_ptr()),
            ];
            let dsts = [own_at, lent_0_at, lent_1_at, at(fresh.as_mut_ptr())];
            combine::<T>(choice, ReduceOp::Sum, &srcs, &dsts);
            for (name, got) in [
                ("own", &own),
                ("lent 0", &lent[0]),
                ("lent 1", &lent[1]),
                ("fresh", &fresh),
            ] {
                let wrong = got[1..].iter().zip(&want).position(|(g, w)| g != w);
                assert_eq!(
                    wrong,
                    None,
                    "{name} with {}: first wrong element",
                    choice.spec()
                );
            }
        }
    }

    #[test]
    fn destinations_that_are_sources_get_the_sum_of_the_sources_before_the_call() {
        sums_over_its_own_sources::<f32>();
        sums_over_its_own_sources::<f64>();
        sums_over_its_own_sources::<u32>();
    }
}
