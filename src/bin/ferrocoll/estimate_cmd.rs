//! `ferrocoll estimate`: how long data-parallel gradient sync takes per
//! training step on a topology, and what share of the step it is.

use std::process::ExitCode;

use clap::Args;
use ferrocoll::Collective;
use ferrocoll::topo::select::{SelectOptions, TopologySelector};

use crate::topo::source;

#[derive(Args, Debug)]
pub(crate) struct EstimateArgs {
    /// Topology: a preset, `discover`, or a file.
    #[arg(long, default_value = "host")]
    topo: String,
    /// Ranks; default every device of the topology.
    #[arg(long)]
    ranks: Option<u32>,
    /// Gradient bytes all-reduced per step: `10GB` (1e9), `10GiB` (2^30),
    /// or a plain byte count.
    #[arg(long, value_parser = crate::spec::parse_size)]
    grad_bytes: usize,
    /// Compute time per step, milliseconds.
    #[arg(long, default_value_t = 100.0)]
    compute_ms: f64,
}

pub(crate) fn run(args: &EstimateArgs) -> Result<ExitCode, String> {
    if !(args.compute_ms.is_finite() && args.compute_ms > 0.0) {
        return Err(format!(
            "--compute-ms must be a positive number of milliseconds, not {}",
            args.compute_ms
        ));
    }
    if args.grad_bytes == 0 {
        return Err("--grad-bytes must be more than 0".into());
    }
    let topology = source::load(&args.topo, args.ranks.unwrap_or(source::DEFAULT_HOST_RANKS))?;
    let n = args.ranks.unwrap_or(topology.devices().len() as u32);
    let e = |e: ferrocoll::topo::TopologyError| e.to_string();
    let selector =
        TopologySelector::new(topology.clone(), n, SelectOptions::default()).map_err(e)?;
    let verdict = selector
        .verdict(Collective::AllReduce, args.grad_bytes)
        .map_err(e)?;
    let comm_ms = verdict.prediction.time_us / 1e3;
    let serial = args.compute_ms + comm_ms;
    let overlapped = args.compute_ms.max(comm_ms);
    println!(
        "# ferrocoll estimate: topology {} ({})",
        topology.name, topology.description
    );
    println!(
        "# gradient all-reduce of {} B ({:.2} GB) on {n} ranks, compute {:.1} ms per step",
        args.grad_bytes,
        args.grad_bytes as f64 / 1e9,
        args.compute_ms
    );
    println!("algorithm        {}", verdict.candidate);
    println!(
        "sync time        {comm_ms:.2} ms  (busbw {:.1} GB/s, algbw {:.1} GB/s)",
        verdict.prediction.busbw, verdict.prediction.algbw
    );
    if let Some(b) = verdict.prediction.bottleneck() {
        println!(
            "bottleneck       {} ({:.0}% busy)",
            b.resource,
            b.utilisation * 100.0
        );
    }
    println!(
        "step, no overlap {serial:.2} ms  -> communication {:.0}% of the step",
        100.0 * comm_ms / serial
    );
    println!(
        "step, overlapped {overlapped:.2} ms  -> GPUs wait {:.0}% of the step",
        100.0 * (overlapped - args.compute_ms) / overlapped
    );
    if let Some((c, t)) = &verdict.runner_up {
        println!("runner-up        {c}: {:.2} ms", t / 1e3);
    }
    Ok(ExitCode::SUCCESS)
}
