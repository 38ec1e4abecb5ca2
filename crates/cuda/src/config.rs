//! Settings of a CUDA group, and its rule for calls nothing else decides.

use ferrocoll_core::comm::Planning;
use ferrocoll_core::plan::DEVICE_CHUNK_BYTES;
use ferrocoll_core::{Algorithm, CollectiveKind};
use std::path::PathBuf;

/// The largest call the device interpreter sends as LL by default: about
/// where NCCL's LL gives way to its bulk protocols on NVLink. To be
/// calibrated on a GPU (`scripts/gpu-check.sh` prints both sides of it).
pub const DEFAULT_LL_MAX_BYTES: usize = 64 << 10;

/// Calls up to this size take one exchange with every peer (direct)
/// rather than a ring when messages are staged: a ring's 2(n − 1) steps
/// each cost a flag round trip, which dominates small calls (NCCL's
/// tuning likewise leaves rings to large messages).
pub const SMALL_CALL_BYTES: usize = 64 << 10;

/// Settings every rank of a CUDA group shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaConfig {
    /// How calls are planned: timeout (for peers, and for the device),
    /// algorithm or schedule, selector (without one, [`device_rule`], or
    /// [`staged_rule`] where messages are staged), channels (a thread block
    /// each, per rank; unless set, an equal share of the blocks each GPU
    /// holds at once among its ranks, at most 64), chunk size (the
    /// windows' slot size, within a memory budget; [`DEVICE_CHUNK_BYTES`]
    /// unless set), slots.
    pub planning: Planning,
    /// Use peer access between devices where the hardware allows it;
    /// `false` places every window in pinned host memory all GPUs map and
    /// stages every message there (like `NCCL_P2P_DISABLE=1`), even
    /// between ranks sharing a GPU — which is how the relay is tested on
    /// one device.
    pub p2p: bool,
    /// The small-message (LL) protocol: an LL slot carries messages of up
    /// to this many bytes (0 turns LL off). Without a topology selector,
    /// calls of up to this size take LL; with one, the selector chooses
    /// per size, and LL runs where every message fits.
    pub ll_max_bytes: usize,
    /// A folder where the compiled interpreter is kept between processes
    /// (`None`: compiled once per process). The facade sets it from
    /// `FERROCOLL_KERNEL_CACHE` or the user's cache folder.
    pub kernel_cache: Option<PathBuf>,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            planning: Planning::default(),
            p2p: true,
            ll_max_bytes: DEFAULT_LL_MAX_BYTES,
            kernel_cache: None,
        }
    }
}

/// The CUDA executor's rule when nothing is forced and no selector
/// answers, for ranks that address each other's buffers: direct, where
/// the owner of each chunk reads every peer's input chunk in place and
/// stores the result into every peer's output — each byte read once and
/// written once, the least any schedule moves; a star from the root for
/// broadcast and reduce on up to eight ranks, trees above.
pub fn device_rule(
    kind: CollectiveKind,
    world_size: u32,
    _bytes: usize,
) -> (Algorithm, &'static str) {
    use CollectiveKind as C;
    match kind {
        C::Broadcast | C::Reduce if world_size > 8 => {
            (Algorithm::Tree, "many ranks: log-depth tree")
        }
        C::Broadcast | C::Reduce => (Algorithm::Direct, "few ranks: one hop from the root"),
        _ => (
            Algorithm::Direct,
            "zero copy: every byte read once and written once",
        ),
    }
}

/// The rule where messages are staged (windows in host memory, or ranks
/// in other processes): rings for large calls, as NCCL does on a single
/// node, direct for small ones and wherever only direct applies.
pub fn staged_rule(
    kind: CollectiveKind,
    world_size: u32,
    bytes: usize,
) -> (Algorithm, &'static str) {
    use CollectiveKind as C;
    match kind {
        C::AllToAll | C::SendRecv => (Algorithm::Direct, "only direct expresses it"),
        C::Broadcast | C::Reduce if world_size <= 8 => {
            (Algorithm::Direct, "few ranks: one hop from the root")
        }
        C::Broadcast | C::Reduce => (Algorithm::Tree, "many ranks: log-depth tree"),
        _ if world_size <= 2 => (Algorithm::Direct, "two ranks: one exchange each way"),
        _ if bytes <= SMALL_CALL_BYTES => (
            Algorithm::Direct,
            "small call: one step, not a ring's 2(n-1)",
        ),
        _ => (
            Algorithm::Ring,
            "ring: every link carries 1/n of the data per step",
        ),
    }
}

impl CudaConfig {
    /// The chunk size: as set, or the built-in.
    pub fn max_chunk_bytes(&self) -> usize {
        self.planning.max_chunk_bytes.unwrap_or(DEVICE_CHUNK_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_staged_calls_take_one_step_and_large_ones_a_ring() {
        use CollectiveKind as C;
        assert_eq!(staged_rule(C::AllReduce, 8, 4 << 10).0, Algorithm::Direct);
        assert_eq!(
            staged_rule(C::AllReduce, 8, SMALL_CALL_BYTES).0,
            Algorithm::Direct
        );
        assert_eq!(
            staged_rule(C::AllReduce, 8, SMALL_CALL_BYTES + 1).0,
            Algorithm::Ring
        );
        assert_eq!(staged_rule(C::AllReduce, 2, 1 << 30).0, Algorithm::Direct);
        assert_eq!(device_rule(C::AllReduce, 8, 1 << 30).0, Algorithm::Direct);
        assert_eq!(device_rule(C::Broadcast, 16, 1 << 30).0, Algorithm::Tree);
    }
}
