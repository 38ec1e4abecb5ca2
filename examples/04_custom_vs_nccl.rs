//! ferrocoll's own ring all-reduce on the GPU beside NCCL's, timed the way
//! `ferrocoll bench` and nccl-tests time them: one rank per GPU, buffers
//! in device memory, calls enqueued back to back on each rank's stream
//! through the stream-ordered device API, and CUDA events between them.
//! Both results must agree.
//!
//! Needs one GPU per rank, and NCCL; without them it says what is missing
//! and exits cleanly.
//!
//! ```sh
//! cargo run --release --example 04_custom_vs_nccl -- 2 67108864   # ranks (default: every GPU), bytes
//! ```

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use cudarc::driver::{CudaEvent, CudaStream, sys};
use ferrocoll::comm::{CommError, Planning};
use ferrocoll::cuda::{CudaConfig, probe};
use ferrocoll::device::DeviceCommunicator;
use ferrocoll::nccl::NcclConfig;
use ferrocoll::{Algorithm, ReduceOp};

/// Timed calls per implementation, after one untimed.
const ITERATIONS: usize = 20;

/// What rank 0 keeps of one implementation: its name, the median call
/// time in seconds, and the result.
type Outcome = (String, f64, Vec<f32>);

fn main() {
    let mut args = std::env::args().skip(1);
    let gpus = match probe::available() {
        Ok(n) => n,
        Err(e) => {
            println!("skipping: {e}");
            return;
        }
    };
    if let Err(e) = ferrocoll::nccl::version() {
        println!("skipping: {e}");
        return;
    }
    let ranks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(gpus);
    let bytes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64 << 20);
    if ranks == 0 || ranks > gpus {
        println!("skipping: this example runs one rank per GPU; {ranks} asked, {gpus} present");
        return;
    }
    let devices: Vec<usize> = (0..ranks).collect();
    let count = bytes / 4;
    let results: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    let keep = |name: &str, rank: u32, timed: Result<(f64, Vec<f32>), CommError>| {
        let (secs, out) = timed?;
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
        let (rank, stream) = (c.rank(), c.stream().clone());
        keep("ferrocoll ring", rank, time_all_reduce(c, &stream, count))
    });
    let nccl = NcclConfig {
        timeout: Duration::from_secs(60),
        ..NcclConfig::default()
    };
    let theirs = ferrocoll::nccl::run(&devices, &nccl, |c| {
        let (rank, stream) = (DeviceCommunicator::rank(c), c.stream().clone());
        keep("NCCL", rank, time_all_reduce(c, &stream, count))
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
    report(&results.into_inner().unwrap(), ranks, count * 4);
}

/// Rank `rank`'s input: the same pattern on every run, different per rank.
fn input(rank: u32, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| ((i as u32 % 97) + rank) as f32)
        .collect()
}

/// One untimed all-reduce, then [`ITERATIONS`] enqueued back to back on
/// `stream` with an event between each two; one wait at the end. Returns
/// the median call as the device ran it, and the last result.
fn time_all_reduce<C>(
    comm: &mut C,
    stream: &Arc<CudaStream>,
    count: usize,
) -> Result<(f64, Vec<f32>), CommError>
where
    C: DeviceCommunicator,
    CommError: From<C::Error>,
{
    let driver = |e: cudarc::driver::DriverError| CommError::backend("cuda", e);
    let host = input(comm.rank(), count);
    let input = stream.clone_htod(&host).map_err(driver)?;
    let mut output = stream.alloc_zeros::<f32>(count.max(1)).map_err(driver)?;
    let mut output = output.slice_mut(..count);
    comm.all_reduce(&input, &mut output, ReduceOp::Sum, stream)?;
    comm.synchronize(stream)?;
    let events = (0..=ITERATIONS)
        .map(|_| {
            stream
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        })
        .collect::<Result<Vec<CudaEvent>, _>>()
        .map_err(driver)?;
    events[0].record(stream).map_err(driver)?;
    for e in &events[1..] {
        comm.all_reduce(&input, &mut output, ReduceOp::Sum, stream)?;
        e.record(stream).map_err(driver)?;
    }
    comm.synchronize(stream)?;
    let mut ms = events
        .windows(2)
        .map(|w| w[0].elapsed_ms(&w[1]).map(f64::from))
        .collect::<Result<Vec<f64>, _>>()
        .map_err(driver)?;
    ms.sort_by(f64::total_cmp);
    let result = stream.clone_dtoh(&output).map_err(driver)?;
    Ok((ms[ms.len() / 2] / 1e3, result))
}

/// Each implementation's median time and bus bandwidth, and whether the
/// two results agree.
fn report(results: &[Outcome], ranks: usize, bytes: usize) {
    let n = ranks as f64;
    for (name, secs, _) in results {
        let busbw = 2.0 * (n - 1.0) / n * bytes as f64 / secs / 1e9;
        println!(
            "{name:>15}: {:.1} us per all-reduce of {bytes} B on {ranks} GPU(s) (median of {ITERATIONS}, CUDA events), busbw {busbw:.1} GB/s",
            secs * 1e6
        );
    }
    if let [(_, _, a), (_, _, b)] = results {
        let same = a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= 1e-3 * x.abs().max(1.0));
        println!("results agree: {same}");
    }
}
