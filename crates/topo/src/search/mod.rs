//! Ring and tree orders searched on the link graph.
//!
//! A ring's speed is set by its busiest resource: every edge of the ring
//! carries the same bytes, and edges whose routes share a link (two GPUs
//! behind one PCIe switch uplink, say) split it. [`rings`] finds the order
//! whose worst resource is least loaded, and keeps adding rings while the
//! set as a whole gets faster, as NCCL adds channels on links with spare
//! capacity — or, where that greedy set stops short, a packing of rings
//! (the widest ring on what capacity is left, again and again, each ring
//! repeated in proportion to its rate). [`tree_order`] lays the trees over
//! the best ring order, so a
//! parent and its children are neighbours on the fastest paths. [`trees`]
//! packs weighted spanning trees, one set per member, for all-gather,
//! reduce-scatter and all-reduce where rings cannot use every link.
//! [`hierarchy`] groups the members of a multi-node topology by machine
//! for the hierarchical all-reduce.

mod arborescence;
mod costs;
mod hierarchy;
mod packing;
mod ring;
mod trees;

pub use costs::RingSet;
pub use hierarchy::hierarchy;
pub use ring::{EXHAUSTIVE_MAX_RANKS, HEURISTIC_BUDGET, MAX_RINGS, rings, tree_order};
pub use trees::{MAX_TREES_PER_ROOT, TreePacking, tree_packings, trees};
