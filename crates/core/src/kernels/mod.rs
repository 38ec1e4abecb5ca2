//! Host reduction kernels: elementwise combine of several sources into one
//! destination, for every element type × op — the implementations of
//! [`Reduce`] every host executor (threads, processes) runs.
//!
//! Integers wrap on overflow. `f16` and `bf16` accumulate every source in
//! `f32` and round once per element, so a k-way sum rounds once, not k−1
//! times. `Avg` reduces as a sum here; the executor divides once at the end.
//! Loops run over raw pointers because in-place calls make the destination
//! the same memory as one of the sources (exactly the same range, element
//! for element — partial overlaps are staged by the caller).

mod calibrate;
mod choice;
mod lines;
mod reduce;
mod rule;
mod variant;
mod watch;

pub use calibrate::{Regime, pick};
pub use choice::{Calibration, RegimeChoice, calibration, chosen, for_call};
pub use rule::{ASSUMED_LLC_BYTES, LLC_SHARE, StoreRule, last_level_cache};
pub use variant::{Destination, KernelChoice, Stores, Width};
pub use watch::{
    KernelProbe, KernelWatch, Meter, SLOW_BELOW, SharedProbe, SlowedProbe, Switch, TimedProbe,
    WATCH_MIN_BYTES, WatchSettings,
};

pub use reduce::Reduce;

/// Stretches at least this long are written with non-temporal stores
/// (where the call's choice streams): they will not be read again from
/// cache, and skipping the write-allocate read of every destination line
/// saves a third of the memory traffic. Both host executors cut here.
pub const STREAM_MIN_BYTES: usize = 256 << 10;

use crate::types::ReduceOp;

/// Elements processed per block: small enough to stay in L1 while several
/// sources are folded into the destination.
const BLOCK: usize = 2048;

/// Fold `srcs` into `dst` block by block with `f`.
///
/// # Safety
/// As [`Reduce::reduce`].
#[inline(always)]
unsafe fn fold<T: Copy>(srcs: &[*const T], dst: *mut T, len: usize, f: impl Fn(T, T) -> T) {
    let mut start = 0;
    while start < len {
        let n = BLOCK.min(len - start);
        // SAFETY: the caller guarantees every source and the destination
        // cover `len` elements; `start + n <= len`.
        unsafe {
            let d = dst.add(start);
            match srcs {
                [] => unreachable!("a reduction has at least one source"),
                [a] => std::ptr::copy(a.add(start), d, n),
                [a, b, rest @ ..] => {
                    let (a, b) = (a.add(start), b.add(start));
                    for i in 0..n {
                        d.add(i).write(f(a.add(i).read(), b.add(i).read()));
                    }
                    for s in rest {
                        let s = s.add(start);
                        for i in 0..n {
                            d.add(i).write(f(d.add(i).read(), s.add(i).read()));
                        }
                    }
                }
            }
        }
        start += n;
    }
}

/// [`fold`] compiled for `width`: the same loops, vectorized as wide as
/// the CPU allows.
///
/// # Safety
/// As [`Reduce::reduce`]; `width` comes from a [`KernelChoice`], so the CPU
/// has it.
#[inline(always)]
unsafe fn fold_as<T: Copy>(
    width: Width,
    srcs: &[*const T],
    dst: *mut T,
    len: usize,
    f: impl Fn(T, T) -> T,
) {
    // SAFETY: forwarded; the target features were detected.
    unsafe {
        match width {
            #[cfg(target_arch = "x86_64")]
            Width::Avx2 => fold_avx2(srcs, dst, len, f),
            #[cfg(target_arch = "x86_64")]
            Width::Avx512 => fold_avx512(srcs, dst, len, f),
            _ => fold(srcs, dst, len, f),
        }
    }
}

/// # Safety
/// As [`fold_as`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fold_avx2<T: Copy>(srcs: &[*const T], dst: *mut T, len: usize, f: impl Fn(T, T) -> T) {
    // SAFETY: forwarded.
    unsafe { fold(srcs, dst, len, f) }
}

/// # Safety
/// As [`fold_as`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn fold_avx512<T: Copy>(srcs: &[*const T], dst: *mut T, len: usize, f: impl Fn(T, T) -> T) {
    // SAFETY: forwarded.
    unsafe { fold(srcs, dst, len, f) }
}

macro_rules! integer_reduce {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            unsafe fn reduce_with(choice: KernelChoice, op: ReduceOp, srcs: &[*const Self], dst: *mut Self, len: usize) {
                let w = choice.width();
                // SAFETY: forwarded from the caller.
                unsafe {
                    match op {
                        ReduceOp::Sum | ReduceOp::Avg => fold_as(w, srcs, dst, len, <$t>::wrapping_add),
                        ReduceOp::Prod => fold_as(w, srcs, dst, len, <$t>::wrapping_mul),
                        ReduceOp::Min => fold_as(w, srcs, dst, len, |a: $t, b: $t| a.min(b)),
                        ReduceOp::Max => fold_as(w, srcs, dst, len, |a: $t, b: $t| a.max(b)),
                    }
                }
            }

            fn divide(self, n: u32) -> Self {
                // Every world size fits the signed and unsigned 32/64-bit
                // types; for 8-bit types a world size above 127/255 makes
                // the average 0 (or unchanged for 1), as documented.
                match <$t>::try_from(n) {
                    Ok(d) if d != 0 => self / d,
                    _ => 0,
                }
            }
        }
    )*};
}

