use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::ParseNameError;

/// An element type a collective can move and reduce (NCCL's `ncclDataType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataType {
    /// IEEE 754 binary16 (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    Bf16,
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl DataType {
    /// Every supported type, in NCCL's enum order.
    pub const ALL: [DataType; 10] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
        }
    }

    /// True for the floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F64
        )
    }

    /// The name nccl-tests prints in its `type` column (`float`, `half`, ...).
    pub const fn nccl_tests_name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
        }
    }

    /// Our own short name, as accepted on the command line (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
            DataType::F16 => "f16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for DataType {
    type Err = ParseNameError;

    /// Accepts our short names and the nccl-tests names (`float`, `half`, ...).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        DataType::ALL
            .into_iter()
            .find(|t| t.name() == lower || t.nccl_tests_name() == lower)
            .ok_or_else(|| ParseNameError::new("data type", s, DataType::ALL.map(DataType::name)))
    }
}

/// Evaluate `$body` with `$t` naming the Rust type of the [`DataType`]
/// `$dtype`: the one place a run-time type becomes a generic parameter.
///
/// ```
/// use ferrocoll_core::{DataType, with_element_type};
/// let size = with_element_type!(DataType::Bf16, T => std::mem::size_of::<T>());
/// assert_eq!(size, 2);
/// ```
#[macro_export]
macro_rules! with_element_type {
    ($dtype:expr, $t:ident => $body:expr) => {{
        match $dtype {
            $crate::DataType::I8 => {
                type $t = i8;
                $body
            }
            $crate::DataType::U8 => {
                type $t = u8;
                $body
            }
            $crate::DataType::I32 => {
                type $t = i32;
                $body
            }
            $crate::DataType::U32 => {
                type $t = u32;
                $body
            }
            $crate::DataType::I64 => {
                type $t = i64;
                $body
            }
            $crate::DataType::U64 => {
                type $t = u64;
                $body
            }
            $crate::DataType::F16 => {
                type $t = $crate::half::f16;
                $body
            }
            $crate::DataType::Bf16 => {
                type $t = $crate::half::bf16;
                $body
            }
            $crate::DataType::F32 => {
                type $t = f32;
                $body
            }
            $crate::DataType::F64 => {
                type $t = f64;
                $body
            }
        }
    }};
}

/// A Rust type that can travel through a collective.
///
/// Implemented for the ten NCCL element types; `half::f16` and `half::bf16`
/// stand for the 16-bit floats. Sealed: backends view elements as plain
/// bytes (no padding, every bit pattern valid), which only these types
/// promise.
pub trait Element: sealed::Sealed + Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The matching [`DataType`].
    const DATA_TYPE: DataType;
}

mod sealed {
    /// Only the element types of this module.
    pub trait Sealed {}
}

macro_rules! impl_element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl sealed::Sealed for $t {}
        impl Element for $t {
            const DATA_TYPE: DataType = DataType::$d;
        })*
    };
}

impl_element! {
    half::f16 => F16,
    half::bf16 => Bf16,
    f32 => F32,
    f64 => F64,
    i8 => I8,
    u8 => U8,
    i32 => I32,
    u32 => U32,
    i64 => I64,
    u64 => U64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_match_rust_types() {
        for t in DataType::ALL {
            assert_eq!(t.name().parse::<DataType>().unwrap(), t);
            assert_eq!(t.nccl_tests_name().parse::<DataType>().unwrap(), t);
        }
        assert_eq!(DataType::F16.size_bytes(), std::mem::size_of::<half::f16>());
        assert_eq!(
            DataType::Bf16.size_bytes(),
            std::mem::size_of::<half::bf16>()
        );
        assert_eq!(DataType::U64.size_bytes(), std::mem::size_of::<u64>());
        assert_eq!(<i8 as Element>::DATA_TYPE, DataType::I8);
        assert!("f128".parse::<DataType>().is_err());
    }
}
