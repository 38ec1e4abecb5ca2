//! Memory a communicator lends to its caller: buffers its peers can read
//! in place when a call uses them (a shared-memory heap), for a caller
//! that keeps buffers across many calls (gradient buckets) and would
//! otherwise have every call copy them.
//!
//! A backend offers a [`Lender`] through [`Communicator::lender`]; the
//! lender hands out bytes ([`LentMemory`]) and [`LentBuffer`] views them
//! as elements. Lent memory is zeroed when handed out and goes back to
//! its backend on drop, even after the communicator is gone.
//!
//! [`Communicator::lender`]: super::Communicator::lender

use std::marker::PhantomData;
use std::sync::Arc;

use crate::types::Element;

/// Hands out `bytes` bytes of lent memory, or `None` when there is none
/// left: callers then use their own memory, which works the same, with a
/// copy per call.
pub type Lender = Arc<dyn Fn(usize) -> Option<LentMemory> + Send + Sync>;

/// Bytes a backend lent, zeroed, returned to it on drop.
pub struct LentMemory {
    /// Keeps the bytes alive, out of its box (so that no move of a box
    /// can invalidate `start` where the bytes lie inside it) until `drop`;
    /// never asked for them again after `new`, so what it would answer
    /// later cannot matter.
    owner: *mut dyn Send,
    /// The bytes, taken once from the owner.
    start: *mut u8,
    len: usize,
}

impl Drop for LentMemory {
    fn drop(&mut self) {
        // SAFETY: `owner` came from `Box::into_raw` in `new`, and only this
        // drop gives it back.
        drop(unsafe { Box::from_raw(self.owner) });
    }
}

// SAFETY: the owner and its bytes are `Send`, owned by this value alone,
// and reached only through its own borrows.
unsafe impl Send for LentMemory {}

impl std::fmt::Debug for LentMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentMemory")
            .field("bytes", &self.len)
            .finish()
    }
}

