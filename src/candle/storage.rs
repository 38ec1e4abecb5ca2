//! A tensor's CPU storage as a typed slice: the one place that matches
//! candle's dtypes to ferrocoll's element types and that handles strided
//! layouts (gathered into a temporary, scattered back).

use std::borrow::Cow;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, Layout, WithDType};

use super::CandleError;
use crate::Reduce;
use crate::comm::CommError;

/// What runs on a tensor's elements, in place.
pub(crate) trait OnSliceMut {
    /// The result.
    type Out;
    /// Run on the elements, in the tensor's logical order.
    fn run<T: Reduce + WithDType>(self, elements: &mut [T]) -> Result<Self::Out, CommError>;
}

/// What reads a tensor's elements.
pub(crate) trait OnSlice {
    /// The result.
    type Out;
    /// Run on the elements, in the tensor's logical order.
    fn run<T: Reduce + WithDType>(self, elements: &[T]) -> Result<Self::Out, CandleError>;
}

/// `f` on the elements `layout` selects of `storage`, in place.
pub(crate) fn on_elements_mut<F: OnSliceMut>(
    storage: &mut CpuStorage,
    layout: &Layout,
    f: F,
) -> Result<F::Out, CandleError> {
    match storage {
        CpuStorage::F32(v) => in_place(v, layout, f),
        CpuStorage::F64(v) => in_place(v, layout, f),
        CpuStorage::F16(v) => in_place(v, layout, f),
        CpuStorage::BF16(v) => in_place(v, layout, f),
        CpuStorage::U8(v) => in_place(v, layout, f),
        CpuStorage::U32(v) => in_place(v, layout, f),
        CpuStorage::I32(v) => in_place(v, layout, f),
        CpuStorage::I64(v) => in_place(v, layout, f),
        other => Err(unsupported_dtype(other.dtype())),
    }
}

/// `f` on the elements `layout` selects of `storage`.
pub(crate) fn on_elements<F: OnSlice>(
    storage: &CpuStorage,
    layout: &Layout,
    f: F,
) -> Result<F::Out, CandleError> {
    match storage {
        CpuStorage::F32(v) => f.run(&read(v, layout)),
        CpuStorage::F64(v) => f.run(&read(v, layout)),
        CpuStorage::F16(v) => f.run(&read(v, layout)),
        CpuStorage::BF16(v) => f.run(&read(v, layout)),
        CpuStorage::U8(v) => f.run(&read(v, layout)),
        CpuStorage::U32(v) => f.run(&read(v, layout)),
        CpuStorage::I32(v) => f.run(&read(v, layout)),
        CpuStorage::I64(v) => f.run(&read(v, layout)),
        other => Err(unsupported_dtype(other.dtype())),
    }
}

pub(crate) fn unsupported_dtype(dtype: candle_core::DType) -> CandleError {
    CandleError::Unsupported(format!(
        "ferrocoll has no element type for candle's {dtype:?} (f32, f64, f16, bf16, u8, u32, i32 and i64 are supported)"
    ))
}

fn in_place<T: Reduce + WithDType, F: OnSliceMut>(
    v: &mut [T],
    layout: &Layout,
    f: F,
) -> Result<F::Out, CandleError> {
    if let Some((start, end)) = layout.contiguous_offsets() {
        return Ok(f.run(&mut v[start..end])?);
    }
    let at = offsets(layout);
    let mut gathered: Vec<T> = at.iter().map(|&i| v[i]).collect();
    let out = f.run(&mut gathered)?;
    for (&i, x) in at.iter().zip(gathered) {
        v[i] = x;
    }
    Ok(out)
}

fn read<'a, T: Copy>(v: &'a [T], layout: &Layout) -> Cow<'a, [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Cow::Borrowed(&v[start..end]),
        None => Cow::Owned(offsets(layout).into_iter().map(|i| v[i]).collect()),
    }
}

/// The storage offset of every element of `layout`, in logical
/// (row-major) order.
fn offsets(layout: &Layout) -> Vec<usize> {
    let (dims, strides) = (layout.dims(), layout.stride());
    let n: usize = dims.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut index = vec![0usize; dims.len()];
    for _ in 0..n {
        let at: usize = index.iter().zip(strides).map(|(i, s)| i * s).sum();
        out.push(layout.start_offset() + at);
        for d in (0..dims.len()).rev() {
            index[d] += 1;
            if index[d] < dims[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn strided_offsets_follow_the_logical_order() {
        let t = Tensor::arange(0f32, 6.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 3))
            .unwrap()
            .t()
            .unwrap();
        let (_, layout) = t.storage_and_layout();
        assert_eq!(offsets(layout), vec![0, 3, 1, 4, 2, 5]);
        let narrow = Tensor::arange(0f32, 12.0, &Device::Cpu)
            .unwrap()
            .reshape((3, 4))
            .unwrap()
            .narrow(1, 1, 2)
            .unwrap();
        let (_, layout) = narrow.storage_and_layout();
        assert_eq!(offsets(layout), vec![1, 2, 5, 6, 9, 10]);
    }
}
