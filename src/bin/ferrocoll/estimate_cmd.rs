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
    #[arg(long, value_parser = parse_bytes)]
    grad_bytes: usize,
    /// Compute time per step, milliseconds.
    #[arg(long, default_value_t = 100.0)]
    compute_ms: f64,
}

/// `10GB`, `1.5GB`, `512MB`, `10GiB`, `4096`.
pub(crate) fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let units: [(&str, f64); 8] = [
        ("GiB", (1u64 << 30) as f64),
        ("MiB", (1u64 << 20) as f64),
        ("KiB", 1024.0),
        ("GB", 1e9),
        ("MB", 1e6),
        ("KB", 1e3),
        ("kB", 1e3),
        ("B", 1.0),
    ];
    let (number, scale) = units
        .iter()
        .find_map(|(u, k)| t.strip_suffix(u).map(|n| (n, *k)))
        .unwrap_or((t, 1.0));
    let v: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count (e.g. 10GB, 512MiB)"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("`{s}` is not a byte count"));
    }
    Ok((v * scale).round() as usize)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse_in_both_unit_systems() {
        assert_eq!(parse_bytes("10GB").unwrap(), 10_000_000_000);
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("1.5MB").unwrap(), 1_500_000);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("ten").is_err());
        assert!(parse_bytes("-1GB").is_err());
    }
}
