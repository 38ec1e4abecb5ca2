//! `GradientSync` on the threads executor, each rank behind a progress
//! thread: buckets averaged whatever order gradients arrive in, ranks kept
//! in step when one misses a gradient, zeroing for a backward that
//! accumulates and none for one that assigns, and layouts that differ.

mod async_ranks;

use async_ranks::run_async;
use ferrocoll_core::ReduceOp;
use ferrocoll_core::comm::{CommError, Communicator};

#[test]
fn gradient_sync_averages_every_bucket_whatever_order_gradients_arrive_in() {
    use ferrocoll_core::grad_sync::{GradientSync, SyncError};
    let lens = [5usize, 300, 0, 17, 64, 1];
    let results = run_async(3, |comm| {
        let r = comm.rank() as usize;
        // 100 f32 per bucket: [1, 64, 17] [0, 300]... in reverse order.
        let mut sync = GradientSync::<f32, _>::new(comm, &lens, 400).map_err(unsupported)?;
        let buckets = sync.buckets();
        assert_eq!(
            buckets.first().unwrap()[0],
            lens.len() - 1,
            "last layer first"
        );
        for step in 0..3 {
            // Each rank marks in its own order within the step.
            let mut order: Vec<usize> = (0..lens.len()).rev().collect();
            order.rotate_left((r + step) % lens.len());
            for &p in &order {
                let grad: Vec<f32> = (0..lens[p])
                    .map(|i| (r * 7 + p + i + step) as f32)
                    .collect();
                sync.mark_ready(p, &grad).map_err(unsupported)?;
            }
            sync.finish().map_err(unsupported)?;
            for (p, &len) in lens.iter().enumerate() {
                let want: Vec<f32> = (0..len).map(|i| (7 + p + i + step) as f32).collect();
                assert_eq!(
                    sync.gradient(p).unwrap(),
                    &want[..],
                    "step {step} param {p}"
                );
            }
        }
        // Misuse is typed, and the next step still works.
        let e1 = sync.mark_ready(9, &[]).unwrap_err();
        let e2 = sync.mark_ready(0, &[1.0]).unwrap_err();
        sync.mark_ready(2, &[]).unwrap();
        let e3 = sync.mark_ready(2, &[]).unwrap_err();
        assert!(matches!(e1, SyncError::UnknownParam { .. }), "{e1}");
        assert!(matches!(e2, SyncError::Length { .. }), "{e2}");
        assert!(matches!(e3, SyncError::AlreadyReady { .. }), "{e3}");
        Ok(buckets.len())
    });
    for r in results {
        assert!(r.unwrap() >= 3);
    }
}

#[test]
fn gradient_sync_keeps_ranks_in_step_when_one_misses_a_gradient() {
    use ferrocoll_core::grad_sync::{GradientSync, SyncError};
    let lens = [0usize, 0, 10, 3];
    let results = run_async(2, |comm| {
        let r = comm.rank();
        let mut sync = GradientSync::<f64, _>::new(comm, &lens, 16).unwrap();
        // Rank 1 forgets parameter 2 in the first step.
        for p in (0..lens.len()).rev() {
            if !(r == 1 && p == 2) {
                sync.mark_ready(p, &vec![1.0; lens[p]]).unwrap();
            }
        }
        let first = sync.finish().unwrap_err();
        // The next step is a clean one on both ranks.
        for p in (0..lens.len()).rev() {
            sync.mark_ready(p, &vec![f64::from(r); lens[p]]).unwrap();
        }
        sync.finish().unwrap();
        assert_eq!(sync.gradient(2).unwrap(), &[0.5; 10][..]);
        Ok(first)
    });
    let errors: Vec<SyncError> = results.into_iter().map(Result::unwrap).collect();
    assert!(
        matches!(errors[0], SyncError::PeerNotReady { most_missing: 1 }),
        "{}",
        errors[0]
    );
    assert!(
        matches!(&errors[1], SyncError::NotReady { missing } if missing == &[2]),
        "{}",
        errors[1]
    );
}

