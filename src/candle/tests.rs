//! The candle functions on thread ranks, against serial references.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

use super::*;
use crate::ReduceOp;
use crate::cpu::{self, CpuCommunicator, CpuConfig};

/// `f` on every rank of an `n`-thread group, in rank order.
fn on_ranks<R: Send>(n: u32, f: impl Fn(CpuCommunicator, usize) -> R + Sync) -> Vec<R> {
    let comms = cpu::group(n, &CpuConfig::default()).unwrap();
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(r, c)| s.spawn(move || f(c, r)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank r's tensor: r + 1 + i/8 for element i, as `dtype`.
fn ranked(r: usize, len: usize, dtype: DType) -> Tensor {
    let v: Vec<f32> = (0..len).map(|i| r as f32 + 1.0 + i as f32 / 8.0).collect();
    Tensor::from_vec(v, len, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn all_reduce_sums_every_dtype_in_place_and_clones_see_it() {
    for dtype in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::U32,
    ] {
        for len in [0, 1, 13] {
            let n = 3;
            let out = on_ranks(n, |mut c, r| {
                let t = ranked(r, len, dtype);
                let alias = t.clone();
                all_reduce(&mut c, &t, ReduceOp::Sum).unwrap();
                (values(&t), values(&alias))
            });
            let want: Vec<f64> = (0..len)
                .map(|i| {
                    (0..n as usize)
                        .map(|r| values(&ranked(r, len, dtype))[i])
                        .sum()
                })
                .collect();
            for (got, alias) in out {
                assert_eq!(got, alias, "{dtype:?}: clones share the storage");
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= 0.02 * w.abs(),
                        "{dtype:?} {len}: {got:?} vs {want:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_strided_view_changes_only_its_own_elements() {
    let out = on_ranks(2, |mut c, r| {
        let base = Tensor::arange(0f32, 12.0, &Device::Cpu)
            .unwrap()
            .reshape((3, 4))
            .unwrap();
        let base = (base + r as f64 * 100.0).unwrap();
        let column = base.narrow(1, 1, 2).unwrap();
        all_reduce(&mut c, &column, ReduceOp::Max).unwrap();
        (values(&column), values(&base))
    });
    // Rank 1's values are larger everywhere: the view becomes rank 1's.
    assert_eq!(out[0].0, vec![101.0, 102.0, 105.0, 106.0, 109.0, 110.0]);
    assert_eq!(out[0].1[0], 0.0, "outside the view stays");
    assert_eq!(out[0].1[1], 101.0);
    assert_eq!(out[0].1[3], 3.0);
    assert_eq!(out[1].0, out[0].0);
}

#[test]
fn broadcast_copies_the_roots_tensor() {
    let out = on_ranks(3, |mut c, r| {
        let t = ranked(r, 5, DType::F32);
        broadcast(&mut c, &t, 1).unwrap();
        values(&t)
    });
    let want = values(&ranked(1, 5, DType::F32));
    assert!(out.iter().all(|v| *v == want), "{out:?}");
}

#[test]
fn all_gather_concatenates_along_the_first_dimension() {
    let out = on_ranks(3, |mut c, r| {
        let t = (Tensor::ones((2, 2), DType::F32, &Device::Cpu).unwrap() * r as f64).unwrap();
        let scalar = Tensor::new(r as f32, &Device::Cpu).unwrap();
        let g = all_gather(&mut c, &t).unwrap();
        let s = all_gather(&mut c, &scalar).unwrap();
        (g.dims().to_vec(), values(&g), s.dims().to_vec(), values(&s))
    });
    for (dims, v, sdims, s) in out {
        assert_eq!(dims, vec![6, 2]);
        assert_eq!(
            v,
            vec![0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
        );
        assert_eq!(sdims, vec![3]);
        assert_eq!(s, vec![0.0, 1.0, 2.0]);
    }
}

#[test]
fn reduce_scatter_keeps_each_ranks_block() {
    let out = on_ranks(2, |mut c, r| {
        let t = Tensor::arange(0f32, 8.0, &Device::Cpu)
            .unwrap()
            .reshape((4, 2))
            .unwrap();
        let t = (t * (r + 1) as f64).unwrap();
        let mine = reduce_scatter(&mut c, &t, ReduceOp::Sum).unwrap();
        let odd = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
        let refused = reduce_scatter(&mut c, &odd, ReduceOp::Sum).unwrap_err();
        (mine.dims().to_vec(), values(&mine), refused)
    });
    assert_eq!(out[0].0, vec![2, 2]);
    assert_eq!(out[0].1, vec![0.0, 3.0, 6.0, 9.0]);
    assert_eq!(out[1].1, vec![12.0, 15.0, 18.0, 21.0]);
    assert!(matches!(&out[0].2, CandleError::Unsupported(m) if m.contains("equal blocks")));
}

#[test]
fn a_dtype_ferrocoll_lacks_is_a_typed_error_on_every_rank() {
    let out = on_ranks(2, |mut c, _| {
        let t = Tensor::zeros(4, DType::I16, &Device::Cpu).unwrap();
        all_reduce(&mut c, &t, ReduceOp::Sum).unwrap_err()
    });
    for e in out {
        assert!(
            matches!(&e, CandleError::Unsupported(m) if m.contains("I16")),
            "{e}"
        );
    }
}

#[test]
fn lengths_that_differ_across_ranks_fail_every_rank() {
    let out = on_ranks(2, |mut c, r| {
        let t = ranked(r, 4 + r, DType::F32);
        all_reduce(&mut c, &t, ReduceOp::Sum).unwrap_err()
    });
    for e in out {
        assert!(matches!(e, CandleError::Comm(_)), "{e}");
    }
}

/// Gradients of one step on each rank; rank r's are r + 1, and
/// parameter 1 has none on rank 0.
fn step_grads(vars: &[Var], r: usize) -> GradStore {
    let x = Tensor::ones(3, DType::F32, &Device::Cpu).unwrap();
    let mut loss = (vars[0].as_tensor() * &x).unwrap().sum_all().unwrap();
    if r != 0 {
        loss = (loss + vars[1].as_tensor().sum_all().unwrap()).unwrap();
    }
    let loss = (loss * (r + 1) as f64).unwrap();
    loss.backward().unwrap()
}

#[test]
fn data_parallel_starts_from_rank_zero_and_averages_gradients() {
    let out = on_ranks(3, |c, r| {
        let vars = vec![
            Var::from_tensor(&ranked(r, 3, DType::F32)).unwrap(),
            Var::from_tensor(&ranked(r, 2, DType::F32)).unwrap(),
        ];
        let mut dp = DataParallel::<f32, _>::new(c, vars.clone(), 8).unwrap();
        let start = values(vars[0].as_tensor());
        let mut grads = step_grads(&vars, r);
        dp.sync(&mut grads).unwrap();
        (
            start,
            values(grads.get(vars[0].as_tensor()).unwrap()),
            values(grads.get(vars[1].as_tensor()).unwrap()),
        )
    });
    let rank0 = values(&ranked(0, 3, DType::F32));
    for (start, g0, g1) in out {
        assert_eq!(start, rank0, "replicas start from rank 0's values");
        assert_eq!(g0, vec![2.0; 3], "(1 + 2 + 3) / 3");
        let third = f64::from(5.0f32 / 3.0);
        assert_eq!(
            g1,
            vec![third; 2],
            "(0 + 2 + 3) / 3: a missing gradient counts as zeros"
        );
    }
}

#[test]
fn data_parallel_refuses_parameter_lists_that_differ_across_ranks() {
    let out = on_ranks(2, |c, r| {
        let vars = vec![Var::from_tensor(&ranked(r, 3 + r, DType::F32)).unwrap()];
        DataParallel::<f32, _>::new(c, vars, 1 << 10).err()
    });
    for e in out {
        assert!(
            matches!(&e, Some(CandleError::Sync(_))),
            "the layout agreement refuses it: {e:?}"
        );
    }
}

#[test]
fn a_parameter_one_rank_refuses_fails_every_rank_at_once() {
    let started = std::time::Instant::now();
    let out = on_ranks(3, |c, r| {
        let dtype = if r == 2 { DType::F64 } else { DType::F32 };
        let vars = vec![Var::from_tensor(&ranked(r, 3, dtype)).unwrap()];
        DataParallel::<f32, _>::new(c, vars, 1 << 10).err()
    });
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert!(
        matches!(&out[2], Some(CandleError::Unsupported(m)) if m.contains("F64")),
        "{out:?}"
    );
    assert!(
        matches!(&out[0], Some(CandleError::Unsupported(m)) if m.contains("another rank")),
        "{out:?}"
    );
}

#[test]
fn a_parameter_no_rank_used_keeps_no_gradient() {
    let out = on_ranks(2, |c, r| {
        let vars = vec![
            Var::from_tensor(&ranked(r, 3, DType::F32)).unwrap(),
            Var::from_tensor(&ranked(r, 2, DType::F32)).unwrap(),
        ];
        let mut dp = DataParallel::<f32, _>::new(c, vars.clone(), 8).unwrap();
        let x = Tensor::ones(3, DType::F32, &Device::Cpu).unwrap();
        let loss = (vars[0].as_tensor() * &x).unwrap().sum_all().unwrap();
        let mut grads = loss.backward().unwrap();
        dp.sync(&mut grads).unwrap();
        grads.get(vars[1].as_tensor()).is_none()
    });
    assert_eq!(out, vec![true, true]);
}

#[test]
fn data_parallel_refuses_a_parameter_of_another_dtype() {
    let out = on_ranks(1, |c, _| {
        let vars = vec![Var::from_tensor(&ranked(0, 3, DType::F64)).unwrap()];
        DataParallel::<f32, _>::new(c, vars, 1 << 10).err()
    });
    assert!(
        matches!(&out[0], Some(CandleError::Unsupported(m)) if m.contains("F64")),
        "{out:?}"
    );
}