integer_reduce!(i8, u8, i32, u32, i64, u64);

/// The smaller of `a` and `b`, or NaN if either is NaN, whatever the
/// order: a NaN gradient must not vanish in a `min` (PyTorch's `minimum`
/// and `maximum` propagate NaN the same way; `f32::min` would drop it).
#[inline(always)]
fn nan_min<T: PartialOrd + Copy>(a: T, b: T) -> T {
    #[allow(clippy::eq_op)] // NaN is the one value unequal to itself.
    let b_nan = b != b;
    if b < a || b_nan { b } else { a }
}

/// The larger of `a` and `b`, or NaN if either is NaN (see [`nan_min`]).
#[inline(always)]
fn nan_max<T: PartialOrd + Copy>(a: T, b: T) -> T {
    #[allow(clippy::eq_op)] // NaN is the one value unequal to itself.
    let b_nan = b != b;
    if b > a || b_nan { b } else { a }
}

macro_rules! float_reduce {
    ($($t:ty => $fused:ident),*) => {$(
        impl Reduce for $t {
            unsafe fn reduce_with(choice: KernelChoice, op: ReduceOp, srcs: &[*const Self], dst: *mut Self, len: usize) {
                let w = choice.width();
                // SAFETY: forwarded from the caller.
                unsafe {
                    match op {
                        ReduceOp::Sum | ReduceOp::Avg => fold_as(w, srcs, dst, len, |a: $t, b: $t| a + b),
                        ReduceOp::Prod => fold_as(w, srcs, dst, len, |a: $t, b: $t| a * b),
                        ReduceOp::Min => fold_as(w, srcs, dst, len, nan_min::<$t>),
                        ReduceOp::Max => fold_as(w, srcs, dst, len, nan_max::<$t>),
                    }
                }
            }

            fn divide(self, n: u32) -> Self {
                self / n as $t
            }

            unsafe fn reduce_stream_with(choice: KernelChoice, op: ReduceOp, srcs: &[*const Self], dsts: &[*mut Self], len: usize) -> bool {
                // SAFETY: forwarded from the caller.
                matches!(op, ReduceOp::Sum | ReduceOp::Avg) && unsafe { lines::$fused(choice, srcs, dsts, len) }
            }
        }
    )*};
}

float_reduce!(f32 => sum_f32, f64 => sum_f64);

/// Elements of half-precision types converted per pass: two f32 blocks of
/// this many stay in L1 beside the sources.
const HALF_BLOCK: usize = 1024;

/// Fold half-precision sources into `dst` through f32, a block at a time:
/// each source block converted with the `half` crate's slice conversions
/// (vectorised where the CPU has them — F16C), combined in f32, and
/// rounded once to the destination type, as the element-wise loop did, but
/// without a conversion call and an indirect `op` call per element.
///
/// # Safety
/// As [`Reduce::reduce`].
unsafe fn half_fold<T>(srcs: &[*const T], dst: *mut T, len: usize, op: impl Fn(f32, f32) -> f32)
where
    [T]: half::slice::HalfFloatSliceExt,
{
    use half::slice::HalfFloatSliceExt;
    let mut acc = [0f32; HALF_BLOCK];
    let mut next = [0f32; HALF_BLOCK];
    let mut at = 0;
    while at < len {
        let n = HALF_BLOCK.min(len - at);
        // SAFETY: every source holds `len` elements; the block is inside.
        // The destination may be `srcs[0]` exactly: its block is read here,
        // before the same block is written below.
        unsafe {
            std::slice::from_raw_parts(srcs[0].add(at), n).convert_to_f32_slice(&mut acc[..n]);
            for s in &srcs[1..] {
                std::slice::from_raw_parts(s.add(at), n).convert_to_f32_slice(&mut next[..n]);
                for (a, b) in acc[..n].iter_mut().zip(&next[..n]) {
                    *a = op(*a, *b);
                }
            }
            std::slice::from_raw_parts_mut(dst.add(at), n).convert_from_f32_slice(&acc[..n]);
        }
        at += n;
    }
}

macro_rules! half_reduce {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            unsafe fn reduce_with(_choice: KernelChoice, op: ReduceOp, srcs: &[*const Self], dst: *mut Self, len: usize) {
                // SAFETY: forwarded from the caller.
                unsafe {
                    match op {
                        ReduceOp::Sum | ReduceOp::Avg => half_fold(srcs, dst, len, |a: f32, b: f32| a + b),
                        ReduceOp::Prod => half_fold(srcs, dst, len, |a: f32, b: f32| a * b),
                        ReduceOp::Min => half_fold(srcs, dst, len, nan_min::<f32>),
                        ReduceOp::Max => half_fold(srcs, dst, len, nan_max::<f32>),
                    }
                }
            }

            fn divide(self, n: u32) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
        }
    )*};
}

