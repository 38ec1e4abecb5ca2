//! Settings of a CUDA group.

use std::sync::Arc;
use std::time::Duration;

use ferrocoll_core::plan::{DEVICE_CHUNK_BYTES, PlannerSettings};
use ferrocoll_core::select::SharedSelector;
use ferrocoll_core::{Algorithm, CollectiveKind, Verified};

/// The largest call the device interpreter sends as LL by default: about
/// where NCCL's LL gives way to its bulk protocols on NVLink. To be
/// calibrated on a GPU (`scripts/gpu-check.sh` prints both sides of it).
pub const DEFAULT_LL_MAX_BYTES: usize = 64 << 10;

/// Settings every rank of a CUDA group shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaConfig {
    /// The longest any wait (for peers, or for the device) may last.
    pub timeout: Duration,
    /// Force an algorithm; `None` asks `selector`, then [`device_rule`].
    pub algorithm: Option<Algorithm>,
    /// Selects the algorithm of calls that force none (its selection brings
    /// its own channels and chunk size).
    pub selector: Option<SharedSelector>,
    /// Channels (each its own stream per rank) for ring, tree and direct.
    pub channels: u32,
    /// The largest chunk one kernel launch of a step moves, in bytes.
    pub max_chunk_bytes: usize,
    /// Mailbox slots per link (at least the verifier's 2).
    pub slots_per_link: u32,
    /// Use peer access between devices where the hardware allows it;
    /// `false` relays every message between two ranks through pinned host
    /// memory (like `NCCL_P2P_DISABLE=1`), even between ranks sharing a
    /// GPU — which is how the relay is tested on one device.
    pub p2p: bool,
    /// A schedule of your own for calls whose collective and world size
    /// match it.
    pub schedule: Option<Arc<Verified>>,
    /// The device interpreter's small-message (LL) protocol: an LL slot
    /// carries messages of up to this many bytes (0 turns LL off). Without
    /// a topology selector, calls of up to this size take LL; with one,
    /// the selector chooses per size, and LL runs where every message
    /// fits. Executor v1 has no LL and ignores it.
    pub ll_max_bytes: usize,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            timeout: Duration::from_secs(60),
            algorithm: None,
            selector: None,
            channels: 1,
            max_chunk_bytes: DEVICE_CHUNK_BYTES,
            slots_per_link: 4,
            p2p: true,
            schedule: None,
            ll_max_bytes: DEFAULT_LL_MAX_BYTES,
        }
    }
}

/// The CUDA executor's rule when nothing is forced and no selector
/// answers: rings for the bandwidth-bound collectives, as NCCL does on a
/// single node; direct where only direct applies; a star from the root for
/// broadcast and reduce on up to eight ranks, trees above.
pub fn device_rule(
    kind: CollectiveKind,
    world_size: u32,
    _bytes: usize,
) -> (Algorithm, &'static str) {
    use CollectiveKind as C;
    match kind {
        C::AllToAll | C::SendRecv => (Algorithm::Direct, "only direct expresses it"),
        C::Broadcast | C::Reduce if world_size <= 8 => {
            (Algorithm::Direct, "few ranks: one hop from the root")
        }
        C::Broadcast | C::Reduce => (Algorithm::Tree, "many ranks: log-depth tree"),
        _ if world_size <= 2 => (Algorithm::Direct, "two ranks: one exchange each way"),
        _ => (
            Algorithm::Ring,
            "ring: every link carries 1/n of the data per step",
        ),
    }
}

impl CudaConfig {
    /// How the group plans its calls.
    pub fn planner_settings(&self) -> PlannerSettings {
        PlannerSettings {
            algorithm: self.algorithm,
            selector: self.selector.clone(),
            channels: self.channels,
            max_chunk_bytes: self.max_chunk_bytes,
            max_message_bytes: None,
            max_ll_message_bytes: None,
            slots_per_link: ferrocoll_core::plan::link_slots(
                self.slots_per_link,
                self.schedule.as_deref(),
            ),
            schedule: self.schedule.clone(),
            rule: device_rule,
            one_shot_bytes: 0,
            max_channels: None,
        }
    }
}
