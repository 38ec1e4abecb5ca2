//! Data-parallel training of a small MLP on synthetic data: each of N
//! ranks computes gradients on its shard of the global batch, ferrocoll
//! averages them (bucketed, like DDP), and every rank applies the same
//! update. The result must match training on the whole batch in one
//! process — the example trains both and compares.
//!
//! Run: `cargo run --release --example 02_data_parallel_training [ranks]`

use ferrocoll::ReduceOp;
use ferrocoll::comm::{Communicator, CommunicatorExt};
use ferrocoll::cpu::{self, CpuConfig};
use ferrocoll::grad_sync::Bucketer;

const FEATURES: usize = 16;
const HIDDEN: usize = 32;
const SAMPLES: usize = 4096;
const STEPS: usize = 200;
const LEARNING_RATE: f64 = 1.0;

/// A 2-layer perceptron: x → tanh(W1·x + b1) → sigmoid(w2·h + b2).
#[derive(Clone)]
struct Mlp {
    w1: Vec<f64>,
    b1: Vec<f64>,
    w2: Vec<f64>,
    b2: Vec<f64>,
}

impl Mlp {
    fn new() -> Self {
        let mut seed = 42u64;
        let mut rand = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.5
        };
        Mlp {
            w1: (0..FEATURES * HIDDEN).map(|_| rand()).collect(),
            b1: vec![0.0; HIDDEN],
            w2: (0..HIDDEN).map(|_| rand()).collect(),
            b2: vec![0.0],
        }
    }

    fn tensors(&mut self) -> [&mut [f64]; 4] {
        [&mut self.w1, &mut self.b1, &mut self.w2, &mut self.b2]
    }

    /// Mean binary cross-entropy over `data` and its gradient, scaled by
    /// `data.len() / scale_to` so shard gradients average to the full one.
    fn loss_and_grad(&self, data: &[(Vec<f64>, f64)], scale_to: usize) -> (f64, Mlp) {
        let mut g = Mlp {
            w1: vec![0.0; FEATURES * HIDDEN],
            b1: vec![0.0; HIDDEN],
            w2: vec![0.0; HIDDEN],
            b2: vec![0.0],
        };
        let mut loss = 0.0;
        let norm = 1.0 / scale_to as f64;
        for (x, y) in data {
            let h: Vec<f64> = (0..HIDDEN)
                .map(|j| {
                    (self.b1[j]
                        + (0..FEATURES)
                            .map(|i| self.w1[j * FEATURES + i] * x[i])
                            .sum::<f64>())
                    .tanh()
                })
                .collect();
            let z = self.b2[0] + h.iter().zip(&self.w2).map(|(a, b)| a * b).sum::<f64>();
            let p = 1.0 / (1.0 + (-z).exp());
            loss -= norm * (y * p.max(1e-12).ln() + (1.0 - y) * (1.0 - p).max(1e-12).ln());
            let dz = norm * (p - y);
            g.b2[0] += dz;
            for (j, &hj) in h.iter().enumerate() {
                g.w2[j] += dz * hj;
                let dh = dz * self.w2[j] * (1.0 - hj * hj);
                g.b1[j] += dh;
                for (gw, xi) in g.w1[j * FEATURES..(j + 1) * FEATURES].iter_mut().zip(x) {
                    *gw += dh * xi;
                }
            }
        }
        (loss, g)
    }

    fn step(&mut self, grad: &mut Mlp) {
        for (p, g) in self.tensors().into_iter().zip(grad.tensors()) {
            for (a, b) in p.iter_mut().zip(g.iter()) {
                *a -= LEARNING_RATE * b;
            }
        }
    }
}

/// Class 1 on one side of a fixed tilted plane, with a curved margin.
fn dataset() -> Vec<(Vec<f64>, f64)> {
    let mut seed = 7u64;
    let mut rand = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    (0..SAMPLES)
        .map(|_| {
            let x: Vec<f64> = (0..FEATURES).map(|_| rand()).collect();
            let side: f64 = x
                .iter()
                .enumerate()
                .map(|(i, v)| v * (i as f64 - 7.5))
                .sum::<f64>()
                + x[0] * x[1] * 4.0;
            (x, if side > 0.0 { 1.0 } else { 0.0 })
        })
        .collect()
}

fn main() {
    let ranks: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4);
    let data = dataset();

    // Reference: one process, the whole batch every step.
    let mut single = Mlp::new();
    let mut single_losses = Vec::new();
    for _ in 0..STEPS {
        let (loss, mut g) = single.loss_and_grad(&data, SAMPLES);
        single_losses.push(loss);
        single.step(&mut g);
    }

    // Data parallel: rank r trains on every ranks-th sample; gradients are
    // summed (each shard's is already scaled by 1/SAMPLES) across ranks.
    let results = cpu::run(ranks, &CpuConfig::default(), |comm| {
        let shard: Vec<(Vec<f64>, f64)> = data
            .iter()
            .skip(comm.rank() as usize)
            .step_by(comm.world_size() as usize)
            .cloned()
            .collect();
        let mut model = Mlp::new();
        let mut bucketer = Bucketer::new(4 << 10);
        let mut losses = Vec::new();
        for _ in 0..STEPS {
            let (loss, mut g) = model.loss_and_grad(&shard, SAMPLES);
            let mut total = [loss];
            comm.all_reduce_in_place(&mut total, ReduceOp::Sum)?;
            losses.push(total[0]);
            bucketer.all_reduce(comm, &mut g.tensors(), ReduceOp::Sum)?;
            model.step(&mut g);
        }
        Ok(losses)
    });
    let losses = match results.into_iter().next() {
        Some(Ok(l)) => l,
        Some(Err(e)) => panic!("training failed: {e}"),
        None => unreachable!("at least one rank"),
    };

    println!("step   loss ({ranks} ranks)   loss (1 rank)");
    for step in (0..STEPS).step_by(20).chain([STEPS - 1]) {
        println!(
            "{step:>4}   {:>16.6}   {:>13.6}",
            losses[step], single_losses[step]
        );
    }
    let (a, b) = (losses[STEPS - 1], single_losses[STEPS - 1]);
    let diff = (a - b).abs();
    println!("final loss: data-parallel {a:.9}, single rank {b:.9}, |difference| {diff:.2e}");
    assert!(
        diff < 1e-9,
        "data-parallel training diverged from the single-rank run"
    );
    println!("match: the data-parallel run equals single-rank training within 1e-9");
}