impl LentMemory {
    /// Lend `owner`'s bytes (what its `as_mut` answers once, here); a
    /// backend's lender calls this. They should be zeroed: every element
    /// type takes any bytes, but callers expect a fresh buffer to read 0.
    pub fn new<O: AsMut<[u8]> + Send + 'static>(owner: O) -> LentMemory {
        // On the heap first: bytes the owner holds inline then stay put.
        let owner: *mut O = Box::into_raw(Box::new(owner));
        // SAFETY: `owner` is the live, unique allocation made just above.
        let bytes = unsafe { (*owner).as_mut() };
        let (start, len) = (bytes.as_mut_ptr(), bytes.len());
        LentMemory {
            owner: owner as *mut dyn Send,
            start,
            len,
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Lent memory seen as `len` elements of `T`.
pub struct LentBuffer<T: Element> {
    memory: LentMemory,
    len: usize,
    _type: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for LentBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentBuffer")
            .field("dtype", &T::DATA_TYPE)
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Element> LentBuffer<T> {
    /// `len` elements from `lender`, or `None` when it has no room left
    /// or lent memory that is too short or not aligned for `T`.
    pub fn from_lender(lender: &Lender, len: usize) -> Option<LentBuffer<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        let memory = lender(bytes)?;
        let aligned = memory.start.align_offset(std::mem::align_of::<T>()) == 0;
        (memory.len >= bytes && aligned).then_some(LentBuffer {
            memory,
            len,
            _type: PhantomData,
        })
    }
}

impl<T: Element> AsRef<[T]> for LentBuffer<T> {
    fn as_ref(&self) -> &[T] {
        // SAFETY: `from_lender` checked that the bytes, fixed since
        // `LentMemory::new`, are aligned for `T` and hold `len` of them;
        // `Element` types have no padding and take every bit pattern; the
        // owner keeps them alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.memory.start.cast::<T>(), self.len) }
    }
}

impl<T: Element> AsMut<[T]> for LentBuffer<T> {
    fn as_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `as_ref`; `&mut self` makes the borrow unique, and
        // the bytes came from the owner's unique borrow.
        unsafe { std::slice::from_raw_parts_mut(self.memory.start.cast::<T>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lends `bytes` bytes of a vector of u64 (so 8-byte aligned),
    /// starting `skew` bytes in; none past `room`.
    fn lender(skew: usize, room: usize) -> Lender {
        struct Skewed {
            words: Vec<u64>,
            skew: usize,
            bytes: usize,
        }
        impl AsMut<[u8]> for Skewed {
            fn as_mut(&mut self) -> &mut [u8] {
                // SAFETY: the words viewed as their bytes.
                let all = unsafe {
                    std::slice::from_raw_parts_mut(
                        self.words.as_mut_ptr().cast::<u8>(),
                        self.words.len() * 8,
                    )
                };
                &mut all[self.skew..self.skew + self.bytes]
            }
        }
        Arc::new(move |bytes: usize| {
            (bytes <= room).then(|| {
                LentMemory::new(Skewed {
                    words: vec![0; bytes / 8 + 2],
                    skew,
                    bytes,
                })
            })
        })
    }

    /// An owner whose answers change: the first is the one that counts.
    struct Shifty(Vec<u64>, usize);
    impl AsMut<[u8]> for Shifty {
        fn as_mut(&mut self) -> &mut [u8] {
            self.1 += 1;
            // SAFETY: the words viewed as their bytes.
            let all = unsafe {
                std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), self.0.len() * 8)
            };
            &mut all[self.1 - 1..]
        }
    }

    #[test]
    fn the_owner_is_asked_for_its_bytes_once() {
        let lender: Lender = Arc::new(|bytes| Some(LentMemory::new(Shifty(vec![0; bytes / 8], 0))));
        let mut b = LentBuffer::<u64>::from_lender(&lender, 4).expect("aligned at first");
        b.as_mut()[3] = 7;
        assert_eq!(b.as_ref(), &[0, 0, 0, 7]);
        assert_eq!(b.memory.len(), 32);
    }

    #[test]
    fn an_owner_may_hold_its_bytes_inline() {
        #[repr(align(8))]
        struct Inline([u8; 24]);
        impl AsMut<[u8]> for Inline {
            fn as_mut(&mut self) -> &mut [u8] {
                &mut self.0
            }
        }
        let lender: Lender = Arc::new(|_| Some(LentMemory::new(Inline([0; 24]))));
        let mut b = LentBuffer::<u64>::from_lender(&lender, 3).expect("aligned");
        b.as_mut()[2] = 5;
        let moved = b;
        assert_eq!(moved.as_ref(), &[0, 0, 5]);
    }

    #[test]
    fn lent_bytes_become_elements_only_when_aligned_and_long_enough() {
        let mut b = LentBuffer::<f32>::from_lender(&lender(0, 1 << 10), 5).expect("aligned");
        assert_eq!(b.as_ref(), &[0.0; 5], "zeroed when handed out");
        b.as_mut()[4] = 2.5;
        assert_eq!(b.as_ref()[4], 2.5);
        assert!(
            LentBuffer::<f64>::from_lender(&lender(4, 1 << 10), 3).is_none(),
            "misaligned"
        );
        assert!(
            LentBuffer::<u32>::from_lender(&lender(4, 1 << 10), 3).is_some(),
            "4-aligned"
        );
        assert!(
            LentBuffer::<f32>::from_lender(&lender(0, 16), 5).is_none(),
            "no room"
        );
        assert!(
            LentBuffer::<u64>::from_lender(&lender(0, 16), usize::MAX).is_none(),
            "overflow"
        );
        assert_eq!(
            LentBuffer::<u8>::from_lender(&lender(0, 16), 0).map(|b| b.as_ref().len()),
            Some(0)
        );
    }
}
