//! The bench's buffers, allocated fallibly: sizes come from the command
//! line, so an allocator's refusal is a typed error naming the buffer.

use ferrocoll::Collective;
use ferrocoll::aligned::AlignedBuffer;
use ferrocoll::comm::CommError;
use ferrocoll::conformance::KitElement;
use ferrocoll::types::InPlaceAlias;

/// `len` values on cache lines, `f(i)` at `i`, or [`CommError::Capacity`]
/// naming `what` when the allocator refuses (sizes come from the command
/// line, so a refusal is the user's to fix, not a crash).
pub(crate) fn try_from_fn<T: Copy>(
    len: usize,
    what: &str,
    f: impl FnMut(usize) -> T,
) -> Result<AlignedBuffer<T>, CommError> {
    AlignedBuffer::try_from_fn(len, f).map_err(|e| capacity::<T>(what, len, e))
}

/// `len` zeros on cache lines not yet touched (the caller's first write
/// faults them in), allocated fallibly.
pub(crate) fn try_zeroed<T: KitElement>(
    len: usize,
    what: &str,
) -> Result<AlignedBuffer<T>, CommError> {
    AlignedBuffer::try_zeroed(len).map_err(|e| capacity::<T>(what, len, e))
}

/// The error of an allocator's refusal of `len` elements for `what`.
fn capacity<T>(what: &str, len: usize, e: std::collections::TryReserveError) -> CommError {
    CommError::Capacity {
        what: format!(
            "cannot allocate the {what} buffer of {len} elements of {} bytes: {e}",
            std::mem::size_of::<T>()
        ),
    }
}

/// `len` copies of `value` starting on a cache line, allocated fallibly.
pub(crate) fn try_filled<T: Copy>(
    value: T,
    len: usize,
    what: &str,
) -> Result<AlignedBuffer<T>, CommError> {
    try_from_fn(len, what, |_| value)
}

/// What a call's output holds before the call: poison wherever the call
/// must write, and the rank's own input where an in-place call reads it
/// from the output. Written in place and in pieces, so a backend refills
/// the buffers it placed once per size instead of allocating (and
/// faulting in) a gigabyte per mode, and stages device uploads in chunks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pattern<'a, T> {
    len: usize,
    /// The input and where it starts in the output (empty: none).
    input: (&'a [T], usize),
}

impl<'a, T: KitElement> Pattern<'a, T> {
    /// `len` poisoned elements: an out-of-place call's output.
    pub(crate) fn poison(len: usize) -> Self {
        Pattern {
            len,
            input: (&[], 0),
        }
    }

    /// The buffer of rank `rank`'s in-place call of `collective` on
    /// `input` (blocks of `count`), whose out-of-place output has
    /// `out_len` elements: the input at its block of the output, or the
    /// whole input where the output is a block of it.
    pub(crate) fn in_place(
        collective: Collective,
        rank: u32,
        count: usize,
        input: &'a [T],
        out_len: usize,
    ) -> Self {
        match collective.in_place_alias(rank) {
            Some(InPlaceAlias::InputIsOutputBlock(b)) => Pattern {
                len: out_len,
                input: (input, b as usize * count),
            },
            Some(InPlaceAlias::OutputIsInputBlock(_)) => Pattern {
                len: input.len(),
                input: (input, 0),
            },
            None => Self::poison(out_len),
        }
    }

    /// Elements of the buffer.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Write elements `at..at + into.len()` of the buffer into `into`
    /// (each element once: this runs over gigabytes).
    pub(crate) fn write(&self, at: usize, into: &mut [T]) {
        let (input, start) = self.input;
        // The part of `at..at + into.len()` the input covers, if any.
        let lo = at.max(start);
        let hi = (at + into.len()).min(start + input.len());
        if lo >= hi {
            into.fill(T::poison());
            return;
        }
        into[..lo - at].fill(T::poison());
        into[lo - at..hi - at].copy_from_slice(&input[lo - start..hi - start]);
        into[hi - at..].fill(T::poison());
    }

    /// A new buffer on cache lines holding the pattern, allocated fallibly.
    pub(crate) fn try_aligned(&self, what: &str) -> Result<AlignedBuffer<T>, CommError> {
        let mut b = try_zeroed(self.len, what)?;
        self.write(0, &mut b);
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written in chunks of any size from any offset (as GPU backends
    /// stage it), a pattern is the buffer written whole: poison, and the
    /// input at its block, for chunks before, across and after it.
    #[test]
    fn a_pattern_written_in_chunks_is_the_pattern_written_whole() {
        let input: Vec<f32> = (1..=5).map(|i| i as f32).collect();
        let c = Collective::AllGather;
        for pattern in [
            Pattern::poison(13),
            Pattern::in_place(c, 0, 5, &input, 15),
            Pattern::in_place(c, 1, 5, &input, 15),
            Pattern::in_place(c, 2, 5, &input, 15),
            Pattern::in_place(Collective::ReduceScatter, 1, 5, &input, 1),
        ] {
            let mut whole = vec![0.0f32; pattern.len()];
            pattern.write(0, &mut whole);
            let (got, at) = pattern.input;
            if !got.is_empty() {
                assert_eq!(&whole[at..at + got.len()], &input[..], "{pattern:?}");
            }
            let poisoned = whole.iter().filter(|&&x| x == f32::poison()).count();
            assert_eq!(poisoned, pattern.len() - got.len(), "{pattern:?}");
            for chunk in 1..=pattern.len() {
                let mut pieces = vec![0.0f32; pattern.len()];
                for (k, piece) in pieces.chunks_mut(chunk).enumerate() {
                    pattern.write(k * chunk, piece);
                }
                assert_eq!(pieces, whole, "{pattern:?} in chunks of {chunk}");
            }
        }
    }
}
