//! The check of outputs too large to describe element by element: how
//! many elements miss the serial reference, computed as it is compared.
//! [`expected`](super::expected) keeps every element's contributing values
//! (what a failing test prints); at a benchmark's sizes that is one heap
//! vector per element, which made checking a 1 GiB all-reduce take
//! minutes and gigabytes.

use super::KitElement;
use crate::types::{Collective, Rank, ReduceOp};

/// How many elements of rank `r`'s `out` miss, with every rank's input in
/// `inputs`, what [`expected`](super::expected)
/// and [`wrong_elements`](super::wrong_elements) would say it must hold
/// (`untouched`: what an output left alone holds, needed only for a
/// non-root rank's reduce): the same count, without building the
/// reference.
pub fn count_wrong<T: KitElement>(
    c: Collective,
    op: ReduceOp,
    count: usize,
    r: Rank,
    inputs: &[&[T]],
    out: &[T],
    untouched: &[T],
) -> u64 {
    let len = inputs.first().map_or(0, |i| i.len());
    let shape = Inputs {
        ranks: inputs.len(),
        len,
    };
    let fill = |rank: usize, at: usize, into: &mut [T]| {
        into.copy_from_slice(&inputs[rank][at..at + into.len()]);
    };
    count_wrong_by(c, op, count, r, shape, fill, out, untouched)
}

/// How many ranks give inputs of how many elements each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inputs {
    /// The world size.
    pub ranks: usize,
    /// Elements of each rank's input.
    pub len: usize,
}

/// [`count_wrong`] with each rank's inputs made on demand instead of held:
/// `fill(rank, at, into)` writes that rank's input elements from `at` on
/// into `into`. A benchmark checking a gigabyte need not hold every other
/// rank's input to check its own output when it can make any stretch of
/// them ([`super::SplitMix64::nth`]). The output is compared a block at a
/// time ([`KitElement::count_misses`]).
#[allow(clippy::too_many_arguments)]
pub fn count_wrong_by<T: KitElement>(
    c: Collective,
    op: ReduceOp,
    count: usize,
    r: Rank,
    inputs: Inputs,
    fill: impl Fn(usize, usize, &mut [T]),
    out: &[T],
    untouched: &[T],
) -> u64 {
    let (r, n, len) = (r as usize, inputs.ranks, inputs.len);
    let mut blocks = Blocks::new(n.max(1), fill);
    // Where the output copies inputs: (output offset, rank, input offset,
    // elements), one stretch per source.
    let copied = |blocks: &mut Blocks<T, _>, stretches: &mut dyn Iterator<Item = Stretch>| {
        stretches.map(|s| blocks.copies(op, s, out)).sum::<usize>()
    };
    let (wanted, wrong) = match c {
        Collective::AllReduce => (count, blocks.reduced(op, n, count, 0, out)),
        Collective::ReduceScatter => (count, blocks.reduced(op, n, count, r * count, out)),
        Collective::Reduce { root } if root as usize == r => {
            (count, blocks.reduced(op, n, count, 0, out))
        }
        Collective::Reduce { .. } => (
            untouched.len(),
            out.iter().zip(untouched).filter(|(g, u)| g != u).count(),
        ),
        // The inputs one after another (each rank's is the same length).
        Collective::AllGather => (
            n * len,
            copied(&mut blocks, &mut (0..n).map(|q| (q * len, q, 0, len))),
        ),
        Collective::Broadcast { root } => (
            len,
            copied(
                &mut blocks,
                &mut std::iter::once((0, root as usize, 0, len)),
            ),
        ),
        Collective::AllToAll => (
            n * count,
            copied(
                &mut blocks,
                &mut (0..n).map(|q| (q * count, q, r * count, count)),
            ),
        ),
        Collective::SendRecv => (
            len,
            copied(
                &mut blocks,
                &mut std::iter::once((0, (r + n - 1) % n, 0, len)),
            ),
        ),
    };
    (wrong + out.len().abs_diff(wanted)) as u64
}

/// A stretch of output that copies one rank's input: (output offset,
/// rank, input offset, elements).
type Stretch = (usize, usize, usize, usize);

/// Room for one block of every rank's input, and how to make it.
struct Blocks<T, F> {
    values: Vec<Vec<T>>,
    fill: F,
    block: usize,
}

impl<T: KitElement, F: Fn(usize, usize, &mut [T])> Blocks<T, F> {
    /// Blocks for `n` ranks: about 64 KiB of inputs at a time, so every
    /// rank's block stays in the cache while its elements are judged.
    fn new(n: usize, fill: F) -> Self {
        let block = ((64 << 10) / std::mem::size_of::<T>().max(1) / n).clamp(64, 8192);
        Blocks {
            values: vec![Vec::with_capacity(block); n],
            fill,
            block,
        }
    }

