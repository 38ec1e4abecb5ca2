//! Host memory that starts on a cache line: what the library allocates for
//! data its kernels stream through (the threads' slots, the bench's
//! arrays; the processes' segments and heap are laid out on lines too).
//!
//! A 64-byte vector load from an address 16 bytes past a line touches two
//! lines. The line kernels align their destination and load the sources at
//! the same offsets, so sources and destinations that sit at different
//! offsets within their lines split every source load: measured here
//! (AMD EPYC, AVX-512, f32 sum of two 64 MiB arrays into a third, streaming
//! stores) 20 GB/s against 27 with everything on a line. The system
//! allocator gives large blocks at 16 bytes past a page, so a buffer of
//! one allocator and one laid out on lines would always disagree.

use std::collections::TryReserveError;
use std::fmt;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};

/// Bytes of a cache line: where every buffer of this module starts.
pub const LINE_BYTES: usize = 64;

/// One cache line of bytes, aligned to a line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct CacheLine(pub(crate) [u8; LINE_BYTES]);

impl CacheLine {
    /// A line of zeros.
    pub(crate) const ZERO: CacheLine = CacheLine([0; LINE_BYTES]);
}

/// A fixed-length array of `T` that starts on a cache line; it derefs to
/// `[T]`.
pub struct AlignedBuffer<T> {
    lines: Lines,
    len: usize,
    _items: PhantomData<T>,
}

impl<T: Copy> AlignedBuffer<T> {
    /// A copy of `items` on fresh lines; the allocator's error where the
    /// memory cannot be had.
    pub fn try_copy(items: &[T]) -> Result<AlignedBuffer<T>, TryReserveError> {
        let mut b = Self::uninit(items.len())?;
        // SAFETY: `b` holds room for `items.len()` values, a fresh
        // allocation apart from `items`; every value is written before
        // `b` is handed out.
        unsafe {
            std::ptr::copy_nonoverlapping(items.as_ptr(), b.items(), items.len());
        }
        Ok(b)
    }

    /// `len` values, `f(i)` at `i`, on fresh lines; the allocator's error
    /// where the memory cannot be had.
    pub fn try_from_fn(
        len: usize,
        mut f: impl FnMut(usize) -> T,
    ) -> Result<AlignedBuffer<T>, TryReserveError> {
        let mut b = Self::uninit(len)?;
        let items = b.items();
        for i in 0..len {
            // SAFETY: `i < len`, and `b` holds room for `len` values;
            // every value is written before `b` is handed out.
            unsafe { items.add(i).write(f(i)) };
        }
        Ok(b)
    }

    /// `len` values whose bytes are all zero, on fresh lines that nothing
    /// has touched yet: the allocator hands out zeroed pages without
    /// writing them, so a gigabyte costs its page faults once, where the
    /// caller first writes it, instead of a fill and then the write.
    pub fn try_zeroed(len: usize) -> Result<AlignedBuffer<T>, TryReserveError>
    where
        T: crate::Element,
    {
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        #[cfg(target_os = "linux")]
        if bytes >= MAPPED_MIN_BYTES
            && let Some(mapped) = Mapped::populated(bytes)
        {
            return Ok(AlignedBuffer {
                lines: Lines::Mapped(mapped),
                len,
                _items: PhantomData,
            });
        }
        let mut b = Self::uninit(len)?;
        if let Lines::Heap(v) = &mut b.lines {
            v.fill(MaybeUninit::new(CacheLine::ZERO));
        }
        Ok(b)
    }

    /// Room for `len` values on fresh lines, not yet written: the
    /// constructors write every value before they return it.
    fn uninit(len: usize) -> Result<AlignedBuffer<T>, TryReserveError> {
        const {
            assert!(std::mem::align_of::<T>() <= LINE_BYTES);
        }
        let lines = len
            .saturating_mul(std::mem::size_of::<T>())
            .div_ceil(LINE_BYTES);
        let mut v: Vec<MaybeUninit<CacheLine>> = Vec::new();
        v.try_reserve_exact(lines)?;
        v.resize(lines, MaybeUninit::uninit());
        Ok(AlignedBuffer {
            lines: Lines::Heap(v),
            len,
            _items: PhantomData,
        })
    }

    /// Where the values lie (aligned for `T`: lines are).
    fn items(&mut self) -> *mut T {
        self.lines.start_mut().cast::<T>()
    }
}

/// Where a buffer's lines live.
enum Lines {
    /// From the global allocator.
    Heap(Vec<MaybeUninit<CacheLine>>),
    /// Pages of their own, faulted in at once.
    #[cfg(target_os = "linux")]
    Mapped(Mapped),
}

