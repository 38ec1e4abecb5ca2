//! [`GradientSync`]: data-parallel gradient averaging that overlaps the
//! backward pass, the way PyTorch DDP's reducer does.
//!
//! Parameters are given once, in forward order. They are packed into
//! buckets in *reverse* order, because backward produces the last layer's
//! gradients first: the first bucket fills first and its all-reduce starts
//! while earlier layers are still computing. [`mark_ready`](GradientSync::mark_ready)
//! copies one parameter's gradient into its bucket and starts the bucket's
//! all-reduce ([`ReduceOp::Avg`]) on the progress thread the moment its
//! last parameter arrives; [`finish`](GradientSync::finish) waits for them
//! all. Buckets are started in the same order on every rank, whatever
//! order the gradients arrive in within a bucket, so ranks always agree.
//! Buckets live in memory the communicator lends where it lends any
//! ([`Communicator::lender`]: the process executor's shared heap, which
//! peers read in place), else in vectors.
//!
//! [`Bucketer`] is the blocking form for a loop that has all its
//! gradients at once: it fuses a list of tensors into buckets and reduces
//! them one after another. Both pack by one rule, [`pack`].

use thiserror::Error;

use crate::comm::{AsyncCommunicator, CommError, Communicator, CommunicatorExt, Work};
use crate::kernels::Reduce;
use crate::plan::stable_hash;
use crate::types::ReduceOp;

mod bucketer;
mod memory;

pub use bucketer::{Bucketer, DEFAULT_BUCKET_BYTES};
use memory::BucketMemory;

/// How tensors of `lens` elements, in the order given, share buckets of
/// about `bucket_bytes`: each bucket a run of consecutive tensors, a new
/// one started when the next tensor would overflow a bucket that holds
/// something (so a tensor larger than a bucket has one of its own). The
/// one packing rule of [`GradientSync`] (which packs in reverse) and
/// [`Bucketer`].
pub fn pack<T>(lens: &[usize], bucket_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let cap = (bucket_bytes / std::mem::size_of::<T>().max(1)).max(1);
    let mut out = Vec::new();
    let (mut start, mut filled) = (0, 0usize);
    for (i, &len) in lens.iter().enumerate() {
        if filled > 0 && filled.saturating_add(len) > cap {
            out.push(start..i);
            (start, filled) = (i, 0);
        }
        filled = filled.saturating_add(len);
    }
    if start < lens.len() {
        out.push(start..lens.len());
    }
    out
}

/// Why a step of gradient sync failed.
#[derive(Debug, Clone, Error)]
pub enum SyncError {
    /// The collective failed (see [`CommError`]).
    #[error(transparent)]
    Comm(#[from] CommError),
    /// No parameter has this index.
    #[error("parameter {param} does not exist ({params} parameters)")]
    UnknownParam {
        /// The index given.
        param: usize,
        /// How many there are.
        params: usize,
    },
    /// A gradient's length is not its parameter's.
    #[error("gradient of parameter {param} has {got} elements; the parameter has {expected}")]
    Length {
        /// The parameter.
        param: usize,
        /// The gradient's length.
        got: usize,
        /// The parameter's.
        expected: usize,
    },
    /// A gradient was marked ready twice in one step.
    #[error("parameter {param} was already marked ready in this step")]
    AlreadyReady {
        /// The parameter.
        param: usize,
    },
    /// `finish` came before these parameters were marked ready; their
    /// buckets still ran (so every rank made the same calls), and this
    /// step's averages are not valid.
    #[error("finish() before parameters {missing:?} were marked ready")]
    NotReady {
        /// The parameters never marked.
        missing: Vec<usize>,
    },
    /// Another rank called `finish` before marking all its gradients: this
    /// step's averages are not valid on any rank.
    #[error(
        "another rank finished the step with {most_missing} gradients not marked ready; this step's averages are not valid"
    )]
    PeerNotReady {
        /// The most gradients any rank left unmarked.
        most_missing: u64,
    },
}

/// [`GradientSync::new`] refused: why, and the communicator back. The
/// refusal is agreed (a layout that differs fails on every rank alike), so
/// the communicator stays usable, for another layout or other calls.
pub struct Refused<C: Communicator + Send + 'static> {
    /// Why.
    pub error: SyncError,
    /// The communicator that was passed in.
    pub comm: AsyncCommunicator<C>,
}

