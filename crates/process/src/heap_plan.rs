//! Plans for calls whose buffers lie in every rank's shared heap.
//!
//! Over shared memory a chunk is cut to fit a slot, since a value copied
//! through a slot must fit it. When every value a plan sends can be read
//! where it lies (in the input or the output, never a slot or scratch) and
//! those buffers lie in the shared heap, every message is a reference of a
//! few bytes, and the chunk can be as large as the thread executor's: the
//! same copies with fewer hand-offs between ranks (measured on 2 cores,
//! 64 MiB all-reduce on 2 ranks: 0.87–0.91 of the memory ceiling with
//! 2 MiB chunks against 0.77–0.79 with the 512 KiB slots).
//!
//! Whether a rank's buffers lie in its heap is known to that rank alone,
//! so it offers the heap's plan in its announcement and the call runs on
//! it only if every rank offered it ([`crate::agree`]). Everything else
//! that decides the offer — the plan, the slot size — is the same on every
//! rank.

use ferrocoll_core::comm::{Planned, Planner};
use ferrocoll_core::types::CallShape;

use crate::config::ProcessConfig;
use crate::transport::Transport;
use ferrocoll_core::link::reference_bytes;

/// Plans calls with the heap's chunk.
pub(crate) struct HeapPlanner {
    planner: Planner,
}

impl HeapPlanner {
    /// `None` where no call can run on the heap's plan: no shared heap.
    pub fn new(world_size: u32, config: &ProcessConfig) -> Option<Self> {
        (config.shared_heap_bytes > 0).then(|| HeapPlanner {
            planner: Planner::new(world_size, config.heap_planner_settings()),
        })
    }

    pub fn set_algorithm(&mut self, algorithm: Option<ferrocoll_core::Algorithm>) {
        self.planner.set_algorithm(algorithm);
    }

    /// The heap's plan for this call, if this rank can offer it: the slot
    /// size cut `baseline` into more than one segment, the heap's plan
    /// differs from it, sends only references that fit a slot, and
    /// `buffers` ((address, bytes) of the input and output) lie in this
    /// rank's heap.
    pub fn offer(
        &mut self,
        t: &dyn Transport,
        shape: &CallShape,
        baseline: &Planned,
        buffers: &[(usize, usize)],
    ) -> Option<Planned> {
        let heaps = t.heaps()?;
        // The heap's plan sends every value by reference: every peer
        // must map this rank's heap.
        let everywhere = (0..heaps.ranks()).all(|p| t.heap_peer(p));
        if !everywhere || baseline.plan.segments <= 1 || heaps.offsets(buffers).is_none() {
            return None;
        }
        // The same settings and call on every rank: if this fails here it
        // fails everywhere, and every rank runs the baseline.
        let heap = self.planner.plan(shape).ok()?;
        let slot = t.max_message().unwrap_or(0);
        let lent = heap.plan.lent_pieces()?;
        (reference_bytes(lent) <= slot && heap.plan.hash != baseline.plan.hash).then_some(heap)
    }
}
