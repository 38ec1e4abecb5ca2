//! Gradient sync overlapped with the backward pass, DDP-style: buckets of
//! gradients are all-reduced on a progress thread as soon as backward has
//! produced them, while earlier layers are still computing.
//!
//! Backward compute is stood in by waits: the example measures the
//! communication, not a model. From one run it prints medians over
//! `STEPS` steps of:
//! - comm alone: every bucket's all-reduce, the gradients already written;
//! - backward compute: the waits and gradient writes alone, measured, into
//!   memory as large as the gradients (a reused 2 MiB slice would stay in
//!   the cache and read faster than the step's writes);
//! - blocking step: backward, then sync (no overlap);
//! - overlapped step: backward with each bucket's all-reduce started the
//!   moment its gradients are ready, then `finish()`.
//!
//! The backward compute is calibrated at run time to 1 × and then 2 × the
//! measured comm (a layer sleeps most of its share, then yields to the
//! deadline, so the share is kept to within microseconds; one correction
//! after a first measurement); backward assigns each gradient in its
//! bucket (`gradient_to_overwrite`: no zeroing pass first); overlap then
//! hides the comm except the last bucket's (1/16 of it here) and what the
//! all-reduces take from the compute's cores and memory bandwidth. The
//! goal, from issue 32: the overlapped step within 1.15 × max(compute,
//! comm) at both.
//!
//! Run on threads: `cargo run --release --example 05_overlap_gradient_sync [ranks]`
//! or one process per rank:
//! `cargo run --release -- launch -n 2 -- cargo run --release -q --example 05_overlap_gradient_sync`

use std::time::{Duration, Instant};

use ferrocoll::comm::{AsyncCommunicator, Communicator};
use ferrocoll::cpu::{self, CpuConfig};
use ferrocoll::grad_sync::GradientSync;

const LAYERS: usize = 16;
const PARAMS_PER_LAYER: usize = 512 * 1024;
const BUCKET_BYTES: usize = 2 << 20;
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
    // What backward writes for a layer: its gradient, assigned straight
    // into the bucket (`gradient_to_overwrite`), as a real backward would
    // into its buffer.
    let fill = |grad: &mut [f32], layer: usize| grad.fill((rank as usize + layer) as f32);
    let check = |sync: &GradientSync<f32, C>| {
        let want = (world - 1) as f32 / 2.0 + 3.0;
        let got = sync.gradient(3).expect("parameter 3")[0];
        assert!(
            (got - want).abs() < 1e-3,
            "averaged gradient {got}, expected {want}"
        );
    };
    // One step: `None` times the all-reduces alone (the gradients written
    // before the clock starts); otherwise backward with `layer_compute` a
    // layer, its buckets started as they fill (`overlap`) or after it.
    let step = |sync: &mut GradientSync<f32, C>, layer_compute: Option<Duration>, overlap: bool| {
        if layer_compute.is_none() {
            for layer in 0..LAYERS {
                fill(sync.gradient_to_overwrite(layer)?, layer);
            }
        }
        sync.communicator().barrier()?;
        let t = Instant::now();
        for layer in (0..LAYERS).rev() {
            if let Some(d) = layer_compute {
                compute_for(d);
                fill(sync.gradient_to_overwrite(layer)?, layer);
            }
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
        step(&mut sync, None, false)?;
    }
    let comm = median(
        (0..STEPS)
            .map(|_| step(&mut sync, None, false))
            .collect::<Result<_, _>>()?,
    );
    // What writing one layer's gradient takes, measured.
    // Backward alone writes into memory as large as the gradients (one
    // slice per layer): a single reused slice would stay in the cache and
    // make backward look faster than it is in the step.
    let mut own = vec![0.0f32; PARAMS_PER_LAYER * LAYERS];
    let own_layer = |own: &mut Vec<f32>, layer: usize| {
        let at = layer * PARAMS_PER_LAYER;
        fill(&mut own[at..at + PARAMS_PER_LAYER], layer)
    };
    for layer in 0..LAYERS {
        own_layer(&mut own, layer); // the pages' first touch, untimed
    }
    let fill_time = median(
        (0..STEPS)
            .map(|i| {
                let t = Instant::now();
                own_layer(&mut own, i % LAYERS);
                t.elapsed()
            })
            .collect(),
    );
    let mut report = format!(
        "# gradient sync overlapped with backward: {world} ranks, {LAYERS} layers x {:.1} MiB f32, buckets of {} MiB ({} buckets), medians of {STEPS} steps\n\
         # backward compute is stood in by a sleep and a yield to each layer's deadline\n\
         comm alone                 {:8.2} ms  (every bucket's all-reduce, gradients already written)\n",
        (PARAMS_PER_LAYER * 4) as f64 / (1 << 20) as f64,
        BUCKET_BYTES >> 20,
        sync.buckets().len(),
        ms(comm),
    );
    for times in [1u32, 2] {
        // Backward's gradient writes are part of its time: the waits make
        // up the rest of `times` x comm.
        let target = comm * times;
        let mut layer_compute = (target / LAYERS as u32).saturating_sub(fill_time);
        // What backward alone takes (the waits and the gradient writes,
        // into buffers of the same size), measured.
        let mut backward_alone = |layer_compute: Duration| {
            median(
                (0..STEPS)
                    .map(|_| {
                        let t = Instant::now();
                        for layer in (0..LAYERS).rev() {
                            compute_for(layer_compute);
                            own_layer(&mut own, layer);
                        }
                        t.elapsed()
                    })
                    .collect(),
            )
        };
        let mut compute = backward_alone(layer_compute);
        // One correction: a write after a wait runs slower than writes back
        // to back, so the first try falls short of the target.
        layer_compute += target.saturating_sub(compute) / LAYERS as u32;
        layer_compute =
            layer_compute.saturating_sub(compute.saturating_sub(target) / LAYERS as u32);
        compute = backward_alone(layer_compute);
        let blocking = median(
            (0..STEPS)
                .map(|_| step(&mut sync, Some(layer_compute), false))
                .collect::<Result<_, _>>()?,
        );
        let overlapped = median(
            (0..STEPS)
                .map(|_| step(&mut sync, Some(layer_compute), true))
                .collect::<Result<_, _>>()?,
        );
        let ratio = overlapped.as_secs_f64() / compute.max(comm).as_secs_f64();
        report += &format!(
            "backward = {times} x comm:\n\
             \x20 backward compute         {:8.2} ms  (measured: {:.2} x comm)\n\
             \x20 blocking step            {:8.2} ms  (compute + comm)\n\
             \x20 overlapped step          {:8.2} ms  = {ratio:.2} x max(compute, comm) (goal <= 1.15: {})\n",
            ms(compute),
            compute.as_secs_f64() / comm.as_secs_f64(),
            ms(blocking),
            ms(overlapped),
            if ratio <= 1.15 { "met" } else { "MISSED" },
        );
    }
    Ok(report)
}

/// Stand in for `d` of a layer's backward compute: sleep most of it (the
/// cores stay free for the all-reduces, as a GPU's kernels leave them),
/// then yield until the deadline, so sleep overshoot does not stretch it.
fn compute_for(d: Duration) {
    let deadline = Instant::now() + d;
    if let Some(rest) = d.checked_sub(Duration::from_micros(200)) {
        std::thread::sleep(rest);
    }
    while Instant::now() < deadline {
        std::thread::yield_now();
    }
}
