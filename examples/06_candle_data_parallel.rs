//! Data-parallel training of a candle-nn model on the CPU, DDP-style, and
//! a check that it matches training the same model in one process.
//!
//! Every rank builds the model (its own random initial values), and
//! `DataParallel` copies rank 0's parameters into every replica; each
//! rank then trains on its shard of a fixed data set, and after each
//! backward pass its gradients are averaged across the ranks. Averaging
//! the shards' mean-loss gradients gives the full batch's, so the
//! replicas follow exactly the path one process training on the whole
//! batch takes: rank 0 trains that reference from the same initial values
//! and compares the final parameters (exit status 1 beyond the tolerance).
//!
//! Threads as ranks: `cargo run --release --features candle-nn --example 06_candle_data_parallel [ranks]`
//! One process per rank:
//! `cargo run --release -- launch -n 2 -- cargo run --release -q --features candle-nn --example 06_candle_data_parallel`

use std::collections::HashMap;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Linear, Optimizer, SGD, VarBuilder, VarMap, linear, loss::mse};
use ferrocoll::candle::{CandleError, DataParallel};
use ferrocoll::comm::Communicator;
use ferrocoll::cpu::{self, CpuConfig};

const SAMPLES: usize = 240;
const INPUTS: usize = 8;
const HIDDEN: usize = 16;
const STEPS: usize = 60;
const LEARNING_RATE: f64 = 0.05;
/// Largest parameter difference from the single-process run: the two
/// differ only in the order floating-point sums are taken.
const TOLERANCE: f32 = 1e-4;

/// A two-layer perceptron.
struct Mlp {
    hidden: Linear,
    out: Linear,
}

impl Mlp {
    fn new(vb: VarBuilder) -> candle_core::Result<Mlp> {
        Ok(Mlp {
            hidden: linear(INPUTS, HIDDEN, vb.pp("hidden"))?,
            out: linear(HIDDEN, 1, vb.pp("out"))?,
        })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.out.forward(&self.hidden.forward(x)?.relu()?)
    }
}

/// A fixed regression set: y = sin(Σ wᵢ·xᵢ), inputs from a seeded
/// generator, the same in every process.
fn data() -> candle_core::Result<(Tensor, Tensor)> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let x: Vec<f32> = (0..SAMPLES * INPUTS).map(|_| next()).collect();
    let y: Vec<f32> = x
        .chunks(INPUTS)
        .map(|row| {
            row.iter()
                .enumerate()
                .map(|(i, v)| v * (i as f32 - 3.5) / 4.0)
                .sum::<f32>()
                .sin()
        })
        .collect();
    let dev = Device::Cpu;
    Ok((
        Tensor::from_vec(x, (SAMPLES, INPUTS), &dev)?,
        Tensor::from_vec(y, (SAMPLES, 1), &dev)?,
    ))
}

/// Parameter values by name, copied out.
fn snapshot(vars: &VarMap) -> candle_core::Result<HashMap<String, Tensor>> {
    let data = vars.data().lock().expect("the VarMap's lock");
    data.iter()
        .map(|(k, v)| Ok((k.clone(), v.as_tensor().copy()?)))
        .collect()
}

/// What a rank ends with.
struct Trained {
    initial: HashMap<String, Tensor>,
    last: HashMap<String, Tensor>,
    losses: (f32, f32),
}