    /// Misses of the first `count` elements of `out` (fewer if it is
    /// shorter), each the reduction of every rank's input element `from`
    /// elements on.
    fn reduced(&mut self, op: ReduceOp, n: usize, count: usize, from: usize, out: &[T]) -> usize {
        let got = &out[..out.len().min(count)];
        let mut misses = 0;
        for at in (0..got.len()).step_by(self.block) {
            let g = &got[at..got.len().min(at + self.block)];
            for (rank, v) in self.values.iter_mut().enumerate().take(n) {
                v.resize(g.len(), T::poison());
                (self.fill)(rank, from + at, v);
            }
            let refs: Vec<&[T]> = self.values.iter().map(Vec::as_slice).collect();
            misses += T::count_misses(op, g, &refs);
        }
        misses
    }

    /// Misses of the output stretch that copies `rank`'s input (a copy is
    /// judged as a reduction of one value: exact for min and max, within
    /// the type's rounding otherwise); the part of it past `out`'s end is
    /// not counted here.
    fn copies(&mut self, op: ReduceOp, (to, rank, from, len): Stretch, out: &[T]) -> usize {
        let got = out.get(to..).unwrap_or(&[]);
        let got = &got[..got.len().min(len)];
        let mut misses = 0;
        for at in (0..got.len()).step_by(self.block) {
            let g = &got[at..got.len().min(at + self.block)];
            let v = &mut self.values[0];
            v.resize(g.len(), T::poison());
            (self.fill)(rank, from + at, v);
            misses += T::count_misses(op, g, &[v.as_slice()]);
        }
        misses
    }
}

#[cfg(test)]
mod tests {
    use super::super::{expected, wrong_elements};
    use super::*;

    /// Any element of a stream, made alone, is the one the stream makes
    /// in turn: the benchmark's check relies on it.
    #[test]
    fn the_nth_value_is_the_one_the_stream_makes() {
        for seed in [0u64, 1, 0x5eed, u64::MAX - 3] {
            let mut g = super::super::SplitMix64(seed);
            for i in 0..1000u64 {
                assert_eq!(
                    super::super::SplitMix64::nth(seed, i),
                    g.next_u64(),
                    "{seed} {i}"
                );
            }
        }
    }

    /// A stretch made at once, on whatever vectors this CPU has and on
    /// none, holds the values the stream makes in turn, for every type.
    #[test]
    fn a_filled_stretch_is_the_stream() {
        fn same<T: KitElement + std::fmt::Debug>(op: ReduceOp) {
            let (seed, at) = (0x5eed_u64, 1000u64);
            let mut g = super::super::SplitMix64(seed);
            for _ in 0..at {
                g.next_u64();
            }
            let want: Vec<T> = (0..1037).map(|_| T::random(g.next_u64(), op)).collect();
            let mut got = vec![T::poison(); want.len()];
            super::super::SplitMix64::fill(seed, at, op, &mut got);
            assert_eq!(got, want, "{}", std::any::type_name::<T>());
            got.fill(T::poison());
            super::super::fill_with(seed, at, op, &mut got);
            assert_eq!(got, want, "{} without vectors", std::any::type_name::<T>());
        }
        for op in [ReduceOp::Sum, ReduceOp::Prod] {
            same::<f32>(op);
            same::<f64>(op);
            same::<half::f16>(op);
            same::<half::bf16>(op);
            same::<i8>(op);
            same::<u64>(op);
        }
    }

    /// Every collective, with and without wrong elements, short and long
    /// outputs: the count is what the element-by-element check finds.
    #[test]
    fn counts_what_the_element_by_element_check_finds() {
        let (n, count) = (3u32, 5usize);
        let inputs: Vec<Vec<f32>> = (0..n)
            .map(|r| {
                (0..n as usize * count)
                    .map(|i| (i as f32) + 0.25 * r as f32)
                    .collect()
            })
            .collect();
        for c in [
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
            Collective::Broadcast { root: 2 },
            Collective::Reduce { root: 1 },
            Collective::AllToAll,
            Collective::SendRecv,
        ] {
            for r in 0..n {
                let untouched = vec![-1.0f32; count];
                let want = expected(c, ReduceOp::Sum, n, count, r, &inputs);
                let good: Vec<f32> = match &want {
                    super::super::Expectation::Values(v) => v.iter().map(|x| x.0).collect(),
                    super::super::Expectation::Untouched => untouched.clone(),
                };
                let mut bad = good.clone();
                bad[0] += 1.0;
                let mut short = good.clone();
                short.pop();
                let mut long = good.clone();
                long.push(0.0);
                for out in [&good, &bad, &short, &long] {
                    let slow = wrong_elements(ReduceOp::Sum, &want, out, &untouched).len() as u64;
                    let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
                    let fast = count_wrong(c, ReduceOp::Sum, count, r, &refs, out, &untouched);
                    assert_eq!(fast, slow, "{c} rank {r}: {out:?}");
                }
            }
        }
    }
}
