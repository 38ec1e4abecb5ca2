//! A call, described completely: what to do and on which buffers, with the
//! element type carried by the buffers — the one value every backend's
//! entry point takes, so the trait over it stays object-safe.

use std::marker::PhantomData;

use super::error::{CommError, check_peer, check_root};
use crate::types::{
    CallShape, Collective, DataType, Element, Purpose, Rank, ReduceOp, block_count,
};

/// All-gather `mine` from every rank into `all`, as the library's own
/// exchange for `purpose` (a split's colors, a v-call's descriptions): a
/// peer's plain all-gather of the same shape is a mismatch, never data.
pub(crate) fn exchange<C: super::Communicator + ?Sized>(
    comm: &mut C,
    purpose: Purpose,
    mine: &[u64],
    all: &mut [u64],
) -> Result<(), CommError> {
    comm.execute(
        Call::collective(
            Collective::AllGather,
            ReduceOp::Sum,
            Some(mine.into()),
            all.into(),
        )
        .for_purpose(purpose),
    )
}

/// A borrowed host slice of any element type: `&'a [T]` with `T` erased.
#[derive(Clone, Copy)]
pub struct HostSlice<'a> {
    ptr: *const u8,
    len: usize,
    dtype: DataType,
    _borrow: PhantomData<&'a [u8]>,
}

/// A mutably borrowed host slice of any element type: `&'a mut [T]` with
/// `T` erased.
pub struct HostSliceMut<'a> {
    ptr: *mut u8,
    len: usize,
    dtype: DataType,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: both stand for `&[T]` / `&mut [T]` of an `Element`, which is
// `Send + Sync`; the raw pointer is only how the type is erased.
unsafe impl Send for HostSlice<'_> {}
// SAFETY: as above.
unsafe impl Sync for HostSlice<'_> {}
// SAFETY: as above; a `&mut [T]` of a `Send` type is `Send`.
unsafe impl Send for HostSliceMut<'_> {}
// SAFETY: as above; shared access to it only reads.
unsafe impl Sync for HostSliceMut<'_> {}

impl std::fmt::Debug for HostSlice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostSlice({} x {})", self.len, self.dtype)
    }
}

impl std::fmt::Debug for HostSliceMut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostSliceMut({} x {})", self.len, self.dtype)
    }
}

impl<'a, T: Element> From<&'a [T]> for HostSlice<'a> {
    fn from(s: &'a [T]) -> Self {
        HostSlice {
            ptr: s.as_ptr().cast(),
            len: s.len(),
            dtype: T::DATA_TYPE,
            _borrow: PhantomData,
        }
    }
}

impl<'a, T: Element> From<&'a mut [T]> for HostSliceMut<'a> {
    fn from(s: &'a mut [T]) -> Self {
        HostSliceMut {
            ptr: s.as_mut_ptr().cast(),
            len: s.len(),
            dtype: T::DATA_TYPE,
            _borrow: PhantomData,
        }
    }
}

impl<'a> HostSlice<'a> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The elements as bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        // SAFETY: the slice came from `&'a [T]` of a sealed `Element`: plain
        // data without padding, `len × size` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len * self.dtype.size_bytes()) }
    }

    /// The slice again, if its elements are `T`.
    pub fn typed<T: Element>(&self) -> Option<&'a [T]> {
        // SAFETY: same type as it was made from, same borrow.
        (T::DATA_TYPE == self.dtype)
            .then(|| unsafe { std::slice::from_raw_parts(self.ptr.cast::<T>(), self.len) })
    }
}

impl HostSliceMut<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The first byte.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// A shorter-lived copy of the borrow.
    pub fn reborrow(&mut self) -> HostSliceMut<'_> {
        HostSliceMut {
            ptr: self.ptr,
            len: self.len,
            dtype: self.dtype,
            _borrow: PhantomData,
        }
    }

    /// The elements as bytes.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: made from `&mut [T]` of a sealed `Element`: every byte
        // pattern written is a valid element.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len * self.dtype.size_bytes()) }
    }

    /// The slice again, if its elements are `T`.
    pub fn typed_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        // SAFETY: same type as it was made from; the borrow of `self` keeps it unique.
        (T::DATA_TYPE == self.dtype)
            .then(|| unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<T>(), self.len) })
    }
}

/// What a call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation {
    /// A collective; `op` is ignored by those that do not reduce.
    Collective {
        /// Which, with its root.
        collective: Collective,
        /// The reduction.
        op: ReduceOp,
    },
    /// Send the input to `peer`.
    Send {
        /// The receiver.
        peer: Rank,
    },
    /// Receive exactly the output's length from `peer`.
    Recv {
        /// The sender.
        peer: Rank,
    },
    /// Wait until every rank has arrived.
    Barrier,
}