#[test]
fn gradient_buffers_start_each_step_at_zero_for_a_backward_that_accumulates() {
    // Before: gradient_mut handed back last step's averages, so `+=` added
    // this step's gradient to them.
    use ferrocoll_core::grad_sync::GradientSync;
    let lens = [4usize, 6];
    let results = run_async(2, |comm| {
        let r = f32::from(comm.rank() as u8);
        let mut sync = GradientSync::<f32, _>::new(comm, &lens, 1 << 20).unwrap();
        let mut seen = Vec::new();
        for step in 1..=3 {
            for p in (0..lens.len()).rev() {
                // Two micro-batches, accumulated.
                for _ in 0..2 {
                    for g in sync.gradient_mut(p).unwrap() {
                        *g += r + step as f32;
                    }
                }
                sync.mark_ready_in_place(p).unwrap();
            }
            sync.finish().unwrap();
            seen.push(sync.gradient(1).unwrap()[0]);
        }
        Ok(seen)
    });
    for r in results {
        // avg over ranks 0 and 1 of 2 * (rank + step).
        assert_eq!(r.unwrap(), vec![3.0, 5.0, 7.0]);
    }
}

#[test]
fn a_gradient_to_overwrite_is_not_zeroed_and_later_accumulation_keeps_it() {
    // A backward that assigns skips the zeroing pass: the view holds last
    // step's average until written, and a `gradient_mut` after it in the
    // same step adds to what was assigned instead of zeroing it.
    use ferrocoll_core::grad_sync::{GradientSync, SyncError};
    let lens = [3usize, 5];
    let results = run_async(2, |comm| {
        let r = f32::from(comm.rank() as u8);
        let mut sync = GradientSync::<f32, _>::new(comm, &lens, 1 << 20).unwrap();
        let mut seen = Vec::new();
        for step in 1..=3 {
            let step = step as f32;
            for p in (0..lens.len()).rev() {
                let view = sync.gradient_to_overwrite(p).unwrap();
                seen.push(view[0]); // last step's average, not zero
                view.fill(r + step);
                for g in sync.gradient_mut(p).unwrap() {
                    *g += 1.0;
                }
                sync.mark_ready_in_place(p).unwrap();
            }
            let again = sync.gradient_to_overwrite(0).map(|_| ());
            assert!(matches!(again, Err(SyncError::AlreadyReady { param: 0 })));
            sync.finish().unwrap();
        }
        assert!(matches!(
            sync.gradient_to_overwrite(7),
            Err(SyncError::UnknownParam { param: 7, .. })
        ));
        Ok(seen)
    });
    for r in results {
        // Step s averages (rank + s + 1) over ranks 0 and 1: s + 1.5.
        assert_eq!(r.unwrap(), vec![0.0, 0.0, 2.5, 2.5, 3.5, 3.5]);
    }
}

#[test]
fn gradient_sync_refuses_layouts_that_differ_across_ranks() {
    use ferrocoll_core::grad_sync::{GradientSync, SyncError};
    let results = run_async(2, |comm| {
        let lens: &[usize] = if comm.rank() == 0 { &[1, 3] } else { &[3, 1] };
        match GradientSync::<f32, _>::new(comm, lens, 1024) {
            Ok(_) => Ok(None),
            Err(refused) => {
                // The communicator comes back, still usable.
                let mut comm = refused.comm;
                let sum = comm.iall_reduce(vec![1u32], ReduceOp::Sum).wait().unwrap();
                assert_eq!(sum, [2]);
                Ok(Some(refused.error))
            }
        }
    });
    for r in results {
        let e = r.unwrap().expect("layouts differ");
        assert!(
            matches!(e, SyncError::Comm(CommError::Disagreement { .. })),
            "{e}"
        );
    }
}

/// A gradient-sync error as the communicator error the rank closures return.
fn unsupported(e: impl std::fmt::Display) -> CommError {
    CommError::Unsupported {
        what: e.to_string(),
    }
}
