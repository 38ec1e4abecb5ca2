//! [`Reduce`]: an element type every backend can combine with a
//! [`ReduceOp`]: the trait's declaration; its bodies for the ten element
//! types are the kernels beside it.

use super::{KernelChoice, chosen};
use crate::types::{Element, ReduceOp};

/// An element type that can be reduced: the bound of every collective
/// that combines values, on every backend.
pub trait Reduce: Element {
    /// `dst[i] = op(srcs[0][i], srcs[1][i], ...)` for `i < len`.
    ///
    /// # Safety
    /// Every pointer in `srcs` is valid for `len` reads and `dst` for `len`
    /// writes; `dst` overlaps no source except, exactly, `srcs[0]` (the
    /// kernel reads the first two sources of an element before writing it,
    /// then folds the rest into `dst`). `srcs` is not empty.
    unsafe fn reduce(op: ReduceOp, srcs: &[*const Self], dst: *mut Self, len: usize) {
        // SAFETY: forwarded from the caller.
        unsafe { Self::reduce_with(chosen(), op, srcs, dst, len) }
    }

    /// [`reduce`](Self::reduce) with a given kernel variant (tests and
    /// benches force each one; calls use the calibrated [`chosen`]).
    ///
    /// # Safety
    /// As [`reduce`](Self::reduce).
    unsafe fn reduce_with(
        choice: KernelChoice,
        op: ReduceOp,
        srcs: &[*const Self],
        dst: *mut Self,
        len: usize,
    );

    /// `self / n`, the final step of `Avg` (integers truncate toward zero).
    fn divide(self, n: u32) -> Self;

    /// Reduce `srcs` and store the result into every destination in one
    /// pass (non-temporal or cached stores, as calibrated), when this type and op have a fused
    /// kernel; returns false (having done nothing) otherwise, and the
    /// caller falls back to reduce-then-copy.
    ///
    /// # Safety
    /// Every source is valid for `len` reads and every destination for
    /// `len` writes; destinations overlap no other destination, and no
    /// source except exactly (the same first element: in place) — every
    /// element of every source is read before that element is written.
    unsafe fn reduce_stream(
        op: ReduceOp,
        srcs: &[*const Self],
        dsts: &[*mut Self],
        len: usize,
    ) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { Self::reduce_stream_with(chosen(), op, srcs, dsts, len) }
    }

    /// [`reduce_stream`](Self::reduce_stream) with a given kernel variant;
    /// its stores (non-temporal or cached) are the variant's.
    ///
    /// # Safety
    /// As [`reduce_stream`](Self::reduce_stream).
    unsafe fn reduce_stream_with(
        _choice: KernelChoice,
        _op: ReduceOp,
        _srcs: &[*const Self],
        _dsts: &[*mut Self],
        _len: usize,
    ) -> bool {
        false
    }
}
