//! How many steps a built-in schedule will have, before it is built: the
//! selector charges its work budget and refuses what no plan could hold
//! without paying for gigabytes of steps first.

use ferrocoll_core::plan::MAX_PLAN_INSTRUCTIONS;
use ferrocoll_core::{Algorithm, Collective};

use crate::error::TopologyError;

/// Steps of a built-in ring or direct schedule of `collective` on `n`
/// ranks and `channels` channels (each rank takes O(n) steps per
/// channel), known before it is built; `None` for the others (tree,
/// halving-doubling: O(log n) per rank).
pub(super) fn linear_steps(
    algorithm: Algorithm,
    collective: Collective,
    n: u32,
    channels: u32,
) -> Option<u64> {
    use ferrocoll_core::CollectiveKind as K;
    if !matches!(algorithm, Algorithm::Ring | Algorithm::Direct) {
        return None;
    }
    let n64 = u64::from(n);
    let per_rank = match collective.kind() {
        K::AllReduce | K::AllToAll => 2 * n64 - 1,
        K::ReduceScatter | K::AllGather => n64,
        _ => 2,
    };
    Some(n64 * u64::from(channels) * per_rank)
}

/// A schedule of more steps than a plan may hold is refused by name,
/// not built.
pub(super) fn check_plan_steps(
    steps: u64,
    algorithm: Algorithm,
    channels: u32,
    n: u32,
) -> Result<(), TopologyError> {
    if steps > MAX_PLAN_INSTRUCTIONS {
        return Err(TopologyError::Invalid(format!(
            "`{algorithm}` x{channels} on {n} ranks has {steps} steps, more than a plan may hold ({MAX_PLAN_INSTRUCTIONS})"
        )));
    }
    Ok(())
}
