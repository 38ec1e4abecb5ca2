//! The kernel watch's checkpoint run over a communicator: what both host
//! communicators do right after the collective that made it due.

use super::{CommError, Communicator, CommunicatorExt};
use crate::kernels::KernelWatch;

/// Run the checkpoint of the watch `watch_of` finds in `comm`, its
/// all-reduces over `comm` itself (every rank made the call that made it
/// due, so every rank gets here). The watch is taken out while its
/// all-reduces run, so they are ordinary calls of `comm`.
pub fn kernel_checkpoint<C: Communicator>(
    comm: &mut C,
    watch_of: fn(&mut C) -> &mut KernelWatch,
) -> Result<(), CommError> {
    let mut watch = std::mem::replace(watch_of(comm), KernelWatch::off());
    let result = watch.checkpoint(&mut |values, op| comm.all_reduce_in_place(values, op));
    *watch_of(comm) = watch;
    result.map(drop)
}
