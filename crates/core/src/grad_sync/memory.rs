//! A bucket's flat buffer: memory its communicator lends where it lends
//! any (over shared-memory processes, the heap its peers read in place,
//! so a bucket's all-reduce moves no copy through a slot), else a vector.

use crate::comm::{Lender, LentBuffer};
use crate::types::Element;

/// Where a bucket's elements live.
pub(super) enum BucketMemory<T: Element> {
    /// Lent by the communicator.
    Lent(LentBuffer<T>),
    /// This process's own.
    Own(Vec<T>),
}

impl<T: Element + Default> BucketMemory<T> {
    /// `len` zeroed elements: lent when `lender` has room, else owned.
    pub(super) fn new(lender: Option<&Lender>, len: usize) -> BucketMemory<T> {
        match lender.and_then(|l| LentBuffer::from_lender(l, len)) {
            Some(lent) => BucketMemory::Lent(lent),
            None => BucketMemory::Own(vec![T::default(); len]),
        }
    }

    /// Whether the communicator lent it.
    pub(super) fn is_lent(&self) -> bool {
        matches!(self, BucketMemory::Lent(_))
    }
}

impl<T: Element> AsRef<[T]> for BucketMemory<T> {
    fn as_ref(&self) -> &[T] {
        match self {
            BucketMemory::Lent(b) => b.as_ref(),
            BucketMemory::Own(v) => v,
        }
    }
}

impl<T: Element> AsMut<[T]> for BucketMemory<T> {
    fn as_mut(&mut self) -> &mut [T] {
        match self {
            BucketMemory::Lent(b) => b.as_mut(),
            BucketMemory::Own(v) => v,
        }
    }
}
