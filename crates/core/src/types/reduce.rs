//! [`Reduce`]: an element type every backend can combine with a
//! [`ReduceOp`]. The host implementations live in [`crate::kernels`].

use super::{Element, ReduceOp};

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
    unsafe fn reduce(op: ReduceOp, srcs: &[*const Self], dst: *mut Self, len: usize);

    /// `self / n`, the final step of `Avg` (integers truncate toward zero).
    fn divide(self, n: u32) -> Self;

    /// Reduce `srcs` and store the result into every destination with
    /// non-temporal stores in one pass, when this type and op have a fused
    /// kernel; returns false (having done nothing) otherwise, and the
    /// caller falls back to reduce-then-copy.
    ///
    /// # Safety
    /// Every source is valid for `len` reads and every destination for
    /// `len` writes; destinations overlap no source and no other destination.
    unsafe fn reduce_stream(
        _op: ReduceOp,
        _srcs: &[*const Self],
        _dsts: &[*mut Self],
        _len: usize,
    ) -> bool {
        false
    }
}
