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
    count_wrong_by(
        c,
        op,
        count,
        r,
        shape,
        |rank: usize, i: usize| inputs[rank][i],
        out,
        untouched,
    )
}

/// How many ranks give inputs of how many elements each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inputs {
    /// The world size.
    pub ranks: usize,
    /// Elements of each rank's input.
    pub len: usize,
}

/// [`count_wrong`] with each rank's input element given by `input(rank,
/// index)` instead of held: a benchmark checking a gigabyte need not
/// hold every other rank's input to check its own output, when it can
/// make any element of them on demand ([`super::SplitMix64::nth`]).
#[allow(clippy::too_many_arguments)]
pub fn count_wrong_by<T: KitElement>(
    c: Collective,
    op: ReduceOp,
    count: usize,
    r: Rank,
    inputs: Inputs,
    input: impl Fn(usize, usize) -> T,
    out: &[T],
    untouched: &[T],
) -> u64 {
    let (r, n, len) = (r as usize, inputs.ranks, inputs.len);
    let mut values: Vec<T> = Vec::with_capacity(n);
    let mut reduced = |block: usize| {
        let mut wrong = |(i, &got): (usize, &T)| {
            values.clear();
            values.extend((0..n).map(|rank| input(rank, block * count + i)));
            !T::close(op, got, T::reference(op, &values), &values)
        };
        out.iter()
            .take(count)
            .enumerate()
            .filter(|&e| wrong(e))
            .count()
    };
    let copied = |want: &dyn Fn(usize) -> T, len: usize| {
        out.iter()
            .take(len)
            .enumerate()
            .filter(|&(i, &got)| {
                let w = want(i);
                !T::close(op, got, w, &[w])
            })
            .count()
    };
    let (wanted, wrong) = match c {
        Collective::AllReduce => (count, reduced(0)),
        Collective::ReduceScatter => (count, reduced(r)),
        Collective::Reduce { root } if root as usize == r => (count, reduced(0)),
        Collective::Reduce { .. } => (
            untouched.len(),
            out.iter().zip(untouched).filter(|(g, u)| g != u).count(),
        ),
        // The inputs one after another (each rank's is the same length).
        Collective::AllGather => (n * len, copied(&|i| input(i / len, i % len), n * len)),
        Collective::Broadcast { root } => (len, copied(&|i| input(root as usize, i), len)),
        Collective::AllToAll => (
            n * count,
            copied(&|i| input(i / count, r * count + i % count), n * count),
        ),
        Collective::SendRecv => (len, copied(&|i| input((r + n - 1) % n, i), len)),
    };
    (wrong + out.len().abs_diff(wanted)) as u64
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
