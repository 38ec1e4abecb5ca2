//! ferrocoll's own ring all-reduce on the GPU beside NCCL's, on the same
//! data: both must agree with each other, and the time of each is printed.
//!
//! Needs a GPU, NVRTC and NCCL; without them it says which is missing and
//! exits cleanly.
//!
//! ```sh
//! cargo run --release --example 04_custom_vs_nccl -- 4 67108864   # ranks, bytes
//! ```

use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferrocoll::comm::{CommError, Communicator, CommunicatorExt, Planning};
use ferrocoll::cuda::{CudaConfig, probe};
use ferrocoll::nccl::NcclConfig;
use ferrocoll::{Algorithm, ReduceOp};

/// One all-reduce of `input` into `output` on some communicator.
type AllReduce<'a> = dyn FnMut(&[f32], &mut [f32]) -> Result<(), CommError> + 'a;

fn main() {
    let mut args = std::env::args().skip(1);
    let ranks: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let bytes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64 << 20);
    if let Err(e) = probe::available() {
        println!("skipping: {e}");
        return;
    }
    if let Err(e) = ferrocoll::nccl::version() {
        println!("skipping: {e}");
        return;
    }
    let count = bytes / 4;
    let devices = vec![0usize; ranks as usize];
    let input = |rank: u32| -> Vec<f32> {
        (0..count)
            .map(|i| ((i as u32 % 97) + rank) as f32)
            .collect()
    };
    let iterations = 10;

    // The same body for both: all-reduce, timed, and the last result kept.
    let results: Mutex<Vec<(String, f64, Vec<f32>)>> = Mutex::new(Vec::new());
    let body = |name: &str, comm: &mut AllReduce<'_>, rank: u32| {
        let mine = input(rank);
        let mut out = vec![0f32; count];
        comm(&mine, &mut out)?;
        let started = Instant::now();
        for _ in 0..iterations {
            comm(&mine, &mut out)?;
        }
        let secs = started.elapsed().as_secs_f64() / iterations as f64;
        if rank == 0 {
            results.lock().unwrap().push((name.to_owned(), secs, out));
        }
        Ok(())
    };

    let cuda = CudaConfig {
        planning: Planning {
            algorithm: Some(Algorithm::Ring),
            ..CudaConfig::default().planning
        },
        ..CudaConfig::default()
    };
    let ours = ferrocoll::cuda::run(&devices, &cuda, |c| {
        let rank = c.rank();
        body(
            "ferrocoll ring",
            &mut |i, o| c.all_reduce(i, o, ReduceOp::Sum),
            rank,
        )
    });
    let nccl = NcclConfig {
        timeout: Duration::from_secs(60),
        ..NcclConfig::default()
    };
    let theirs = ferrocoll::nccl::run(&devices, &nccl, |c| {
        let rank = c.rank();
        body("NCCL", &mut |i, o| c.all_reduce(i, o, ReduceOp::Sum), rank)
    });
    for (name, r) in [
        ("ferrocoll", ours.map_err(|e| e.to_string())),
        ("NCCL", theirs.map_err(|e| e.to_string())),
    ] {
        match r {
            Ok(per_rank) => {
                if let Some(Err(e)) = per_rank.into_iter().find(Result::is_err) {
                    println!("{name}: {e}");
                }
            }
            Err(e) => println!("{name}: {e}"),
        }
    }
    let results = results.into_inner().unwrap();
    for (name, secs, _) in &results {
        let busbw = 2.0 * f64::from(ranks - 1) / f64::from(ranks) * bytes as f64 / secs / 1e9;
        println!(
            "{name:>15}: {:.1} us per all-reduce of {bytes} B on {ranks} ranks (host-staged), busbw {busbw:.1} GB/s",
            secs * 1e6
        );
    }
    if let [(_, _, a), (_, _, b)] = &results[..] {
        let same = a
            .iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-3 * x.abs().max(1.0));
        println!("results agree: {same}");
    }
}
