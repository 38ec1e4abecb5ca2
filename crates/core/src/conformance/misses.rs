//! The check of many elements at once: a block of outputs against the same
//! block of every rank's input, reduced lane by lane so the compiler can
//! vectorise it. [`KitElement::reference`](super::KitElement::reference)
//! and [`close`](super::KitElement::close) judge one element from a slice
//! of its values; called per element of a checked gigabyte they were most
//! of a large benchmark row's time. Every rule here is theirs, element for
//! element (a test holds them equal for every type and op).

use crate::types::ReduceOp;

/// Elements reduced together: the accumulators live on the stack.
const LANES: usize = 256;

/// How many of `got` miss the serial reduction of `ranks` (`ranks[r][j]`
/// is rank `r`'s value for `got[j]`; at least one rank, each at least as
/// long as `got`) for a float type that widens to f64 by `to` and narrows
/// by `from`, with machine epsilon `eps`.
pub(super) fn float_misses<T: Copy>(
    op: ReduceOp,
    got: &[T],
    ranks: &[&[T]],
    widen: (impl Fn(T) -> f64, impl Fn(f64) -> T, f64),
) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
            // SAFETY: the CPU has the features the function enables.
            return unsafe { float_misses_avx512(op, got, ranks, widen) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { float_misses_avx2(op, got, ranks, widen) };
        }
    }
    float_misses_with(op, got, ranks, widen)
}

/// [`float_misses`] with AVX-512's vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn float_misses_avx512<T: Copy>(
    op: ReduceOp,
    got: &[T],
    ranks: &[&[T]],
    widen: (impl Fn(T) -> f64, impl Fn(f64) -> T, f64),
) -> usize {
    float_misses_with(op, got, ranks, widen)
}

/// [`float_misses`] with AVX2's vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn float_misses_avx2<T: Copy>(
    op: ReduceOp,
    got: &[T],
    ranks: &[&[T]],
    widen: (impl Fn(T) -> f64, impl Fn(f64) -> T, f64),
) -> usize {
    float_misses_with(op, got, ranks, widen)
}

/// [`float_misses`]' loops, compiled once per instruction set.
#[inline(always)]
fn float_misses_with<T: Copy>(
    op: ReduceOp,
    got: &[T],
    ranks: &[&[T]],
    (to, from, eps): (impl Fn(T) -> f64, impl Fn(f64) -> T, f64),
) -> usize {
    let Some((first, rest)) = ranks.split_first() else {
        return got.len();
    };
    let n = ranks.len() as f64;
    let mut misses = 0;
    for start in (0..got.len()).step_by(LANES) {
        let g = &got[start..got.len().min(start + LANES)];
        let lanes = g.len();
        let (mut acc, mut mag) = ([0.0f64; LANES], [0.0f64; LANES]);
        for ((a, m), &x) in acc.iter_mut().zip(&mut mag).zip(&first[start..][..lanes]) {
            *a = to(x);
            *m = a.abs();
        }
        for r in rest {
            let xs = &r[start..][..lanes];
            let each = acc.iter_mut().zip(&mut mag).zip(xs);
            match op {
                ReduceOp::Sum | ReduceOp::Avg => each.for_each(|((a, m), &x)| {
                    let v = to(x);
                    *a += v;
                    *m += v.abs();
                }),
                ReduceOp::Prod => each.for_each(|((a, _), &x)| *a *= to(x)),
                ReduceOp::Min => each.for_each(|((a, _), &x)| *a = a.min(to(x))),
                ReduceOp::Max => each.for_each(|((a, _), &x)| *a = a.max(to(x))),
            }
        }
        // One loop per op, with nothing to decide inside: it vectorises.
        let want = |a: f64| to(from(a));
        let far = |tol: &dyn Fn(f64, f64) -> f64| {
            let each = g.iter().zip(&acc).zip(&mag);
            each.filter(|&((&got, &a), &m)| {
                let w = want(a);
                !within(
                    (to(got) - w).abs(),
                    (n + 1.0) * eps * tol(w, m).max(f64::MIN_POSITIVE),
                )
            })
            .count()
        };
        misses += match op {
            ReduceOp::Min | ReduceOp::Max => {
                let each = g.iter().zip(&acc);
                each.filter(|&(&got, &a)| to(got) != want(a)).count()
            }
            ReduceOp::Prod => far(&|w, _| w.abs()),
            ReduceOp::Sum => far(&|_, m| m),
            ReduceOp::Avg => {
                let each = g.iter().zip(&acc).zip(&mag);
                each.filter(|&((&got, &a), &m)| {
                    let w = want(a / n);
                    !within(
                        (to(got) - w).abs(),
                        (n + 1.0) * eps * (m / n).max(f64::MIN_POSITIVE),
                    )
                })
                .count()
            }
        };
    }
    misses
}