impl<C: Communicator + Send + 'static> std::fmt::Debug for Refused<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refused")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<C: Communicator + Send + 'static> std::fmt::Display for Refused<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<C: Communicator + Send + 'static> std::error::Error for Refused<C> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

/// Where the communicator is not wanted back: `?` in a function that
/// returns [`SyncError`].
impl<C: Communicator + Send + 'static> From<Box<Refused<C>>> for SyncError {
    fn from(refused: Box<Refused<C>>) -> SyncError {
        refused.error
    }
}

/// Compare the bucket layout across ranks: a rank that buckets its
/// parameters differently would average unrelated gradients.
fn agree_layout<C: Communicator + Send + 'static>(
    comm: &mut AsyncCommunicator<C>,
    param_lens: &[usize],
    bucket_bytes: usize,
) -> Result<(), CommError> {
    let mut layout = param_lens.to_vec();
    layout.push(bucket_bytes);
    let mine = [stable_hash(&layout), param_lens.len() as u64];
    let mut all = vec![0u64; 2 * comm.world_size() as usize];
    comm.all_gather(&mine, &mut all)?;
    let describe = |w: &[u64]| {
        format!(
            "gradient sync of {} parameters (layout {:#018x})",
            w[1], w[0]
        )
    };
    match all.chunks_exact(2).position(|w| w != mine) {
        None => Ok(()),
        Some(other) => Err(CommError::Disagreement {
            rank: comm.rank(),
            other: other as u32,
            mine: describe(&mine),
            theirs: describe(&all[2 * other..2 * other + 2]),
        }),
    }
}

/// One bucket: its parameters, its flat buffer (owned by the running
/// all-reduce while one is in flight) and how many gradients it still needs.
struct Bucket<T: Reduce> {
    params: Vec<usize>,
    /// Elements of all its parameters.
    len: usize,
    buffer: Option<BucketMemory<T>>,
    work: Option<Work<BucketMemory<T>>>,
    waiting: usize,
}

/// Averages gradients across a data-parallel group, bucket by bucket,
/// while backward runs. See the module docs.
pub struct GradientSync<T: Reduce, C: Communicator + Send + 'static> {
    comm: AsyncCommunicator<C>,
    /// Per parameter: its bucket, offset in it and length.
    place: Vec<(usize, usize, usize)>,
    buckets: Vec<Bucket<T>>,
    ready: Vec<bool>,
    /// Per parameter: whether its gradient was zeroed in this step.
    zeroed: Vec<bool>,
    /// The next bucket to start: buckets start in order on every rank.
    next: usize,
}

