//! The smallest useful program: four threads, one all-reduce.
//!
//! Run: `cargo run --example 01_all_reduce`

use ferrocoll::ReduceOp;
use ferrocoll::comm::{Communicator, CommunicatorExt};
use ferrocoll::cpu::{self, CpuConfig};

fn main() {
    let results = cpu::run(4, &CpuConfig::default(), |comm| {
        // Each rank contributes its rank number + 1 in every element.
        let mine = vec![comm.rank() as f32 + 1.0; 8];
        let mut total = vec![0.0f32; 8];
        comm.all_reduce(&mine, &mut total, ReduceOp::Sum)?;
        Ok(total)
    });
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Ok(total) => println!("rank {rank}: {total:?}"), // 1+2+3+4 = 10 everywhere
            Err(e) => eprintln!("rank {rank} failed: {e}"),
        }
    }
}
