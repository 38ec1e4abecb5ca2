//! The memory of emulated devices: an arena other threads write into,
//! a call's local buffers as raw bytes, and avg's last division.

use ferrocoll_core::types::Reduce;

use crate::program::{BufferId, Local, RankProgram};

/// Memory other threads write into, ordered by the counters: a raw
/// allocation, zeroed and 16-byte aligned (as device allocations are, for
/// the kernel's vector accesses), so that no reference to the whole of it
/// ever exists while threads write their parts.
pub(crate) struct Arena {
    ptr: *mut u128,
    words: usize,
}

// SAFETY: every access to an arena's bytes is ordered by the protocol's
// counters (a store into a slot happens before the release of `posted`
// that the reader acquires; a read happens before the release of
// `consumed` that the next writer of the slot acquires), so no two threads
// touch the same bytes without a happens-before between them — which is
// exactly what the tests of this module check.
unsafe impl Sync for Arena {}

// SAFETY: the arena owns its allocation; sending it moves that ownership.
unsafe impl Send for Arena {}

impl Arena {
    pub(crate) fn new(bytes: u64) -> Self {
        let words = bytes.div_ceil(16).max(1) as usize;
        let ptr = Box::into_raw(vec![0u128; words].into_boxed_slice()).cast::<u128>();
        Arena { ptr, words }
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.cast()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `words` came from `Box::into_raw` of a boxed
        // slice of that length, freed once, here.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.words)) });
    }
}

/// A call's local buffers, as raw bytes.
pub(super) struct Memory {
    pub(super) input: *const u8,
    pub(super) output: *mut u8,
    pub(super) scratch: *mut u8,
}

// SAFETY: blocks of one rank touch disjoint bytes of these buffers or are
// ordered by `after` waits (the verifier proves races between channels
// absent), which the emulation honours with acquire/release progress words.
unsafe impl Sync for Memory {}

impl Memory {
    pub(super) fn base(&self, b: BufferId) -> *mut u8 {
        match b {
            // In place, plans name only the output; an input region is
            // read only.
            BufferId::Input => self.input.cast_mut(),
            BufferId::Output => self.output,
            BufferId::Scratch => self.scratch,
            BufferId::None => std::ptr::null_mut(),
        }
    }
}

/// Divide the elements of `d` by `n`, the end of `Avg`.
///
/// # Safety
/// The region is inside the rank's buffers and nothing else touches them.
pub(super) unsafe fn divide<T: Reduce>(memory: &Memory, me: &RankProgram, d: &Local, n: u32) {
    let base = memory.base(d.buffer);
    let size = std::mem::size_of::<T>();
    for p in &me.pieces[d.pieces.first as usize..(d.pieces.first + d.pieces.count) as usize] {
        // SAFETY: forwarded from the caller; offsets are multiples of the
        // element size in a buffer of `T`.
        let xs = unsafe {
            std::slice::from_raw_parts_mut(
                base.add(p.offset as usize).cast::<T>(),
                p.bytes as usize / size,
            )
        };
        for x in xs {
            *x = x.divide(n);
        }
    }
}

/// The bytes of a vector of elements.
pub(super) fn bytes_of<T: Reduce>(v: &[T]) -> &[u8] {
    // SAFETY: every `Reduce` type is plain data without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}
