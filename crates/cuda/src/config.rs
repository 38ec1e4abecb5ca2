//! Settings of a CUDA group.

use std::sync::Arc;
use std::time::Duration;

use ferrocoll_core::choose::SharedChooser;
use ferrocoll_core::{Algorithm, CollectiveKind, Verified};

/// Settings every rank of a CUDA group shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaConfig {
    /// The longest any wait (for peers, or for the device) may last.
    pub timeout: Duration,
    /// Force an algorithm; `None` asks `chooser`, then [`auto_algorithm`].
    pub algorithm: Option<Algorithm>,
    /// Picks the algorithm of calls that force none (its plan brings its
    /// own channels and chunk size).
    pub chooser: Option<SharedChooser>,
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
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            timeout: Duration::from_secs(60),
            algorithm: None,
            chooser: None,
            channels: 1,
            // NCCL's Simple protocol moves 512 KiB per step slot; larger
            // launches amortise the launch cost on one device.
            max_chunk_bytes: 2 << 20,
            slots_per_link: 4,
            p2p: true,
            schedule: None,
        }
    }
}

/// The fixed `auto` rule without a chooser: rings for the bandwidth-bound
/// collectives, as NCCL does on a single node; direct where only direct
/// applies; a star from the root for broadcast and reduce on up to eight
/// ranks, trees above.
pub fn auto_algorithm(kind: CollectiveKind, world_size: u32) -> (Algorithm, &'static str) {
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
