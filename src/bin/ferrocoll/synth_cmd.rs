//! `ferrocoll synth`: rings packed into the topology in hand (or the
//! devices `--gpus` keeps), written as a schedule file — proven before it
//! is written, simulated, and set against the members' throughput bound.
//! `auto` runs the same packing for the ring candidates of this topology.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use ferrocoll::plan::Compiler;
use ferrocoll::topo::search;
use ferrocoll::topo::sim::{self, CostModel, SimOptions};
use ferrocoll::{Algorithm, AlgorithmParams, CollectiveKind, VerifyOptions, generate, verify};

use crate::spec::parse_size;
use crate::topo::bound::{self, Gpus};
use crate::topo::source;

#[derive(Args, Debug)]
pub(crate) struct SynthArgs {
    /// Topology: a preset, `discover`, or a file (.json ours, .xml NCCL,
    /// else `nvidia-smi topo -m` text).
    #[arg(long, default_value = "host")]
    topo: String,
    /// Only these devices of the topology (e.g. `0-5` or `0,1,4`).
    #[arg(long, value_parser = bound::parse_gpus)]
    gpus: Option<Gpus>,
    /// The collective: all-reduce, all-gather, reduce-scatter, broadcast
    /// or reduce (rings serve those).
    #[arg(long, default_value = "all-reduce")]
    op: CollectiveKind,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long, default_value_t = 0)]
    root: u32,
    /// Where to write the schedule (JSON, loadable by `bench --algo`,
    /// `sim --algo` and `ProcessConfig::schedule`).
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Call size the report simulates.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: usize,
}

pub(crate) fn run(args: &SynthArgs) -> Result<ExitCode, String> {
    use CollectiveKind::*;
    if !matches!(
        args.op,
        AllReduce | AllGather | ReduceScatter | Broadcast | Reduce
    ) {
        return Err(format!(
            "rings cannot run {}: synthesize all-reduce, all-gather, reduce-scatter, broadcast or reduce",
            args.op
        ));
    }
    let full = source::load(&args.topo, source::DEFAULT_HOST_RANKS)?;
    let gpus = Gpus::of(&args.gpus);
    let t = bound::members_of(&full, gpus)?;
    let devices = t.devices();
    let n = devices.len() as u32;
    if n < 2 {
        return Err(format!(
            "`{}` has {n} device: nothing to synthesize",
            t.name
        ));
    }
    let e = |e: ferrocoll::topo::TopologyError| e.to_string();
    let cost = CostModel::default();
    let rings = search::rings(&t, &devices, &cost, search::MAX_RINGS).map_err(e)?;
    let params = AlgorithmParams {
        channels: rings.orders.len() as u32,
        ring_orders: rings.orders.clone(),
        ..AlgorithmParams::default()
    };
    let collective = args.op.with_root(args.root % n);
    let mut schedule =
        generate(Algorithm::Ring, collective, n, &params).map_err(|e| e.to_string())?;
    schedule.name = format!("synth-rings-{}x{}", t.name, rings.orders.len());
    let verified = verify(schedule, &VerifyOptions::default()).map_err(|e| e.to_string())?;
    std::fs::write(&args.output, verified.schedule().to_json())
        .map_err(|err| format!("{}: {err}", args.output.display()))?;
    println!("# ferrocoll synth: {} ({})", t.name, t.description);
    println!(
        "# {} rings (channels) packed, {:.1} GB/s together; proven and written to {}",
        rings.orders.len(),
        rings.bandwidth,
        args.output.display()
    );
    for (i, o) in rings.orders.iter().enumerate() {
        let names: Vec<&str> = o
            .iter()
            .map(|&r| t.nodes[devices[r as usize]].name.as_str())
            .collect();
        println!("#   ring {i}: {}", names.join(" -> "));
    }
    let compiler = Compiler::new(Arc::new(verified));
    let p = sim::simulate(&compiler, &t, args.size, &SimOptions::default()).map_err(e)?;
    let ceiling = bound::report(&full, gpus)?;
    let of = ceiling.map_or(String::new(), |c| c.fraction(args.op, p.busbw));
    println!(
        "# {collective} of {} B, predicted: busbw {:.1} GB/s{of}",
        args.size, p.busbw
    );
    Ok(ExitCode::SUCCESS)
}
