//! Fused sum-and-store kernels that work a 64-byte cache line at a time:
//! every source's line is loaded and summed in registers, then the whole
//! line is written to one destination before the next destination gets
//! it. A write-combining buffer thus always fills completely before it
//! drains (interleaving partial lines across destinations makes some CPUs
//! flush half-empty buffers, at a fraction of the bandwidth).
//!
//! One function per element type takes a [`KernelChoice`]; behind it, one
//! `#[target_feature]` body per vector width.

use super::variant::{KernelChoice, Stores, Width};

/// Bytes in a cache line: the unit every destination is written in.
const LINE: usize = 64;

#[cfg(target_arch = "x86_64")]
macro_rules! line_body {
    ($name:ident, $feature:literal, $t:ty, $v:ty, $lanes:expr, $zero:ident, $load:ident, $add:ident, $store:ident, $stream:ident) => {
        /// Sum `srcs` over `[start, end)` into every destination, a line at
        /// a time; `end - start` is a whole number of lines.
        ///
        /// # Safety
        /// As [`sum_f32`]; the CPU has the target feature; with `nt`, every
        /// destination is 64-byte aligned at `start`.
        #[target_feature(enable = $feature)]
        pub(super) unsafe fn $name(
            srcs: &[*const $t],
            dsts: &[*mut $t],
            start: usize,
            end: usize,
            nt: bool,
        ) {
            use std::arch::x86_64::*;
            const VECS: usize = LINE / std::mem::size_of::<$t>() / $lanes;
            let mut i = start;
            while i < end {
                // SAFETY: `i + VECS * lanes <= end <= len` for every source
                // and destination; loads are unaligned; streams are aligned
                // as the caller checked.
                unsafe {
                    let mut acc: [$v; VECS] = [$zero(); VECS];
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = $load(srcs[0].add(i + k * $lanes));
                    }
                    for s in &srcs[1..] {
                        for (k, a) in acc.iter_mut().enumerate() {
                            *a = $add(*a, $load(s.add(i + k * $lanes)));
                        }
                    }
                    for &d in dsts {
                        for (k, a) in acc.iter().enumerate() {
                            if nt {
                                $stream(d.add(i + k * $lanes), *a);
                            } else {
                                $store(d.add(i + k * $lanes), *a);
                            }
                        }
                    }
                }
                i += VECS * $lanes;
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::LINE;
    line_body!(
        f32_sse2,
        "sse2",
        f32,
        std::arch::x86_64::__m128,
        4,
        _mm_setzero_ps,
        _mm_loadu_ps,
        _mm_add_ps,
        _mm_storeu_ps,
        _mm_stream_ps
    );
    line_body!(
        f32_avx2,
        "avx2",
        f32,
        std::arch::x86_64::__m256,
        8,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_add_ps,
        _mm256_storeu_ps,
        _mm256_stream_ps
    );
    line_body!(
        f32_avx512,
        "avx512f",
        f32,
        std::arch::x86_64::__m512,
        16,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_add_ps,
        _mm512_storeu_ps,
        _mm512_stream_ps
    );
    line_body!(
        f64_sse2,
        "sse2",
        f64,
        std::arch::x86_64::__m128d,
        2,
        _mm_setzero_pd,
        _mm_loadu_pd,
        _mm_add_pd,
        _mm_storeu_pd,
        _mm_stream_pd
    );
    line_body!(
        f64_avx2,
        "avx2",
        f64,
        std::arch::x86_64::__m256d,
        4,
        _mm256_setzero_pd,
        _mm256_loadu_pd,
        _mm256_add_pd,
        _mm256_storeu_pd,
        _mm256_stream_pd
    );
    line_body!(
        f64_avx512,
        "avx512f",
        f64,
        std::arch::x86_64::__m512d,
        8,
        _mm512_setzero_pd,
        _mm512_loadu_pd,
        _mm512_add_pd,
        _mm512_storeu_pd,
        _mm512_stream_pd
    );
}

/// Where the line-aligned body of a run starts and ends, or `None` when
/// non-temporal stores cannot be used (destinations misaligned relative to
/// each other).
fn body<T>(dsts: &[*mut T], len: usize, nt: bool) -> Option<(usize, usize)> {
    let size = std::mem::size_of::<T>();
    let first = dsts.first()?;
    let head = first.align_offset(LINE);
    if head == usize::MAX || (nt && dsts.iter().any(|d| d.align_offset(LINE) != head)) {
        return None;
    }
    let head = head.min(len);
    let per_line = LINE / size;
    Some((head, head + (len - head) / per_line * per_line))
}

macro_rules! sum_fn {
    ($name:ident, $t:ty, $sse2:ident, $avx2:ident, $avx512:ident) => {
        /// Sum `srcs` into every destination with `choice`'s width and
        /// stores; false (nothing done) when its non-temporal stores cannot
        /// reach these destinations' alignment.
        ///
        /// # Safety
        /// Every source is valid for `len` reads and every destination for
        /// `len` writes; destinations overlap no other destination, and no
        /// source except exactly (the same first element), which is safe
        /// because every element — scalar in the head and tail, a whole
        /// line in the body — is loaded from every source before it is
        /// stored; `srcs` is not empty.
        pub(crate) unsafe fn $name(
            choice: KernelChoice,
            srcs: &[*const $t],
            dsts: &[*mut $t],
            len: usize,
        ) -> bool {
            let nt = choice.stores() == Stores::NonTemporal;
            let Some((head, end)) = body(dsts, len, nt) else {
                return dsts.is_empty();
            };
            let scalar = |i: usize| {
                // SAFETY: `i < len`; bounds from the caller.
                unsafe {
                    let mut acc = srcs[0].add(i).read();
                    for s in &srcs[1..] {
                        acc += s.add(i).read();
                    }
                    for d in dsts {
                        d.add(i).write(acc);
                    }
                }
            };
            (0..head).for_each(scalar);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `choice` exists only for widths this CPU has; the
            // body is whole lines within `len`, aligned for streams.
            unsafe {
                match choice.width() {
                    Width::Baseline => x86::$sse2(srcs, dsts, head, end, nt),
                    Width::Avx2 => x86::$avx2(srcs, dsts, head, end, nt),
                    Width::Avx512 => x86::$avx512(srcs, dsts, head, end, nt),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            (head..end).for_each(scalar);
            (end..len).for_each(scalar);
            true
        }
    };
}

sum_fn!(sum_f32, f32, f32_sse2, f32_avx2, f32_avx512);
sum_fn!(sum_f64, f64, f64_sse2, f64_avx2, f64_avx512);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant this CPU can run, on every misalignment of sources
    /// and destinations, with heads and tails.
    #[test]
    fn every_runnable_variant_sums_exactly_on_any_alignment() {
        for choice in KernelChoice::available() {
            for (so, d0o, d1o) in [(0, 0, 0), (1, 0, 0), (3, 5, 5), (7, 2, 9), (0, 16, 16)] {
                for len in [0usize, 1, 15, 16, 17, 1000, 4099] {
                    let a: Vec<f32> = (0..len + 32).map(|i| i as f32).collect();
                    let b: Vec<f32> = (0..len + 32).map(|i| 0.25 * i as f32).collect();
                    let mut d0 = vec![-1f32; len + 32];
                    let mut d1 = vec![-1f32; len + 32];
                    let srcs = [a[so..].as_ptr(), b[so..].as_ptr()];
                    let dsts = [d0[d0o..].as_mut_ptr(), d1[d1o..].as_mut_ptr()];
                    // SAFETY: every array has `len + 32` elements, offsets < 32.
                    let done = unsafe { sum_f32(choice, &srcs, &dsts, len) };
                    super::super::stream_fence();
                    if !done {
                        assert_eq!(choice.stores(), Stores::NonTemporal);
                        assert_ne!(
                            dsts[0].align_offset(LINE),
                            dsts[1].align_offset(LINE),
                            "{choice}: refused aligned destinations"
                        );
                        continue;
                    }
                    for i in 0..len {
                        let want = 1.25 * (i + so) as f32;
                        assert_eq!(
                            (d0[d0o + i], d1[d1o + i]),
                            (want, want),
                            "{choice} {so}/{d0o}/{d1o} len {len} i {i}"
                        );
                    }
                    assert_eq!(
                        d0.get(d0o + len),
                        Some(&-1.0),
                        "{choice}: wrote past the end"
                    );
                    let x: Vec<f64> = (0..len + 8).map(|i| i as f64).collect();
                    let mut y = vec![0f64; len + 8];
                    // SAFETY: as above.
                    let done = unsafe {
                        sum_f64(
                            choice,
                            &[x[so % 8..].as_ptr(), x[so % 8..].as_ptr()],
                            &[y[d0o % 8..].as_mut_ptr()],
                            len,
                        )
                    };
                    super::super::stream_fence();
                    assert!(done, "one destination is always aligned with itself");
                    assert!(
                        (0..len).all(|i| y[d0o % 8 + i] == 2.0 * (i + so % 8) as f64),
                        "{choice} f64"
                    );
                }
            }
        }
    }
}
