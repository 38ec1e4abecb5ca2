//! Gradient sync overlapped with the backward pass, DDP-style: buckets of
//! gradients are all-reduced on a progress thread as soon as backward has
//! produced them, while earlier layers are still computing.
//!
//! Backward compute is stood in by sleeps: the example measures the
//! communication, not a model. From one run it prints medians over
//! `STEPS` steps of:
//! - comm alone: every bucket's all-reduce, nothing else;
//! - backward compute: the sleeps and gradient writes alone, measured
//!   (sleeps overshoot);
//! - blocking step: backward, then sync (no overlap);
//! - overlapped step: backward with each bucket's all-reduce started the
//!   moment its gradients are ready, then `finish()`.
//!
//! The per-layer compute is calibrated at run time to 2 × the measured
//! comm (at least 2 ms a layer), so comm ≤ compute on any host; overlap
//! then hides the comm except the last bucket's, and what the all-reduces
//! take from the compute's cores and memory bandwidth.
//!
//! Run on threads: `cargo run --release --example 05_overlap_gradient_sync [ranks]`
//! or one process per rank:
//! `cargo run --release -- launch -n 2 -- cargo run --release -q --example 05_overlap_gradient_sync`

use std::time::{Duration, Instant};

use ferrocoll::comm::{AsyncCommunicator, Communicator};
use ferrocoll::cpu::{self, CpuConfig};
use ferrocoll::grad_sync::GradientSync;

const LAYERS: usize = 8;
const PARAMS_PER_LAYER: usize = 256 * 1024;
const BUCKET_BYTES: usize = 1 << 20;
const STEPS: usize = 25;

fn main() {
    ferrocoll::log::init();
    let launched = std::env::var_os("WORLD_SIZE").is_some();
    let report = if launched {
        let comm = ferrocoll::env::process_communicator_from_env(&Default::default())
            .unwrap_or_else(|e| fail(&e));
        let boxed: Box<dyn Communicator + Send> = Box::new(comm);
        let rank = boxed.rank();
        let report = run_rank(boxed).unwrap_or_else(|e| fail(&e));
        (rank == 0).then_some(report)
    } else {
        let ranks: u32 = std::env::args()
            .nth(1)
            .map(|a| {
                a.parse()
                    .unwrap_or_else(|_| fail(&"ranks must be a number"))
            })
            .unwrap_or(2);
        let comms = cpu::group(ranks, &CpuConfig::default()).unwrap_or_else(|e| fail(&e));
        let reports: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|comm| s.spawn(move || run_rank(comm)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank panicked"))
                .collect()
        });
        let mut reports = reports.into_iter();
        Some(reports.next().unwrap().unwrap_or_else(|e| fail(&e)))
    };
    if let Some(report) = report {
        print!("{report}");
    }
}

fn fail(e: &dyn std::fmt::Display) -> ! {
    eprintln!("error: {e}");
    std::process::exit(1)
}

/// The median of some durations.
fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One rank's part; returns its report.
fn run_rank<C: Communicator + Send + 'static>(comm: C) -> Result<String, Error> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let lens = vec![PARAMS_PER_LAYER; LAYERS];
    let mut sync = GradientSync::<f32, _>::new(AsyncCommunicator::new(comm)?, &lens, BUCKET_BYTES)?;
    // What backward writes for a layer: its gradient, straight into the
    // bucket (`gradient_mut`), as a real backward would into its buffer.
    let fill = |grad: &mut [f32], layer: usize| grad.fill((rank as usize + layer) as f32);
    let check = |sync: &GradientSync<f32, C>| {
        let want = (world - 1) as f32 / 2.0 + 3.0;
        let got = sync.gradient(3).expect("parameter 3")[0];
        assert!(
            (got - want).abs() < 1e-3,
            "averaged gradient {got}, expected {want}"
        );
    };
    let step = |sync: &mut GradientSync<f32, C>, layer_compute: Duration, overlap: bool| {
        sync.communicator().barrier()?;
        let t = Instant::now();
        for layer in (0..LAYERS).rev() {
            std::thread::sleep(layer_compute);
            fill(sync.gradient_mut(layer)?, layer);
            if overlap {
                sync.mark_ready_in_place(layer)?;
            }
        }
        if !overlap {
            for layer in (0..LAYERS).rev() {
                sync.mark_ready_in_place(layer)?;
            }
        }
        sync.finish()?;
        let took = t.elapsed();
        check(sync);
        Ok::<Duration, Error>(took)
    };
    for _ in 0..3 {
        step(&mut sync, Duration::ZERO, false)?;
    }
    let comm = median(
        (0..STEPS)
            .map(|_| step(&mut sync, Duration::ZERO, false))
            .collect::<Result<_, _>>()?,
    );
    // Calibrate: backward takes 2 × comm, and at least 2 ms per layer, so
    // that sleep overshoot and wake-ups stay small next to a layer.
    let layer_compute = (comm * 2 / LAYERS as u32).max(Duration::from_millis(2));
    // Sleeps overshoot; measure what backward alone really takes (the
    // sleeps and the gradient writes, into buffers of the same size).
    let mut own = vec![0.0f32; PARAMS_PER_LAYER];
    let compute = median(
        (0..STEPS)
            .map(|_| {
                let t = Instant::now();
                for layer in (0..LAYERS).rev() {
                    std::thread::sleep(layer_compute);
                    fill(&mut own, layer);
                }
                t.elapsed()
            })
            .collect(),
    );
    let blocking = median(
        (0..STEPS)
            .map(|_| step(&mut sync, layer_compute, false))
            .collect::<Result<_, _>>()?,
    );
    let overlapped = median(
        (0..STEPS)
            .map(|_| step(&mut sync, layer_compute, true))
            .collect::<Result<_, _>>()?,
    );
    let bound = compute.max(comm);
    let ratio = overlapped.as_secs_f64() / bound.as_secs_f64();
    Ok(format!(
        "# gradient sync overlapped with backward: {world} ranks, {LAYERS} layers x {:.1} MiB f32, buckets of {} MiB ({} buckets), medians of {STEPS} steps\n\
         # backward compute is stood in by sleeps ({:.2} ms per layer, calibrated to max(2 x comm, 2 ms per layer))\n\
         comm alone           {:8.2} ms\n\
         backward compute     {:8.2} ms  (sleeps + gradient writes, measured)\n\
         blocking step        {:8.2} ms  (compute + comm)\n\
         overlapped step      {:8.2} ms  = {ratio:.2} x max(compute, comm) (goal <= 1.15: {})\n",
        (PARAMS_PER_LAYER * 4) as f64 / (1 << 20) as f64,
        BUCKET_BYTES >> 20,
        sync.buckets().len(),
        ms(layer_compute),
        ms(comm),
        ms(compute),
        ms(blocking),
        ms(overlapped),
        if ratio <= 1.15 { "met" } else { "MISSED" },
    ))
}