/// Train this rank's replica on its shard.
fn train_rank<C: Communicator + Send + 'static>(comm: C) -> Result<Trained, CandleError> {
    let (rank, ranks) = (comm.rank() as usize, comm.world_size() as usize);
    let vars = VarMap::new();
    let model = Mlp::new(VarBuilder::from_varmap(&vars, DType::F32, &Device::Cpu))?;
    let mut dp = DataParallel::<f32, C>::from_var_map(comm, &vars, 1 << 12)?;
    let initial = snapshot(&vars)?;
    let (x, y) = data()?;
    let shard = SAMPLES / ranks;
    let (x, y) = (
        x.narrow(0, rank * shard, shard)?,
        y.narrow(0, rank * shard, shard)?,
    );
    let mut sgd = SGD::new(dp.vars().to_vec(), LEARNING_RATE)?;
    let mut losses = Vec::with_capacity(STEPS);
    for _ in 0..STEPS {
        let loss = mse(&model.forward(&x)?, &y)?;
        let mut grads = loss.backward()?;
        dp.sync(&mut grads)?;
        sgd.step(&grads)?;
        let global = loss.copy()?;
        dp.average(&global)?;
        losses.push(global.to_scalar::<f32>()?);
    }
    Ok(Trained {
        initial,
        last: snapshot(&vars)?,
        losses: (losses[0], losses[STEPS - 1]),
    })
}

/// One process on the whole batch, from `initial`.
fn train_alone(initial: &HashMap<String, Tensor>) -> candle_core::Result<HashMap<String, Tensor>> {
    let mut vars = VarMap::new();
    let model = Mlp::new(VarBuilder::from_varmap(&vars, DType::F32, &Device::Cpu))?;
    for (name, value) in initial {
        vars.set_one(name, value)?;
    }
    let (x, y) = data()?;
    let mut sgd = SGD::new(vars.all_vars(), LEARNING_RATE)?;
    for _ in 0..STEPS {
        let loss = mse(&model.forward(&x)?, &y)?;
        sgd.backward_step(&loss)?;
    }
    snapshot(&vars)
}

fn largest_difference(
    a: &HashMap<String, Tensor>,
    b: &HashMap<String, Tensor>,
) -> candle_core::Result<f32> {
    let mut worst = 0f32;
    for (name, t) in a {
        let d = (t - &b[name])?.abs()?.max_all()?.to_scalar::<f32>()?;
        worst = worst.max(d);
    }
    Ok(worst)
}

fn main() {
    ferrocoll::log::init();
    let (trained, ranks) = if ferrocoll::env::launched() {
        let comm = ferrocoll::env::process_communicator_from_env(&Default::default())
            .unwrap_or_else(|e| fail(&e));
        let (rank, ranks) = (comm.rank(), comm.world_size());
        let trained = train_rank(comm).unwrap_or_else(|e| fail(&e));
        if rank != 0 {
            return;
        }
        (trained, ranks)
    } else {
        let ranks: u32 = std::env::args()
            .nth(1)
            .map(|a| {
                a.parse()
                    .unwrap_or_else(|_| fail(&"ranks must be a number"))
            })
            .unwrap_or(2);
        let comms = cpu::group(ranks, &CpuConfig::default()).unwrap_or_else(|e| fail(&e));
        let mut results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|c| s.spawn(move || train_rank(c)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank panicked"))
                .collect()
        });
        (results.remove(0).unwrap_or_else(|e| fail(&e)), ranks)
    };
    if SAMPLES % ranks as usize != 0 {
        fail(&format!(
            "{SAMPLES} samples do not split over {ranks} ranks"
        ));
    }
    let alone = train_alone(&trained.initial).unwrap_or_else(|e| fail(&e));
    let diff = largest_difference(&trained.last, &alone).unwrap_or_else(|e| fail(&e));
    println!(
        "candle MLP, {ranks} ranks data-parallel, {STEPS} SGD steps: loss {:.4} -> {:.4}",
        trained.losses.0, trained.losses.1
    );
    println!(
        "largest parameter difference from one process on the whole batch: {diff:.2e} (tolerance {TOLERANCE:.0e})"
    );
    // NaN fails both.
    let matches = diff <= TOLERANCE && trained.losses.1 < trained.losses.0;
    if !matches {
        fail(&"data-parallel training does not match single-process training");
    }
}

fn fail(e: &dyn std::fmt::Display) -> ! {
    eprintln!("error: {e}");
    std::process::exit(1)
}
