//! The vocabulary every layer shares: element types, reduction operators and
//! collectives, named and numbered the way NCCL and nccl-tests name them, and
//! the call's own words (its shape, buffers, links and count rule).

mod call;
mod collective;
mod dtype;
mod op;

pub use call::{Buffer, CallShape, Link, Purpose, ShapeError, block_count};
pub use collective::{Collective, CollectiveKind, Contributors, Expected, InPlaceAlias};
pub use dtype::{DataType, Element};
pub use op::ReduceOp;

/// A rank's index in its group, `0..world_size`.
pub type Rank = u32;
