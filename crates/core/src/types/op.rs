use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::ParseNameError;

/// A reduction operator (NCCL's `ncclRedOp_t`).
///
/// `Avg` sums the contributions and divides once, at the end, by the world
/// size. The partial sums have the element type's range: an `f16` average
/// overflows to infinity when a partial sum exceeds 65504 even if the mean
/// would fit (NCCL pre-scales floats instead; use `bf16` or `f32`, or scale
/// the inputs, when that matters). On integer types that division truncates toward zero (as Rust's `/`
/// does), after a sum that wraps on overflow, so an integer average of large
/// values can differ from the mathematical mean; use a float type when that
/// matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    /// Sum (wrapping on integer overflow).
    Sum,
    /// Product (wrapping on integer overflow).
    Prod,
    /// Minimum. On floating types a NaN anywhere gives NaN, whatever the
    /// order of the operands (as PyTorch's `minimum`; IEEE `minNum` and
    /// Rust's `f32::min` would drop it), the same on every executor.
    Min,
    /// Maximum; NaN propagates as for [`ReduceOp::Min`].
    Max,
    /// Average: a sum, divided once by the world size.
    Avg,
}

impl ReduceOp {
    /// Every operator, in NCCL's enum order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// The name nccl-tests prints in its `redop` column.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = ParseNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        ReduceOp::ALL
            .into_iter()
            .find(|op| op.name() == lower)
            .ok_or_else(|| ParseNameError::new("reduce op", s, ReduceOp::ALL.map(ReduceOp::name)))
    }
}
