//! A small matrix for Miri, which checks the CPU executor's unsafe code
//! (raw pointers into other ranks' buffers, slot buffers, the reduction
//! kernels) for undefined behaviour and data races as it runs:
//!
//! ```sh
//! cargo +nightly miri test -p ferrocoll-core --test miri
//! ```
//!
//! (Miri warns that addresses travel as integers between ranks; add
//! `MIRIFLAGS=-Zmiri-permissive-provenance` to silence it.) Every algorithm and collective on 1–3 ranks, short
//! and odd lengths, chunks of a few bytes so every message path — direct
//! write, pointer, slot — and every segment boundary is crossed. It runs
//! in the normal test suite too, where it takes milliseconds.

mod common;

use std::time::Duration;

use ferrocoll_core::comm::{Communicator, CommunicatorExt, Planning};
use ferrocoll_core::conformance::{Case, check_case};
use ferrocoll_core::cpu::{self, CpuConfig};
use ferrocoll_core::{DataType, ReduceOp};

/// Miri is slow: waits get ten minutes, and 8-byte chunks make every
/// message path and segment boundary appear on short buffers.
const CPU: common::Cpu = common::Cpu {
    max_chunk_bytes: 8,
    timeout: Duration::from_secs(600),
};

#[test]
fn every_algorithm_on_small_groups_is_free_of_undefined_behaviour() {
    let dtypes = [DataType::F32, DataType::Bf16, DataType::U8, DataType::I64];
    let ops = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg];
    let mut i = 0usize;
    for (algorithm, kind) in ferrocoll_core::algorithms::applicable() {
        for n in [1u32, 3] {
            for (count, in_place) in [(0, false), (5, false), (3, true)] {
                let collective = kind.with_root(n - 1);
                if in_place && collective.in_place_alias(0).is_none() {
                    continue;
                }
                i += 1;
                let case = Case {
                    collective,
                    algorithm: Some(algorithm),
                    world_size: n,
                    count,
                    dtype: dtypes[i % dtypes.len()],
                    op: ops[i % ops.len()],
                    in_place,
                    seed: i as u64,
                };
                if let Err(e) = check_case(&CPU, &case) {
                    panic!("{e}");
                }
            }
        }
    }
    println!("{i} cases");
}

#[test]
fn point_to_point_and_a_failing_rank_are_free_of_undefined_behaviour() {
    let config = CpuConfig {
        planning: Planning {
            timeout: Duration::from_secs(600),
            max_chunk_bytes: Some(8),
            ..CpuConfig::default().planning
        },
        ..CpuConfig::default()
    };
    let results = cpu::run(2, &config, |comm| {
        let mut got = [0u32; 3];
        if comm.rank() == 0 {
            comm.send(&[7u32; 3], 1)?;
        } else {
            comm.recv(&mut got, 0)?;
        }
        comm.barrier()?;
        Ok(got)
    });
    assert_eq!(results[1].as_ref().unwrap(), &[7; 3]);
    // A rank that fails mid-group: the survivor quiesces and returns an
    // error without touching the failed rank's memory afterwards.
    let results = cpu::run(2, &config, |comm| {
        if comm.rank() == 1 {
            return Err(ferrocoll_core::comm::CommError::backend(
                "test",
                std::io::Error::other("gives up"),
            ));
        }
        let mut x = vec![1.0f32; 9];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        Ok(())
    });
    assert!(results.iter().all(Result::is_err));
}