impl<T: Reduce + Default, C: Communicator + Send + 'static> GradientSync<T, C> {
    /// Sync parameters of these lengths (forward order) in buckets of
    /// about `bucket_bytes` (a parameter larger than that gets a bucket of
    /// its own), over `comm`. Every rank must pass the same lengths and
    /// bucket size: they are compared across ranks here (one all-gather),
    /// and a difference is [`CommError::Disagreement`] on every rank,
    /// returned with the communicator in [`Refused`] (boxed: a
    /// communicator is large and the refusal rare).
    pub fn new(
        mut comm: AsyncCommunicator<C>,
        param_lens: &[usize],
        bucket_bytes: usize,
    ) -> Result<Self, Box<Refused<C>>> {
        if let Err(e) = agree_layout(&mut comm, param_lens, bucket_bytes) {
            return Err(Box::new(Refused {
                error: e.into(),
                comm,
            }));
        }
        // Backward produces the last parameters first: pack in reverse.
        let reversed: Vec<usize> = param_lens.iter().rev().copied().collect();
        let mut place = vec![(0, 0, 0); param_lens.len()];
        let mut buckets: Vec<Bucket<T>> = Vec::new();
        for (b, range) in pack::<T>(&reversed, bucket_bytes).into_iter().enumerate() {
            let mut bucket = Bucket {
                params: Vec::new(),
                len: 0,
                buffer: None,
                work: None,
                waiting: 0,
            };
            let mut fill = 0;
            for i in range {
                let param = param_lens.len() - 1 - i;
                place[param] = (b, fill, reversed[i]);
                bucket.params.push(param);
                bucket.waiting += 1;
                fill += reversed[i];
            }
            buckets.push(bucket);
        }
        // Over shared-memory processes the buckets go in the heap their
        // peers read in place; what does not fit there stays private.
        let lender = comm.lender();
        for b in &mut buckets {
            b.len = b.params.iter().map(|&p| place[p].2).sum();
            b.buffer = Some(BucketMemory::new(lender.as_ref(), b.len));
        }
        Ok(GradientSync {
            comm,
            place,
            ready: vec![false; param_lens.len()],
            zeroed: vec![false; param_lens.len()],
            buckets,
            next: 0,
        })
    }

    /// The buckets, each as the parameters it holds (in the order their
    /// gradients are expected).
    pub fn buckets(&self) -> Vec<Vec<usize>> {
        self.buckets.iter().map(|b| b.params.clone()).collect()
    }

    /// How many buckets live in memory the communicator lent, which its
    /// peers read in place ([`Communicator::lender`]): over shared-memory
    /// processes, every bucket the heap has room for; elsewhere none. A
    /// bucket in flight is not counted, nor one whose buffer a failed call
    /// kept.
    pub fn lent_buckets(&self) -> usize {
        self.buckets
            .iter()
            .filter(|b| b.buffer.as_ref().is_some_and(BucketMemory::is_lent))
            .count()
    }

    /// Parameter `param`'s gradient is final: copy it into its bucket and
    /// start every bucket that is now complete, in bucket order.
    pub fn mark_ready(&mut self, param: usize, grad: &[T]) -> Result<(), SyncError> {
        let view = self.slot(param)?;
        if grad.len() != view.len() {
            return Err(SyncError::Length {
                param,
                got: grad.len(),
                expected: view.len(),
            });
        }
        view.copy_from_slice(grad);
        self.mark_ready_in_place(param)
    }

    /// Where parameter `param`'s gradient lives in its bucket: backward can
    /// write it there directly (PyTorch's `gradient_as_bucket_view`) and
    /// then call [`mark_ready_in_place`](Self::mark_ready_in_place), saving
    /// the copy. Refused once the parameter is marked ready in this step.
    ///
    /// The first access in each step zeroes it, so a backward that
    /// accumulates (`+=`, several micro-batches) starts from zero, as after
    /// PyTorch's `zero_grad`. Until then [`gradient`](Self::gradient) still
    /// reads the last step's average. After
    /// [`gradient_to_overwrite`](Self::gradient_to_overwrite) in the same
    /// step it does not zero: it adds to what was assigned.
    pub fn gradient_mut(&mut self, param: usize) -> Result<&mut [T], SyncError> {
        let first = self
            .zeroed
            .get(param)
            .is_some_and(|&zeroed| !zeroed && !self.ready[param]);
        if let Some(zeroed) = self.zeroed.get_mut(param) {
            *zeroed = true;
        }
        let view = self.slot(param)?;
        if first {
            view.fill(T::default());
        }
        Ok(view)
    }

    /// Where parameter `param`'s gradient lives in its bucket, for a
    /// backward that overwrites every element of it (PyTorch's
    /// `zero_grad(set_to_none=True)`, then a backward that assigns): not
    /// zeroed, so it still holds the last step's average until written,
    /// and a backward that accumulates (`+=`) must use
    /// [`gradient_mut`](Self::gradient_mut) instead. Saves writing every
    /// gradient twice per step. Refused once the parameter is marked ready
    /// in this step.
    pub fn gradient_to_overwrite(&mut self, param: usize) -> Result<&mut [T], SyncError> {
        // The refusals first (an unknown or ready parameter); then a later
        // `gradient_mut` in this step must not zero what was written.
        self.slot(param)?;
        self.zeroed[param] = true;
        self.slot(param)
    }

    /// Parameter `param`'s place in its bucket, as it is.
    fn slot(&mut self, param: usize) -> Result<&mut [T], SyncError> {
        let params = self.place.len();
        let &(bucket, offset, len) = self
            .place
            .get(param)
            .ok_or(SyncError::UnknownParam { param, params })?;
        if self.ready[param] {
            return Err(SyncError::AlreadyReady { param });
        }
        let b = &mut self.buckets[bucket];
        // A bucket lacks its buffer only after a call that lost it failed.
        let buffer = b
            .buffer
            .get_or_insert_with(|| BucketMemory::new(None, b.len));
        Ok(&mut buffer.as_mut()[offset..offset + len])
    }

    /// Parameter `param`'s gradient, written through
    /// [`gradient_mut`](Self::gradient_mut), is final: start every bucket
    /// that is now complete, in bucket order.
    pub fn mark_ready_in_place(&mut self, param: usize) -> Result<(), SyncError> {
        let params = self.place.len();
        let &(bucket, _, _) = self
            .place
            .get(param)
            .ok_or(SyncError::UnknownParam { param, params })?;
        if std::mem::replace(&mut self.ready[param], true) {
            return Err(SyncError::AlreadyReady { param });
        }
        self.buckets[bucket].waiting -= 1;
        self.start_ready_buckets();
        Ok(())
    }

    fn start_ready_buckets(&mut self) {
        while let Some(b) = self.buckets.get_mut(self.next)
            && b.waiting == 0
        {
            let buffer = b
                .buffer
                .take()
                .unwrap_or_else(|| BucketMemory::new(None, b.len));
            let _bucket = tracing::info_span!(
                "bucket",
                rank = self.comm.rank(),
                index = self.next,
                bytes = (b.len * std::mem::size_of::<T>()) as u64,
            )
            .entered();
            b.work = Some(self.comm.iall_reduce(buffer, ReduceOp::Avg));
            self.next += 1;
        }
    }

    /// Wait for every bucket's all-reduce; afterwards
    /// [`gradient`](Self::gradient) reads the averages. The next step
    /// starts with no gradient ready.
    ///
    /// A bucket whose gradients were not all marked still runs (with
    /// whatever its buffer holds), so every rank makes the same calls in
    /// every step even when one rank forgot a parameter; the step then
    /// fails with [`SyncError::NotReady`] on that rank.
    pub fn finish(&mut self) -> Result<(), SyncError> {
        for b in &mut self.buckets[self.next..] {
            b.waiting = 0;
        }
        self.start_ready_buckets();
        // Queued behind the buckets: how many gradients the rank that
        // missed the most did not mark, so every rank learns of it.
        let missing: Vec<usize> = (0..self.ready.len()).filter(|&p| !self.ready[p]).collect();
        let verdict = self
            .comm
            .iall_reduce(vec![missing.len() as u64], ReduceOp::Max);
        let mut first_error = None;
        for b in &mut self.buckets {
            if let Some(work) = b.work.take() {
                match work.wait() {
                    Ok(buffer) => b.buffer = Some(buffer),
                    Err(failed) => {
                        b.buffer = failed.buffers;
                        first_error.get_or_insert(SyncError::Comm(failed.error));
                    }
                }
            }
            b.waiting = b.params.len();
        }
        self.ready.iter_mut().for_each(|r| *r = false);
        self.zeroed.iter_mut().for_each(|z| *z = false);
        self.next = 0;
        let most_missing = match verdict.wait() {
            Ok(v) => v[0],
            Err(failed) => return Err(first_error.unwrap_or(SyncError::Comm(failed.error))),
        };
        if let Some(e) = first_error {
            return Err(e);
        }
        if !missing.is_empty() {
            return Err(SyncError::NotReady { missing });
        }
        if most_missing > 0 {
            return Err(SyncError::PeerNotReady { most_missing });
        }
        Ok(())
    }

    /// Parameter `param`'s averaged gradient, after [`finish`](Self::finish)
    /// (`None` for an unknown parameter or a bucket whose buffer a failed
    /// call kept).
    pub fn gradient(&self, param: usize) -> Option<&[T]> {
        let &(bucket, offset, len) = self.place.get(param)?;
        let buffer = self.buckets[bucket].buffer.as_ref()?;
        Some(&buffer.as_ref()[offset..offset + len])
    }

    /// The communicator, for other calls (they queue behind the buckets).
    pub fn communicator(&mut self) -> &mut AsyncCommunicator<C> {
        &mut self.comm
    }
}

#[cfg(test)]
mod tests {
    use super::pack;

    #[test]
    fn one_rule_packs_runs_and_gives_oversized_tensors_their_own_bucket() {
        // 100 f32 per bucket.
        assert_eq!(
            pack::<f32>(&[1, 64, 17, 0, 300, 5], 400),
            [0..4, 4..5, 5..6]
        );
        assert_eq!(pack::<f32>(&[0, 0, 100, 1], 400), [0..3, 3..4]);
        assert_eq!(pack::<f32>(&[], 400), []);
        // A bucket smaller than one element still holds one.
        assert_eq!(pack::<f64>(&[1, 1], 3), [0..1, 1..2]);
    }
}
