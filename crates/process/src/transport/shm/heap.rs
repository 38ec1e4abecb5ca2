//! The shared heap: the tail of each rank's segment, mapped by every
//! rank of the group, from which [`SharedBuffer`]s are handed out. A value
//! that lies in a buffer of the sender's heap travels as an offset, and
//! the receiver reduces from it or copies it out in place — no copy
//! through a slot, the way threads read each other's memory.
//!
//! Only the owner allocates from its heap. Peers read it only while a
//! message of the current call names it (a call that succeeds returns
//! only once every such message was consumed), and write it only where
//! the owner posted a direct-write destination for that call (a call that
//! fails withdraws its posts and waits, bounded, for a peer that already
//! took one). After a failed call the buffers' contents are unspecified:
//! a peer still inside that call may read them, or finish a write.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use ferrocoll_core::comm::CommError;
use ferrocoll_core::link::HeapMap;
use ferrocoll_core::types::Element;

use super::Segments;

/// Alignment of every buffer: a cache line, so element kernels run
/// aligned and two buffers never share a line.
const ALIGN: usize = 64;

/// One rank's own heap: where it starts in this process and which parts
/// are free.
pub(crate) struct Heap {
    /// Keeps every mapping of the group alive while buffers exist.
    _segments: Arc<Segments>,
    base: usize,
    len: usize,
    /// Free ranges (offset, bytes), sorted, never adjacent.
    free: Mutex<Vec<(usize, usize)>>,
}

impl std::fmt::Debug for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heap").field("len", &self.len).finish()
    }
}

impl Heap {
    pub(super) fn new(segments: Arc<Segments>, base: usize, len: usize) -> Self {
        let free = if len == 0 { Vec::new() } else { vec![(0, len)] };
        Heap {
            _segments: segments,
            base,
            len,
            free: Mutex::new(free),
        }
    }

    fn allocate(&self, bytes: usize) -> Option<usize> {
        let want = bytes.max(1).checked_next_multiple_of(ALIGN)?;
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let i = free.iter().position(|&(_, n)| n >= want)?;
        let (offset, n) = free[i];
        if n == want {
            free.remove(i);
        } else {
            free[i] = (offset + want, n - want);
        }
        Some(offset)
    }

    fn release(&self, offset: usize, bytes: usize) {
        let size = bytes.max(1).next_multiple_of(ALIGN);
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let i = free.partition_point(|&(o, _)| o < offset);
        free.insert(i, (offset, size));
        // Merge with the neighbours it touches.
        if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
            free[i].1 += free[i + 1].1;
            free.remove(i + 1);
        }
        if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
            free[i - 1].1 += free[i].1;
            free.remove(i);
        }
    }
}

/// A buffer in this rank's shared heap (see
/// `ProcessCommunicator::shared_buffer`): a slice of `T` like a `Vec`'s,
/// which peers read in place when a collective uses it — the
/// shared-memory transport's zero-copy path. Zeroed when handed out;
/// returned to the heap on drop.
pub struct SharedBuffer<T: Element> {
    heap: Arc<Heap>,
    offset: usize,
    len: usize,
    _type: PhantomData<T>,
}

// SAFETY: the buffer owns its heap range exclusively (the allocator hands
// each range out once); peers only read it during calls that borrow it.
unsafe impl<T: Element> Send for SharedBuffer<T> {}
// SAFETY: as above; `&SharedBuffer` gives only shared access to `T: Sync`.
unsafe impl<T: Element> Sync for SharedBuffer<T> {}

impl<T: Element> SharedBuffer<T> {
    pub(crate) fn new(heap: Arc<Heap>, len: usize) -> Result<Self, CommError> {
        let bytes =
            len.checked_mul(std::mem::size_of::<T>())
                .ok_or_else(|| CommError::Capacity {
                    what: format!("a shared buffer of {len} elements overflows"),
                })?;
        let offset = heap.allocate(bytes).ok_or_else(|| CommError::Capacity {
            what: format!(
                "{bytes} bytes do not fit what is free of the {}-byte shared heap (raise ProcessConfig::shared_heap_bytes)",
                heap.len
            ),
        })?;
        let buffer = SharedBuffer {
            heap,
            offset,
            len,
            _type: PhantomData,
        };
        // SAFETY: the range is ours alone and lies in the mapping; all-zero
        // bytes are a valid value of every element type.
        unsafe { std::ptr::write_bytes(buffer.ptr() as *mut u8, 0, bytes) };
        Ok(buffer)
    }

    fn ptr(&self) -> *mut T {
        (self.heap.base + self.offset) as *mut T
    }
}

impl<T: Element> std::ops::Deref for SharedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` elements at an aligned address inside the live
        // mapping, owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
}

impl<T: Element> std::ops::DerefMut for SharedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }
}

impl<T: Element> AsRef<[T]> for SharedBuffer<T> {
    fn as_ref(&self) -> &[T] {
        self
    }
}

impl<T: Element> AsMut<[T]> for SharedBuffer<T> {
    fn as_mut(&mut self) -> &mut [T] {
        self
    }
}

impl<T: Element> std::fmt::Debug for SharedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Element> Drop for SharedBuffer<T> {
    fn drop(&mut self) {
        let bytes = self.len * std::mem::size_of::<T>();
        self.heap.release(self.offset, bytes);
    }
}

/// The heaps of a group as one rank sees them: its own, to allocate
/// from, and where every rank's lies in this process's mappings.
#[derive(Debug)]
pub(crate) struct Heaps {
    pub own: Arc<Heap>,
    pub map: Arc<HeapMap>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heap(len: usize) -> Heap {
        let segments = Arc::new(Segments {
            shape: super::super::Shape {
                world_size: 1,
                channels: 1,
                slots: 2,
                slot_bytes: 64,
                staging_bytes: 0,
                heap_bytes: 0,
            },
            all: Vec::new(),
        });
        Heap::new(segments, 1 << 20, len)
    }

    #[test]
    fn ranges_are_aligned_reused_and_merged() {
        let h = heap(1024);
        let a = h.allocate(10).unwrap();
        let b = h.allocate(100).unwrap();
        let c = h.allocate(64).unwrap();
        assert_eq!((a, b, c), (0, 64, 192));
        assert!(h.allocate(1024).is_none(), "full");
        h.release(b, 100);
        h.release(a, 10);
        assert_eq!(h.allocate(192), Some(0), "a and b merged");
        h.release(0, 192);
        h.release(c, 64);
        assert_eq!(*h.free.lock().unwrap(), [(0, 1024)]);
        assert!(h.allocate(usize::MAX).is_none());
    }
}
