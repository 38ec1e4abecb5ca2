//! Blocking gradient bucketing: fuse many small tensors into a few large
//! all-reduces, as PyTorch DDP does, so per-call latency is paid per bucket
//! rather than per tensor (the overlapped form is [`super::GradientSync`]).
//!
//! Tensors are packed in order into buckets of at most `bucket_bytes`; a
//! tensor larger than a bucket is reduced on its own, in place, without a
//! copy. Every rank must pass the same tensor lengths in the same order.

use crate::comm::{CommError, Communicator, CommunicatorExt};
use crate::kernels::Reduce;
use crate::types::ReduceOp;

/// DDP's default bucket size.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Reduces lists of tensors through fused buckets; keeps its staging buffer
/// between calls.
#[derive(Debug, Clone)]
pub struct Bucketer<T> {
    bucket_bytes: usize,
    staging: Vec<T>,
}

impl<T: Reduce> Bucketer<T> {
    /// Buckets of at most `bucket_bytes` (at least one element).
    pub fn new(bucket_bytes: usize) -> Self {
        Bucketer {
            bucket_bytes,
            staging: Vec::new(),
        }
    }

    /// Index ranges of `lens` that share a bucket ([`super::pack`]).
    pub fn plan(&self, lens: &[usize]) -> Vec<std::ops::Range<usize>> {
        super::pack::<T>(lens, self.bucket_bytes)
    }

    /// Reduce every tensor in `tensors` across the group with `op`, in
    /// place; returns how many collectives it issued.
    pub fn all_reduce<C: Communicator>(
        &mut self,
        comm: &mut C,
        tensors: &mut [&mut [T]],
        op: ReduceOp,
    ) -> Result<usize, CommError> {
        let lens: Vec<usize> = tensors.iter().map(|t| t.len()).collect();
        let buckets = self.plan(&lens);
        for bucket in &buckets {
            let group = &mut tensors[bucket.clone()];
            if let [single] = group {
                comm.all_reduce_in_place(single, op)?;
                continue;
            }
            self.staging.clear();
            for t in group.iter() {
                self.staging.extend_from_slice(t);
            }
            comm.all_reduce_in_place(&mut self.staging, op)?;
            let mut at = 0;
            for t in group.iter_mut() {
                t.copy_from_slice(&self.staging[at..at + t.len()]);
                at += t.len();
            }
        }
        Ok(buckets.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_tensors_share_buckets_and_large_ones_go_alone() {
        let b = Bucketer::<f32>::new(40); // 10 floats
        assert_eq!(b.plan(&[3, 3, 3, 3]), vec![0..3, 3..4]);
        assert_eq!(b.plan(&[2, 50, 2]), vec![0..1, 1..2, 2..3]);
        assert_eq!(b.plan(&[]), Vec::<std::ops::Range<usize>>::new());
    }

    #[test]
    fn bucketed_reduction_matches_per_tensor_reduction() {
        let results = crate::cpu::run(3, &crate::cpu::CpuConfig::default(), |comm| {
            let r = comm.rank() as f64;
            let mut a = vec![r; 5];
            let mut b = vec![2.0 * r; 7];
            let mut c = vec![r + 1.0; 100];
            let mut bucketer = Bucketer::new(128);
            let calls = bucketer.all_reduce(comm, &mut [&mut a, &mut b, &mut c], ReduceOp::Avg)?;
            Ok((calls, a[0], b[6], c[99]))
        });
        for r in results {
            let (calls, a, b, c) = r.unwrap();
            assert_eq!(calls, 2);
            assert_eq!((a, b, c), (1.0, 2.0, 2.0));
        }
    }
}