half_reduce!(half::f16, half::bf16);

/// Reduce safe slices into `dst` (a convenience for tests and benches).
pub fn reduce_slices<T: Reduce>(op: ReduceOp, srcs: &[&[T]], dst: &mut [T]) {
    assert!(!srcs.is_empty() && srcs.iter().all(|s| s.len() == dst.len()));
    let ptrs: Vec<*const T> = srcs.iter().map(|s| s.as_ptr()).collect();
    // SAFETY: every slice holds `dst.len()` elements and `dst` is a unique
    // borrow, so it overlaps none of the shared source slices.
    unsafe { T::reduce(op, &ptrs, dst.as_mut_ptr(), dst.len()) }
}

/// Copy `bytes` from `src` to `dst` with non-temporal stores where the
/// target supports them, so large outputs skip the write-allocate read of
/// every destination line. Call [`stream_fence`] before other threads may
/// read what was written.
///
/// # Safety
/// `src` is valid for `bytes` reads, `dst` for `bytes` writes, and they do
/// not overlap.
pub unsafe fn stream_copy(src: *const u8, dst: *mut u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let lead = dst.align_offset(16).min(bytes);
        let body = (bytes - lead) / 16;
        // SAFETY: all offsets stay within `bytes`; `dst + lead` is 16-byte
        // aligned as `_mm_stream_si128` requires; loads are unaligned-safe.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, lead);
            let (s, d) = (
                src.add(lead) as *const __m128i,
                dst.add(lead) as *mut __m128i,
            );
            for i in 0..body {
                _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i)));
            }
            let done = lead + body * 16;
            std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), bytes - done);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded from the caller.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, bytes);
    }
}

/// Order earlier non-temporal stores (from the streaming copies or
/// [`Reduce::reduce_stream`]) before later ordinary ones: call it before
/// publishing what they wrote to another thread or process.
pub fn stream_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn integer_ops_wrap_and_fold_many_sources() {
        let a = [250u8, 1, 7];
        let b = [10u8, 2, 3];
        let c = [1u8, 3, 9];
        let mut out = [0u8; 3];
        reduce_slices(ReduceOp::Sum, &[&a, &b, &c], &mut out);
        assert_eq!(out, [5, 6, 19]);
        reduce_slices(ReduceOp::Max, &[&a, &b, &c], &mut out);
        assert_eq!(out, [250, 3, 9]);
        reduce_slices(ReduceOp::Prod, &[&a, &b], &mut out);
        assert_eq!(out, [250u8.wrapping_mul(10), 2, 21]);
        assert_eq!(7i32.divide(2), 3);
        assert_eq!((-7i32).divide(2), -3);
    }

    #[test]
    fn half_precision_rounds_once() {
        // 1 + 2^-11 eight times: pairwise f16 adds would lose every
        // increment; accumulating in f32 keeps them.
        let one = [f16::from_f32(1.0)];
        let tiny = [f16::from_f32(2f32.powi(-11))];
        let mut srcs: Vec<&[f16]> = vec![&one];
        srcs.extend(std::iter::repeat_n(&tiny[..], 8));
        let mut out = [f16::ZERO];
        reduce_slices(ReduceOp::Sum, &srcs, &mut out);
        assert_eq!(out[0], f16::from_f32(1.0 + 8.0 * 2f32.powi(-11)));
        let mut out = [bf16::ZERO];
        reduce_slices(
            ReduceOp::Min,
            &[&[bf16::from_f32(3.0)][..], &[bf16::from_f32(-2.0)][..]],
            &mut out,
        );
        assert_eq!(out[0].to_f32(), -2.0);
    }

    #[test]
    fn long_runs_cross_block_boundaries() {
        let n = BLOCK * 2 + 17;
        let a: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let b: Vec<f64> = (0..n).map(|i| 2.0 * i as f64).collect();
        let mut out = vec![0.0; n];
        reduce_slices(ReduceOp::Sum, &[&a, &b], &mut out);
        assert!(out.iter().enumerate().all(|(i, &x)| x == 3.0 * i as f64));
    }

    /// Alignments and tails of the fused sums: `lines.rs`'s tests, for
    /// every variant. Here: only sums are fused.
    #[test]
    fn only_sums_take_the_fused_path() {
        let a = [1.0f64; 7];
        let mut d = [0.0f64; 7];
        // SAFETY: as above.
        let done =
            unsafe { f64::reduce_stream(ReduceOp::Max, &[a.as_ptr()], &[d.as_mut_ptr()], 7) };
        assert!(!done, "only sums are fused");
    }
}
