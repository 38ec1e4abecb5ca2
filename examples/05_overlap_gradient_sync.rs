//! Gradient sync overlapped with the backward pass, DDP-style: buckets of
//! gradients are all-reduced on a progress thread as soon as backward has
//! produced them, while earlier layers are still computing.
//!
//! Backward compute is stood in by waits: the example measures the
//! communication, not a model. From one run it prints medians over
//! `STEPS` steps of:
//! - comm alone: every bucket's all-reduce, the gradients already written;
//! - backward compute: the waits alone, with the gradient writes where the
//!   host makes them, measured, into memory as large as the gradients (a
//!   reused 2 MiB slice would stay in the cache and read faster than the
//!   step's writes);
//! - blocking step: backward, then sync (no overlap);
//! - overlapped step: backward with each bucket's all-reduce started the
//!   moment its gradients are ready, then `finish()`.
//!
//! Both steps run twice: with backward writing each layer's gradients on
//! this host's cores, as CPU training would, and with the gradients
//! written by a device, as in GPU training (stood in for by writing them
//! before the clock starts, so backward only takes time). On a host
//! without spare cores the first shows what backward's own writes take
//! from the all-reduces running beside them; the second, what the
//! overlap itself costs.
//!
//! The backward compute is calibrated at run time to 1 × and then 2 × the
//! measured comm (one correction after a first measurement). Each layer
//! sleeps to its own deadline, counted from the start of backward, as a
//! GPU's kernels run on their own clock: the cores stay free for the
//! all-reduces, and a late wake-up delays one layer's gradient, not the
//! layers after it. Backward assigns each gradient in its
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
/// Steps each median is taken over: 25, or `FERROCOLL_EXAMPLE_STEPS` (a
/// test that only wants the timeline of a few steps sets it).
static STEPS: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
    std::env::var("FERROCOLL_EXAMPLE_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(25)
});
/// Every layer's gradients, f32.
const GRADIENT_BYTES: usize = LAYERS * PARAMS_PER_LAYER * 4;

fn main() {
    ferrocoll::log::init();
    let launched = std::env::var_os("WORLD_SIZE").is_some();
    let report = if launched {
        // A shared heap a little larger than the gradients (each bucket is
        // rounded up to 64 bytes): GradientSync places its buckets there,
        // and peers read them in place instead of through the slots.
        let config = ferrocoll::process::ProcessConfig {
            shared_heap_bytes: GRADIENT_BYTES + (1 << 20),
            ..Default::default()
        };
        let comm =
            ferrocoll::env::process_communicator_from_env(&config).unwrap_or_else(|e| fail(&e));
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

/// What backward writes for a layer: its gradient, here a value the check
/// can predict. In the step it is assigned straight into the bucket
/// (`gradient_to_overwrite`), as a real backward would into its buffer.
fn fill(grad: &mut [f32], rank: u32, layer: usize) {
    grad.fill((rank as usize + layer) as f32);
}

/// Who writes the gradients during backward.
#[derive(Clone, Copy, PartialEq)]
enum Writer {
    /// This host's cores, layer by layer, as CPU training would: on a
    /// host without spare cores the writes compete with the all-reduces
    /// for cores and memory bandwidth.
    Host,
    /// A device, as in GPU training: the host's cores and memory are left
    /// to the all-reduces. Stood in for by gradients written before the
    /// step's clock starts; backward then only takes its time.
    Device,
}

impl Writer {
    fn describe(self) -> &'static str {
        match self {
            Writer::Host => "gradients written by this host's cores during backward",
            Writer::Device => {
                "gradients written by a device (here: before the clock starts), backward only takes time"
            }
        }
    }
}

/// One rank's gradient sync and the steps it times.
struct Steps<C: Communicator + Send + 'static> {
    sync: GradientSync<f32, C>,
    rank: u32,
    world: u32,
}

