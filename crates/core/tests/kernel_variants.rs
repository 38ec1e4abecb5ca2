//! Every kernel variant this CPU can run — each vector width, with
//! non-temporal and cached stores — forced on every element type and
//! reduction op, against the conformance kit's serial reference. The
//! variants this CPU cannot run are printed as skipped.

use ferrocoll_core::conformance::KitElement;
use ferrocoll_core::kernels::{KernelChoice, calibration};
use ferrocoll_core::{DataType, ReduceOp, with_element_type};

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

fn check<T: KitElement>(choice: KernelChoice, op: ReduceOp, sources: usize, len: usize) {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (len as u64) ^ ((sources as u64) << 40);
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let srcs: Vec<Vec<T>> = (0..sources)
        .map(|_| (0..len).map(|_| T::random(next(), op)).collect())
        .collect();
    let want: Vec<T> = (0..len)
        .map(|i| {
            let column: Vec<T> = srcs.iter().map(|s| s[i]).collect();
            // The kernels leave `Avg` as a sum (the executor divides once).
            let op = if op == ReduceOp::Avg {
                ReduceOp::Sum
            } else {
                op
            };
            T::reference(op, &column)
        })
        .collect();
    let ptrs: Vec<*const T> = srcs.iter().map(|s| s.as_ptr()).collect();
    let column = |i: usize| srcs.iter().map(|s| s[i]).collect::<Vec<T>>();
    let kernel_op = if op == ReduceOp::Avg {
        ReduceOp::Sum
    } else {
        op
    };
    let mut out = vec![T::poison(); len];
    // SAFETY: every source and `out` hold `len` elements; `out` is distinct.
    unsafe { T::reduce_with(choice, op, &ptrs, out.as_mut_ptr(), len) };
    for i in 0..len {
        assert!(
            T::close(kernel_op, out[i], want[i], &column(i)),
            "{choice} {op} {} x{sources} len {len} i {i}: {:?} vs {:?}",
            T::DATA_TYPE,
            out[i],
            want[i]
        );
    }
    let mut d0 = vec![T::poison(); len];
    let mut d1 = vec![T::poison(); len + 1];
    let dsts = [d0.as_mut_ptr(), d1[1..].as_mut_ptr()];
    // SAFETY: as above; two distinct destinations of `len` elements.
    let fused = unsafe { T::reduce_stream_with(choice, op, &ptrs, &dsts, len) };
    if fused {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        for i in 0..len {
            assert!(
                T::close(kernel_op, d0[i], want[i], &column(i)),
                "{choice} fused {op} i {i}"
            );
            assert!(
                T::close(kernel_op, d1[i + 1], want[i], &column(i)),
                "{choice} fused {op} i {i}"
            );
        }
    }
    // In place: the first destination is exactly the first source (the
    // contract allows it: every element is read before it is written).
    let mut first = srcs[0].clone();
    let mut other = vec![T::poison(); len];
    let mut aliased = ptrs.clone();
    aliased[0] = first.as_ptr();
    let dsts = [first.as_mut_ptr(), other.as_mut_ptr()];
    // SAFETY: every buffer holds `len` elements; `first` is exactly
    // `aliased[0]`, `other` is distinct.
    if unsafe { T::reduce_stream_with(choice, op, &aliased, &dsts, len) } {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        for i in 0..len {
            assert!(
                T::close(kernel_op, first[i], want[i], &column(i))
                    && T::close(kernel_op, other[i], want[i], &column(i)),
                "{choice} fused in place {op} i {i}"
            );
        }
    }
}

#[test]
fn every_runnable_variant_matches_the_serial_reference_on_every_dtype_and_op() {
    let variants = KernelChoice::available();
    println!("calibration: {}", calibration());
    for skipped in KernelChoice::unavailable() {
        println!("skipped (this CPU lacks it): {skipped:?}");
    }
    for &choice in &variants {
        for dtype in DataType::ALL {
            for op in OPS {
                for (sources, len) in [(1, 33), (2, 0), (2, 1), (2, 4099), (3, 1000), (5, 257)] {
                    with_element_type!(dtype, T => check::<T>(choice, op, sources, len));
                }
            }
        }
        println!("variant {choice}: every dtype and op matches");
    }
}