impl Lines {
    /// The first line (dangling but aligned when there are none), to read.
    fn start(&self) -> *const CacheLine {
        match self {
            Lines::Heap(v) => v.as_ptr().cast::<CacheLine>(),
            #[cfg(target_os = "linux")]
            Lines::Mapped(m) => m.at.as_ptr(),
        }
    }

    /// The first line, to write.
    fn start_mut(&mut self) -> *mut CacheLine {
        match self {
            Lines::Heap(v) => v.as_mut_ptr().cast::<CacheLine>(),
            #[cfg(target_os = "linux")]
            Lines::Mapped(m) => m.at.as_ptr(),
        }
    }
}

/// From this size on, zeroed buffers get pages of their own, populated by
/// the kernel in one call: measured here (AMD EPYC VM), faulting in a
/// gigabyte page by page took 0.53 s, populating it 0.31 s, and a large
/// benchmark row touches several.
#[cfg(target_os = "linux")]
const MAPPED_MIN_BYTES: usize = 64 << 20;

/// An anonymous private mapping, unmapped on drop.
#[cfg(target_os = "linux")]
struct Mapped {
    at: std::ptr::NonNull<CacheLine>,
    bytes: usize,
}

#[cfg(target_os = "linux")]
impl Mapped {
    /// `bytes` (not zero) of zeroed pages, populated; `None` where the
    /// kernel refuses the mapping (the caller falls back to the heap).
    fn populated(bytes: usize) -> Option<Mapped> {
        // SAFETY: a new anonymous private mapping at an address of the
        // kernel's choosing: it aliases nothing.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return None;
        }
        // Pages start on lines; a mapping is never at address 0.
        let at = std::ptr::NonNull::new(at.cast::<CacheLine>())?;
        Some(Mapped { at, bytes })
    }
}

#[cfg(target_os = "linux")]
impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: `at..at + bytes` is the mapping `populated` made, which
        // nothing uses once its buffer is dropped.
        unsafe {
            libc::munmap(self.at.as_ptr().cast(), self.bytes);
        }
    }
}

// SAFETY: a mapping is owned by its buffer alone, as a `Vec`'s allocation
// is; sending or sharing it is sending or sharing the buffer.
#[cfg(target_os = "linux")]
unsafe impl Send for Mapped {}
// SAFETY: as above.
#[cfg(target_os = "linux")]
unsafe impl Sync for Mapped {}

impl<T: Copy> Deref for AlignedBuffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the first `len * size_of::<T>()` bytes were written from
        // `len` valid values of `T` (by `try_copy` or `try_from_fn`) and
        // start on a line, which is aligned for `T` (checked at compile
        // time); with no bytes, the pointer is dangling but aligned.
        unsafe { std::slice::from_raw_parts(self.lines.start().cast::<T>(), self.len) }
    }
}

impl<T: Copy> DerefMut for AlignedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`, and `&mut self` makes the borrow exclusive;
        // any `T` written through it is a valid `T`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.start_mut().cast::<T>(), self.len) }
    }
}

impl<T: Copy + fmt::Debug> fmt::Debug for AlignedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuffer")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_on_a_line_and_hold_what_they_copied() {
        for len in [0usize, 1, 15, 16, 17, 1000, 300_001] {
            let items: Vec<f32> = (0..len).map(|i| i as f32 * 0.5).collect();
            let mut b = AlignedBuffer::try_copy(&items).unwrap();
            assert_eq!(b.as_ptr() as usize % LINE_BYTES, 0, "len {len}");
            assert_eq!(&b[..], &items[..]);
            if let Some(x) = b.last_mut() {
                *x = -1.0;
                assert_eq!(b[len - 1], -1.0);
            }
        }
        let bytes = AlignedBuffer::try_copy(&[7u8; 3]).unwrap();
        assert_eq!(&bytes[..], [7, 7, 7]);
        let unit = AlignedBuffer::try_copy(&[(); 5]).unwrap();
        assert_eq!(unit.len(), 5);
        let made = AlignedBuffer::try_from_fn(100_003, |i| i as u64 * 3).unwrap();
        assert_eq!(made.as_ptr() as usize % LINE_BYTES, 0);
        assert!(made.iter().enumerate().all(|(i, &x)| x == i as u64 * 3));
        assert!(AlignedBuffer::try_from_fn(usize::MAX / 2, |_| 0u64).is_err());
        for len in [0usize, 1, 17, 300_001, (64 << 20) / 4 + 3] {
            let z = AlignedBuffer::<f32>::try_zeroed(len).unwrap();
            assert_eq!(z.as_ptr() as usize % LINE_BYTES, 0);
            assert!(z.len() == len && z.iter().all(|&x| x == 0.0));
        }
        assert!(AlignedBuffer::<u64>::try_zeroed(usize::MAX / 2).is_err());
    }
}