impl<C: Communicator + Send + 'static> Steps<C> {
    /// One step: `None` times the all-reduces alone (the gradients written
    /// before the clock starts); otherwise backward with `layer_compute` a
    /// layer and its gradients' writer, its buckets started as they fill
    /// (`overlap`) or after it.
    fn step(
        &mut self,
        backward: Option<(Duration, Writer)>,
        overlap: bool,
    ) -> Result<Duration, Error> {
        let sync = &mut self.sync;
        let host_writes = matches!(backward, Some((_, Writer::Host)));
        if !host_writes {
            for layer in 0..LAYERS {
                fill(sync.gradient_to_overwrite(layer)?, self.rank, layer);
            }
        }
        sync.communicator().barrier()?;
        let t = Instant::now();
        for (done, layer) in (0..LAYERS).rev().enumerate() {
            if let Some((d, _)) = backward {
                compute_until(t + d * (done as u32 + 1));
            }
            if host_writes {
                fill(sync.gradient_to_overwrite(layer)?, self.rank, layer);
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
        let want = (self.world - 1) as f32 / 2.0 + 3.0;
        let got = sync.gradient(3).expect("parameter 3")[0];
        assert!(
            (got - want).abs() < 1e-3,
            "averaged gradient {got}, expected {want}"
        );
        Ok(took)
    }

    /// The median of `STEPS` steps.
    fn median_step(
        &mut self,
        backward: Option<(Duration, Writer)>,
        overlap: bool,
    ) -> Result<Duration, Error> {
        let times = (0..*STEPS)
            .map(|_| self.step(backward, overlap))
            .collect::<Result<_, _>>()?;
        Ok(median(times))
    }
}

/// Backward alone, writing into memory as large as the gradients (one
/// slice per layer): a single reused slice would stay in the cache and
/// make backward look faster than it is in the step.
struct Backward {
    own: Vec<f32>,
    rank: u32,
    /// What writing one layer's gradient takes, measured once.
    write_time: Duration,
}

impl Backward {
    fn new(rank: u32) -> Backward {
        let mut backward = Backward {
            own: vec![0.0f32; PARAMS_PER_LAYER * LAYERS],
            rank,
            write_time: Duration::ZERO,
        };
        for layer in 0..LAYERS {
            backward.write(layer); // the pages' first touch, untimed
        }
        backward.write_time = median(
            (0..*STEPS)
                .map(|i| {
                    let t = Instant::now();
                    backward.write(i % LAYERS);
                    t.elapsed()
                })
                .collect(),
        );
        backward
    }

    fn write(&mut self, layer: usize) {
        let at = layer * PARAMS_PER_LAYER;
        fill(&mut self.own[at..at + PARAMS_PER_LAYER], self.rank, layer);
    }

    /// What backward alone takes with `layer_compute` of waits a layer
    /// plus, when the host writes them, the gradient writes, measured.
    fn alone(&mut self, layer_compute: Duration, writer: Writer) -> Duration {
        median(
            (0..*STEPS)
                .map(|_| {
                    let t = Instant::now();
                    for (done, layer) in (0..LAYERS).rev().enumerate() {
                        compute_until(t + layer_compute * (done as u32 + 1));
                        if writer == Writer::Host {
                            self.write(layer);
                        }
                    }
                    t.elapsed()
                })
                .collect(),
        )
    }

    /// The compute a layer that makes backward take `target`, and
    /// backward's measured time with it. A layer's gradient is written
    /// while the next layer's compute runs, so only the last write adds;
    /// one correction follows a first measurement, since a wake-up runs
    /// late and a write after a wait runs slower than writes back to back.
    fn calibrate(&mut self, target: Duration, writer: Writer) -> (Duration, Duration) {
        let layers = LAYERS as u32;
        let last_write = match writer {
            Writer::Host => self.write_time,
            Writer::Device => Duration::ZERO,
        };
        let mut layer_compute = target.saturating_sub(last_write) / layers;
        let first = self.alone(layer_compute, writer);
        layer_compute += target.saturating_sub(first) / layers;
        layer_compute = layer_compute.saturating_sub(first.saturating_sub(target) / layers);
        (layer_compute, self.alone(layer_compute, writer))
    }
}

/// One rank's part; returns its report.
fn run_rank<C: Communicator + Send + 'static>(comm: C) -> Result<String, Error> {
    precise_sleeps(); // this thread runs backward
    let (rank, world) = (comm.rank(), comm.world_size());
    let lens = vec![PARAMS_PER_LAYER; LAYERS];
    let sync = GradientSync::<f32, _>::new(AsyncCommunicator::new(comm)?, &lens, BUCKET_BYTES)?;
    let mut steps = Steps { sync, rank, world };
    for _ in 0..3 {
        steps.step(None, false)?;
    }
    let comm = steps.median_step(None, false)?;
    let mut backward = Backward::new(rank);
    let mut report = format!(
        "# gradient sync overlapped with backward: {world} ranks, {LAYERS} layers x {:.1} MiB f32, buckets of {} MiB ({} buckets, {} in memory the communicator lent), medians of {} steps\n\
         # backward compute is stood in by a sleep to each layer's deadline, counted from the start of backward\n\
         comm alone                 {:8.2} ms  (every bucket's all-reduce, gradients already written)\n",
        (PARAMS_PER_LAYER * 4) as f64 / (1 << 20) as f64,
        BUCKET_BYTES >> 20,
        steps.sync.buckets().len(),
        steps.sync.lent_buckets(),
        *STEPS,
        ms(comm),
    );
    for writer in [Writer::Host, Writer::Device] {
        report += &format!("# {}\n", writer.describe());
        for times in [1u32, 2] {
            let (layer_compute, compute) = backward.calibrate(comm * times, writer);
            let stand_in = Some((layer_compute, writer));
            let blocking = steps.median_step(stand_in, false)?;
            let overlapped = steps.median_step(stand_in, true)?;
            report += &overlap_lines(times, compute, comm, blocking, overlapped);
        }
    }
    Ok(report)
}

/// The report of one backward: its time, the blocking step and the
/// overlapped one against max(compute, comm).
fn overlap_lines(
    times: u32,
    compute: Duration,
    comm: Duration,
    blocking: Duration,
    overlapped: Duration,
) -> String {
    let ratio = overlapped.as_secs_f64() / compute.max(comm).as_secs_f64();
    format!(
        "backward = {times} x comm:\n\
         \x20 backward compute         {:8.2} ms  (measured: {:.2} x comm)\n\
         \x20 blocking step            {:8.2} ms  (compute + comm)\n\
         \x20 overlapped step          {:8.2} ms  = {ratio:.2} x max(compute, comm) (goal <= 1.15: {})\n",
        ms(compute),
        compute.as_secs_f64() / comm.as_secs_f64(),
        ms(blocking),
        ms(overlapped),
        if ratio <= 1.15 { "met" } else { "MISSED" },
    )
}

/// Stand in for a layer's backward compute until `deadline`: sleep, so the
/// cores stay free for the all-reduces, as a GPU's kernels leave them.
fn compute_until(deadline: Instant) {
    while let Some(rest) = deadline.checked_duration_since(Instant::now()) {
        std::thread::sleep(rest);
    }
}

/// Cut this thread's timer slack (50 us by default) to 1 us: a sleep of a
/// few hundred microseconds then wakes within a few of its end.
#[cfg(target_os = "linux")]
fn precise_sleeps() {
    let slack_ns: libc::c_ulong = 1000;
    // SAFETY: PR_SET_TIMERSLACK takes a value and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, slack_ns) };
}

#[cfg(not(target_os = "linux"))]
fn precise_sleeps() {}