/// An integer type's wrapping sum and product, and its average's division.
pub(super) type IntOps<T> = (fn(T, T) -> T, fn(T, T) -> T, fn(T, u32) -> T);

/// Whether a difference is within a tolerance: false for a NaN difference
/// (a NaN output, or ∞ − ∞), which must count as a miss, as in `close`.
#[inline(always)]
fn within(diff: f64, tol: f64) -> bool {
    diff <= tol
}

/// [`float_misses`] for an integer type: wrapping sums and products, then
/// `divide` for an average; only the exact value passes.
pub(super) fn int_misses<T: Copy + Ord>(
    op: ReduceOp,
    got: &[T],
    ranks: &[&[T]],
    (add, mul, divide): IntOps<T>,
) -> usize {
    let Some((first, rest)) = ranks.split_first() else {
        return got.len();
    };
    let fold: fn(T, T) -> T = match op {
        ReduceOp::Sum | ReduceOp::Avg => add,
        ReduceOp::Prod => mul,
        ReduceOp::Min => Ord::min,
        ReduceOp::Max => Ord::max,
    };
    let mut misses = 0;
    for start in (0..got.len()).step_by(LANES) {
        let g = &got[start..got.len().min(start + LANES)];
        let mut acc = [first[start]; LANES];
        acc[..g.len()].copy_from_slice(&first[start..][..g.len()]);
        for r in rest {
            for (a, &x) in acc.iter_mut().zip(&r[start..][..g.len()]) {
                *a = fold(*a, x);
            }
        }
        for (&got, &a) in g.iter().zip(&acc) {
            let want = if op == ReduceOp::Avg {
                divide(a, ranks.len() as u32)
            } else {
                a
            };
            misses += usize::from(got != want);
        }
    }
    misses
}

#[cfg(test)]
mod tests {
    use super::super::{KitElement, SplitMix64};
    use crate::types::ReduceOp;
    use half::{bf16, f16};

    const OPS: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
    ];

    /// Outputs near and far from the reference, for `ranks` ranks, more
    /// elements than one block of lanes: the block check counts what the
    /// element-by-element rules count.
    fn agrees<T: KitElement + std::fmt::Debug>(nudge: impl Fn(T, u64) -> T) {
        for ranks in [1usize, 2, 3, 7] {
            for op in OPS {
                let mut g = SplitMix64(ranks as u64);
                let len = 600;
                let inputs: Vec<Vec<T>> = (0..ranks)
                    .map(|_| (0..len).map(|_| T::random(g.next_u64(), op)).collect())
                    .collect();
                let got: Vec<T> = (0..len)
                    .map(|j| {
                        let values: Vec<T> = inputs.iter().map(|v| v[j]).collect();
                        nudge(T::reference(op, &values), g.next_u64())
                    })
                    .collect();
                let slow = (0..len)
                    .filter(|&j| {
                        let values: Vec<T> = inputs.iter().map(|v| v[j]).collect();
                        !T::close(op, got[j], T::reference(op, &values), &values)
                    })
                    .count();
                let refs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
                let fast = T::count_misses(op, &got, &refs);
                assert_eq!(fast, slow, "{} ranks, {op:?}", ranks);
                assert!(
                    slow > 0 && slow < len,
                    "{} ranks, {op:?}, {}: {slow} of {len} miss: the case must judge both ways",
                    ranks,
                    std::any::type_name::<T>()
                );
            }
        }
    }

    /// Elements moved by a step that is near for some types and far for
    /// others, or made NaN or infinite (which must miss): floats by a
    /// relative amount, integers by one.
    fn float_nudge(x: f64, bits: u64) -> f64 {
        match bits % 7 {
            0 | 3 => x,
            1 | 4 => x * (1.0 + 1e-9),
            2 => x + 8.0,
            5 => f64::NAN,
            _ => [f64::INFINITY, f64::NEG_INFINITY][(bits >> 8) as usize % 2],
        }
    }

    #[test]
    fn the_block_check_counts_what_the_element_check_counts() {
        agrees::<f32>(|x, b| float_nudge(f64::from(x), b) as f32);
        agrees::<f64>(float_nudge);
        agrees::<f16>(|x, b| f16::from_f64(float_nudge(x.to_f64(), b)));
        agrees::<bf16>(|x, b| bf16::from_f64(float_nudge(x.to_f64(), b)));
        agrees::<i8>(|x, b| x.wrapping_add((b % 2) as i8));
        agrees::<u8>(|x, b| x.wrapping_add((b % 2) as u8));
        agrees::<i32>(|x, b| x.wrapping_add((b % 2) as i32));
        agrees::<u32>(|x, b| x.wrapping_add((b % 2) as u32));
        agrees::<i64>(|x, b| x.wrapping_add((b % 2) as i64));
        agrees::<u64>(|x, b| x.wrapping_add(b % 2));
    }
}
