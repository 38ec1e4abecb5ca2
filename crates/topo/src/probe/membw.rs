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

/// One of the probe's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// `dst = src` with plain stores.
    Copy,
    /// `dst = src` with non-temporal stores.
    NtCopy,
    /// `dst += src`.
    Accumulate,
}

impl Kernel {
    /// The kernels this CPU has, in the order [`measure`] runs them.
    pub fn available() -> Vec<Kernel> {
        let mut all = vec![Kernel::Copy];
        if nt::available() {
            all.push(Kernel::NtCopy);
        }
        all.push(Kernel::Accumulate);
        all
    }

    /// Array-sizes of traffic one pass asks for: read + written.
    pub fn passes(self) -> f64 {
        match self {
            Kernel::Copy | Kernel::NtCopy => 2.0,
            Kernel::Accumulate => 3.0,
        }
    }

    fn run(self, src: &[u64], dst: &mut [u64]) {
        match self {
            Kernel::Copy => dst.copy_from_slice(src),
            Kernel::NtCopy => nt::copy(src, dst),
            Kernel::Accumulate => {
                for (x, y) in dst.iter_mut().zip(src) {
                    *x = x.wrapping_add(*y);
                }
            }
        }
    }
}

/// One thread's share of a probe: a source and a destination array,
/// written once when made so no pass pays the first touch of a page.
/// Threads that each run a pass on their own arrays at the same moment
/// measure the machine as [`measure`] does, from wherever they already
/// are (the bench's ranks, between their timed calls).
#[derive(Debug)]
pub struct Arrays {
    src: Vec<u64>,
    dst: Vec<u64>,
}

impl Arrays {
    /// Two arrays of `bytes` each (rounded down to 8-byte words, at least
    /// one), or the allocator's refusal.
    pub fn new(bytes: usize) -> Result<Arrays, std::collections::TryReserveError> {
        let words = (bytes / 8).max(1);
        let mut src = Vec::new();
        src.try_reserve_exact(words)?;
        src.extend(0..words as u64);
        let mut dst = Vec::new();
        dst.try_reserve_exact(words)?;
        dst.resize(words, 0);
        Ok(Arrays { src, dst })
    }

    /// Bytes of one array.
    pub fn bytes(&self) -> usize {
        self.src.len() * 8
    }

    /// One pass of `kernel`; returns the bytes it read and wrote.
    pub fn pass(&mut self, kernel: Kernel) -> f64 {
        kernel.run(&self.src, &mut self.dst);
        kernel.passes() * self.bytes() as f64
    }
}

/// Measure with arrays of `array_bytes` split over `threads` threads, the
/// best of `repeats` runs per kernel.
pub fn measure(array_bytes: usize, threads: usize, repeats: usize) -> MemoryBandwidth {
    let threads = threads.max(1);
    let words = (array_bytes / 8).max(threads);
    let src: Vec<u64> = (0..words as u64).collect();
    let mut dst = vec![0u64; words];
    let mut rate = |kernel: Kernel| best(threads, repeats, &src, &mut dst, kernel);
    let copy = rate(Kernel::Copy);
    let nt_copy = nt::available().then(|| rate(Kernel::NtCopy));
    let accumulate = rate(Kernel::Accumulate);
    let best = copy.max(nt_copy.unwrap_or(0.0)).max(accumulate);
    MemoryBandwidth {
        copy,
        nt_copy,
        accumulate,
        best,
        threads,
    }
}

/// Best rate over a few repeats of `kernel` split across `threads`.
fn best(threads: usize, repeats: usize, src: &[u64], dst: &mut [u64], kernel: Kernel) -> f64 {
    let per = src.len().div_ceil(threads);
    let mut rate: f64 = 0.0;
    for _ in 0..repeats.max(1) {
        let started = Instant::now();
        std::thread::scope(|scope| {
            for (s, d) in src.chunks(per).zip(dst.chunks_mut(per)) {
                scope.spawn(move || kernel.run(s, d));
            }
        });
        let secs = started.elapsed().as_secs_f64();
        rate = rate.max(kernel.passes() * (src.len() * 8) as f64 / secs / 1e9);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_counts_what_its_kernel_reads_and_writes() {
        let mut arrays = Arrays::new(4096 + 5).unwrap();
        assert_eq!(arrays.bytes(), 4096, "whole 8-byte words");
        for kernel in Kernel::available() {
            assert_eq!(arrays.pass(kernel), kernel.passes() * 4096.0);
        }
        // Copy, maybe the non-temporal copy (the same values), then one
        // accumulate: dst = 2 * src.
        assert!(arrays.dst.iter().zip(&arrays.src).all(|(d, s)| *d == 2 * s));
        let kinds = Kernel::available();
        assert_eq!(kinds.first(), Some(&Kernel::Copy));
        assert_eq!(kinds.last(), Some(&Kernel::Accumulate));
    }

    #[test]
    fn an_empty_request_still_has_a_word() {
        assert_eq!(Arrays::new(0).unwrap().bytes(), 8);
    }
}
