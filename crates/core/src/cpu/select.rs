//! The `auto` rule of the CPU executor, until the topology-aware selector
//! replaces it: shared memory is a full mesh in which every rank reaches
//! every other rank's buffer at the same cost.

use crate::algorithms::Algorithm;
use crate::types::CollectiveKind;

/// Above this many ranks, direct's n² messages per call cost more than
/// ring's 2n; below, direct moves each byte the fewest times.
const DIRECT_MAX_RANKS: u32 = 16;

/// Above this many ranks a rooted star funnels too much through the root.
const STAR_MAX_RANKS: u32 = 8;

/// The algorithm `auto` picks for a call, and why (for the debug log).
pub fn auto_algorithm(
    kind: CollectiveKind,
    world_size: u32,
    _bytes: usize,
) -> (Algorithm, &'static str) {
    use CollectiveKind as C;
    match kind {
        C::AllToAll | C::SendRecv => (Algorithm::Direct, "only direct expresses it"),
        C::Broadcast | C::Reduce if world_size <= STAR_MAX_RANKS => {
            (Algorithm::Direct, "few ranks: one star hop from the root")
        }
        C::Broadcast | C::Reduce => (Algorithm::Tree, "many ranks: log-depth tree from the root"),
        _ if world_size <= DIRECT_MAX_RANKS => (
            Algorithm::Direct,
            "shared memory is a full mesh: direct reads every input once and writes every output once",
        ),
        _ => (
            Algorithm::Ring,
            "many ranks: ring keeps messages per call linear in n",
        ),
    }
}