/// One call: the operation and its buffers. Out of place, a collective has
/// an input and an output; in place only the output, prepared as the
/// collective's in-place form defines (see
/// [`Collective::in_place_alias`]). A send has only an input, a receive
/// only an output, a barrier neither.
#[derive(Debug)]
pub struct Call<'a> {
    operation: Operation,
    input: Option<HostSlice<'a>>,
    output: Option<HostSliceMut<'a>>,
    purpose: Purpose,
}

impl<'a> Call<'a> {
    /// A collective; `input: None` runs it in place on `output`.
    pub fn collective(
        collective: Collective,
        op: ReduceOp,
        input: Option<HostSlice<'a>>,
        output: HostSliceMut<'a>,
    ) -> Self {
        Call {
            operation: Operation::Collective { collective, op },
            input,
            output: Some(output),
            purpose: Purpose::User,
        }
    }

    /// The same call, made for `purpose`: a library's own exchange, which
    /// must not match a program's call of the same shape on another rank.
    pub fn for_purpose(mut self, purpose: Purpose) -> Self {
        self.purpose = purpose;
        self
    }

    /// Send `data` to `peer`.
    pub fn send(data: HostSlice<'a>, peer: Rank) -> Self {
        Call {
            operation: Operation::Send { peer },
            input: Some(data),
            output: None,
            purpose: Purpose::User,
        }
    }

    /// Receive into `buffer` from `peer`.
    pub fn recv(buffer: HostSliceMut<'a>, peer: Rank) -> Self {
        Call {
            operation: Operation::Recv { peer },
            input: None,
            output: Some(buffer),
            purpose: Purpose::User,
        }
    }

    /// A barrier.
    pub fn barrier() -> Call<'static> {
        Call {
            operation: Operation::Barrier,
            input: None,
            output: None,
            purpose: Purpose::User,
        }
    }

    /// What to do.
    pub fn operation(&self) -> Operation {
        self.operation
    }

    /// Check the call's arguments on rank `rank` of a group of
    /// `world_size` and take it apart for the backend — the checks every
    /// backend shares, done once: a collective's root in range, an in-place
    /// form where one is asked for, one element type, buffer lengths of the
    /// collective's shape; a send's or receive's peer in the group and not
    /// this rank. An error here leaves the group usable.
    pub fn check(self, rank: Rank, world_size: u32) -> Result<Checked<'a>, CommError> {
        match (self.operation, self.input, self.output) {
            (Operation::Collective { collective, op }, input, Some(output)) => {
                let mut shape = shape(collective, op, input.as_ref(), &output, world_size)?;
                shape.purpose = self.purpose;
                Ok(Checked::Collective {
                    shape,
                    input,
                    output,
                })
            }
            (Operation::Send { peer }, Some(data), None) => {
                check_peer(peer, rank, world_size)?;
                Ok(Checked::Send { data, peer })
            }
            (Operation::Recv { peer }, None, Some(buffer)) => {
                check_peer(peer, rank, world_size)?;
                Ok(Checked::Recv { buffer, peer })
            }
            (Operation::Barrier, None, None) => Ok(Checked::Barrier),
            _ => unreachable!("the constructors pair every operation with its buffers"),
        }
    }
}

/// A call checked for one rank, taken apart for the backend.
#[derive(Debug)]
pub enum Checked<'a> {
    /// A collective, described for planning; `input` is `None` in place.
    Collective {
        /// What every rank must agree on.
        shape: CallShape,
        /// The input (out of place).
        input: Option<HostSlice<'a>>,
        /// The output (in place, the one buffer).
        output: HostSliceMut<'a>,
    },
    /// Send `data` to `peer`.
    Send {
        /// The data.
        data: HostSlice<'a>,
        /// The receiver.
        peer: Rank,
    },
    /// Receive into `buffer` from `peer`.
    Recv {
        /// The buffer.
        buffer: HostSliceMut<'a>,
        /// The sender.
        peer: Rank,
    },
    /// Wait for every rank.
    Barrier,
}

/// A collective's arguments checked and described for planning.
fn shape(
    collective: Collective,
    op: ReduceOp,
    input: Option<&HostSlice<'_>>,
    output: &HostSliceMut<'_>,
    world_size: u32,
) -> Result<CallShape, CommError> {
    check_root(collective, world_size)?;
    if input.is_none() && collective.in_place_alias(0).is_none() {
        return Err(CommError::InPlaceUnsupported {
            collective: collective.kind().to_string(),
        });
    }
    if let Some(input) = input
        && input.dtype() != output.dtype()
    {
        return Err(CommError::DtypeMismatch {
            input: input.dtype(),
            output: output.dtype(),
        });
    }
    let count = block_count(collective, world_size, input.map(|i| i.len()), output.len())?;
    Ok(CallShape {
        collective,
        count,
        dtype: output.dtype(),
        op,
        in_place: input.is_none(),
        purpose: Purpose::User,
    })
}
