//! This machine's memory bandwidth, so the bench can report busbw as a
//! fraction of what the memory allows in the same run and the `host`
//! topology can carry a measured rate.
//!
//! Three kernels on buffers far larger than the caches, split over every
//! core: a plain copy (which also pays a hidden write-allocate read per
//! destination line, so it understates the limit), a copy with
//! non-temporal stores (no write-allocate), and an in-place accumulate
//! `a[i] += b[i]` (whose destination is read anyway). Bytes counted are the
//! ones the kernel asks for: read + written.

use std::time::Instant;

use serde::Serialize;

/// Bytes per array for a careful measurement: large enough to defeat any
/// last-level cache.
pub const ARRAY_BYTES: usize = 256 << 20;

/// Best sustained rates, in GB/s (1e9 bytes per second).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MemoryBandwidth {
    /// Plain copy, read + written bytes per second / 1e9.
    pub copy: f64,
    /// Copy with non-temporal stores, where the CPU has them.
    pub nt_copy: Option<f64>,
    /// In-place accumulate `a[i] += b[i]` (two reads and a write per element).
    pub accumulate: f64,
    /// The best of the three.
    pub best: f64,
    /// Threads the kernels were split over.
    pub threads: usize,
}

/// Measure with arrays of `array_bytes` split over `threads` threads, the
/// best of `repeats` runs per kernel.
pub fn measure(array_bytes: usize, threads: usize, repeats: usize) -> MemoryBandwidth {
    let threads = threads.max(1);
    let words = (array_bytes / 8).max(threads);
    let src: Vec<u64> = (0..words as u64).collect();
    let mut dst = vec![0u64; words];
    let copy = best(threads, repeats, &src, &mut dst, 2.0, |s, d| {
        d.copy_from_slice(s)
    });
    let nt_copy = nt::available().then(|| best(threads, repeats, &src, &mut dst, 2.0, nt::copy));
    let accumulate = best(threads, repeats, &src, &mut dst, 3.0, |s, d| {
        for (x, y) in d.iter_mut().zip(s) {
            *x = x.wrapping_add(*y);
        }
    });
    let best = copy.max(nt_copy.unwrap_or(0.0)).max(accumulate);
    MemoryBandwidth {
        copy,
        nt_copy,
        accumulate,
        best,
        threads,
    }
}

/// Best rate over a few repeats of `kernel` split across `threads`, with
/// `passes` array-sizes of traffic per run.
fn best(
    threads: usize,
    repeats: usize,
    src: &[u64],
    dst: &mut [u64],
    passes: f64,
    kernel: impl Fn(&[u64], &mut [u64]) + Sync,
) -> f64 {
    let per = src.len().div_ceil(threads);
    let mut rate: f64 = 0.0;
    for _ in 0..repeats.max(1) {
        let started = Instant::now();
        std::thread::scope(|scope| {
            for (s, d) in src.chunks(per).zip(dst.chunks_mut(per)) {
                let kernel = &kernel;
                scope.spawn(move || kernel(s, d));
            }
        });
        let secs = started.elapsed().as_secs_f64();
        rate = rate.max(passes * (src.len() * 8) as f64 / secs / 1e9);
    }
    rate
}

#[cfg(target_arch = "x86_64")]
mod nt {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    pub(super) fn available() -> bool {
        true // SSE2 is part of x86-64.
    }

    /// Copy with streaming stores where the destination is 16-byte aligned.
    pub(super) fn copy(src: &[u64], dst: &mut [u64]) {
        let n = src.len().min(dst.len());
        let lead = dst.as_ptr().align_offset(16).min(n);
        dst[..lead].copy_from_slice(&src[..lead]);
        let body = (n - lead) / 2;
        // SAFETY: `lead` makes `dst[lead..]` 16-byte aligned; `body` pairs
        // of u64 fit in both slices; the loads are unaligned-safe.
        unsafe {
            let s = src.as_ptr().add(lead) as *const __m128i;
            let d = dst.as_mut_ptr().add(lead) as *mut __m128i;
            for i in 0..body {
                _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i)));
            }
            _mm_sfence();
        }
        let done = lead + body * 2;
        dst[done..n].copy_from_slice(&src[done..n]);
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod nt {
    pub(super) fn available() -> bool {
        false
    }

    pub(super) fn copy(src: &[u64], dst: &mut [u64]) {
        dst.copy_from_slice(src);
    }
}
