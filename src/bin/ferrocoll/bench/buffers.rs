//! The bench's buffers, allocated fallibly: sizes come from the command
//! line, so an allocator's refusal is a typed error naming the buffer.

use ferrocoll::aligned::AlignedBuffer;
use ferrocoll::comm::CommError;

/// An empty vector with room for `len` elements, or [`CommError::Capacity`]
/// naming `what` when the allocator refuses (sizes come from the command
/// line, so a refusal is the user's to fix, not a crash).
pub(crate) fn try_with_capacity<T>(len: usize, what: &str) -> Result<Vec<T>, CommError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|e| CommError::Capacity {
        what: format!(
            "cannot allocate the {what} buffer of {len} elements of {} bytes: {e}",
            std::mem::size_of::<T>()
        ),
    })?;
    Ok(v)
}

/// A copy of `items` starting on a cache line, allocated fallibly.
pub(crate) fn try_aligned<T: Copy>(items: &[T], what: &str) -> Result<AlignedBuffer<T>, CommError> {
    AlignedBuffer::try_copy(items).map_err(|e| CommError::Capacity {
        what: format!(
            "cannot allocate the {what} buffer of {} elements of {} bytes: {e}",
            items.len(),
            std::mem::size_of::<T>()
        ),
    })
}

/// `len` copies of `value` starting on a cache line, allocated fallibly.
pub(crate) fn try_filled<T: Copy>(
    value: T,
    len: usize,
    what: &str,
) -> Result<AlignedBuffer<T>, CommError> {
    AlignedBuffer::try_from_fn(len, |_| value).map_err(|e| CommError::Capacity {
        what: format!(
            "cannot allocate the {what} buffer of {len} elements of {} bytes: {e}",
            std::mem::size_of::<T>()
        ),
    })
}
