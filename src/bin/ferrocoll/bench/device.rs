//! Device buffers for the GPU backends (`cuda`, `nccl`): host data as
//! bytes in device memory and back.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use ferrocoll::comm::CommError;
use ferrocoll::conformance::KitElement;

/// A host slice's bytes.
pub(crate) fn bytes_of<T>(data: &[T]) -> &[u8] {
    // SAFETY: every bench element type is plain data without padding, so
    // its bytes are initialised and any alignment of u8 holds.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

fn backend(e: cudarc::driver::DriverError) -> CommError {
    CommError::backend("cuda", e)
}

/// `bytes` in new device memory on `stream` (at least one byte).
pub(crate) fn upload(stream: &Arc<CudaStream>, bytes: &[u8]) -> Result<CudaSlice<u8>, CommError> {
    let mut slice = stream
        .alloc_zeros::<u8>(bytes.len().max(1))
        .map_err(backend)?;
    if !bytes.is_empty() {
        stream
            .memcpy_htod(bytes, &mut slice.slice_mut(..bytes.len()))
            .map_err(backend)?;
    }
    Ok(slice)
}

/// Device bytes back as values of `T`.
pub(crate) fn download<T>(
    stream: &Arc<CudaStream>,
    slice: &CudaSlice<u8>,
) -> Result<Vec<T>, CommError> {
    let bytes = stream.clone_dtoh(slice).map_err(backend)?;
    let n = bytes.len() / std::mem::size_of::<T>();
    // SAFETY: the bytes were uploaded from a `Vec<T>` of `n` elements and
    // written by kernels of the same type; read unaligned.
    Ok((0..n)
        .map(|i| unsafe { bytes.as_ptr().cast::<T>().add(i).read_unaligned() })
        .collect())
}

/// Wait for `stream`.
pub(crate) fn sync(stream: &Arc<CudaStream>) -> Result<(), CommError> {
    stream.synchronize().map_err(backend)
}

/// A call's buffers in device memory, as bytes.
pub(crate) struct Buffers {
    pub input: CudaSlice<u8>,
    pub output: CudaSlice<u8>,
}

/// `input` and `output` in new device memory on `stream`, waited for.
pub(crate) fn place<T: KitElement>(
    stream: &Arc<CudaStream>,
    input: &[T],
    output: &[T],
) -> Result<Buffers, CommError> {
    let b = Buffers {
        input: upload(stream, bytes_of(input))?,
        output: upload(stream, bytes_of(output))?,
    };
    sync(stream)?;
    Ok(b)
}
