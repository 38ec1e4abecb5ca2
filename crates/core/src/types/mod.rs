//! The vocabulary every layer shares: element types, reduction operators and
//! collectives, named and numbered the way NCCL and nccl-tests name them.

mod collective;
mod dtype;
mod op;
mod reduce;

pub use collective::{Collective, CollectiveKind, Contributors, Expected, InPlaceAlias};
pub use dtype::{DataType, Element};
pub use op::ReduceOp;
pub use reduce::Reduce;

/// A rank's index in its group, `0..world_size`.
pub type Rank = u32;
