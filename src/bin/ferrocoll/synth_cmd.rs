//! `ferrocoll synth`: rings and spanning trees packed into the topology in
//! hand (or the devices `--gpus` keeps), and the hierarchical all-reduce
//! across its machines, written as a schedule file — proven before it is
//! written, simulated, and set against the members' throughput bound.
//! `auto` considers the same schedules (`ferrocoll_topo::select`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use ferrocoll::algorithms::{forest, hierarchical};
use ferrocoll::plan::Compiler;
use ferrocoll::topo::graph::{NodeId, Topology};
use ferrocoll::topo::search;
use ferrocoll::topo::sim::{self, CostModel, SimOptions};
use ferrocoll::{
    Algorithm, AlgorithmParams, Collective, CollectiveKind, Rank, VerifyOptions, generate, verify,
};

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
    /// `sim --algo` and `ProcessConfig::planning.schedule`; MSCCL's
    /// algorithm XML when the name ends in `.xml`).
    /// (`-o`, its old short form, still works: elsewhere `-o` is the
    /// reduction op, as in nccl-tests.)
    #[arg(long, short_alias = 'o')]
    output: PathBuf,
    /// Call size the report simulates.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: usize,
    /// What to synthesize: rings, spanning trees (all-gather,
    /// reduce-scatter, all-reduce), the hierarchical all-reduce (several
    /// machines), or all that apply, writing the fastest.
    #[arg(long, value_enum, default_value_t = Kind::Best)]
    kind: Kind,
}

/// What `synth` packs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// Directed rings.
    Rings,
    /// Weighted spanning trees, one set per member.
    Trees,
    /// All-reduce across machines: reduce-scatter inside each, all-reduce
    /// along the rails, all-gather inside each.
    Hierarchical,
    /// All that apply; the one the simulator finds fastest is written.
    Best,
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
    if args.size == 0 {
        return Err("--size must be more than 0: candidates are compared at that size".into());
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
    let cost = CostModel::default();
    let collective = args.op.with_root(args.root % n);
    let busy = crate::busy::Busy::spinner("synthesizing and simulating candidates");
    let mut candidates = Vec::new();
    if matches!(args.kind, Kind::Rings | Kind::Best) {
        candidates.push(ring_candidate(&t, &devices, &cost, collective)?);
    }
    if matches!(args.kind, Kind::Hierarchical | Kind::Best) {
        let found = best_hierarchical(&t, &devices, &cost, collective, args.size);
        candidates.extend(of_kind(args.kind, Kind::Hierarchical, found, || {
            format!(
                "hierarchical {}: it runs all-reduce on devices spread evenly over several machines",
                args.op
            )
        })?);
    }
    if matches!(args.kind, Kind::Trees | Kind::Best) {
        let found = best_trees(&t, &devices, &cost, collective, args.size);
        candidates.extend(of_kind(args.kind, Kind::Trees, found, || {
            format!(
                "tree packing for {}: trees run all-gather, reduce-scatter and all-reduce",
                args.op
            )
        })?);
    }
    drop(busy);
    println!("# ferrocoll synth: {} ({})", t.name, t.description);
    let ceiling = bound::report(&full, gpus)?;
    let mut best: Option<(f64, ferrocoll::Verified)> = None;
    for c in candidates {
        let busbw = match c.busbw {
            Some(b) => b,
            None => simulated(&c.verified, &t, args.size)?,
        };
        let of = ceiling
            .as_ref()
            .map_or(String::new(), |b| b.fraction(args.op, busbw));
        println!("# {}", c.summary);
        for line in &c.detail {
            println!("#   {line}");
        }
        println!(
            "#   {collective} of {} B, predicted: busbw {busbw:.1} GB/s{of}",
            args.size
        );
        if best.as_ref().is_none_or(|b| busbw > b.0) {
            best = Some((busbw, c.verified));
        }
    }
    let (busbw, verified) = best.ok_or("nothing to synthesize")?;
    let xml = ferrocoll::schedule::msccl::is_msccl_path(&args.output);
    let text = if xml {
        verified
            .schedule()
            .to_msccl_xml()
            .map_err(|e| format!("{e} (write JSON instead: a `-o` path not ending in .xml)"))?
    } else {
        verified.schedule().to_json()
    };
    std::fs::write(&args.output, text)
        .map_err(|err| format!("{}: {err}", args.output.display()))?;
    println!(
        "# wrote {} ({busbw:.1} GB/s predicted), proven, to {}",
        verified.schedule().name,
        args.output.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The candidate of `kind`, as `asked` wants it: a kind asked for by name
/// must apply (its error, or "no {why}", is the answer); under `best` a
/// kind that fails is left out with a note and one that does not apply is
/// skipped.
fn of_kind(
    asked: Kind,
    kind: Kind,
    found: Result<Option<Candidate>, String>,
    why: impl FnOnce() -> String,
) -> Result<Option<Candidate>, String> {
    match found {
        Err(e) if asked == Kind::Best => {
            eprintln!("note: left out: {e}");
            Ok(None)
        }
        Ok(None) if asked == kind => Err(format!("no {}", why())),
        other => other,
    }
}

/// A synthesized schedule, proven, with what to print about it.
struct Candidate {
    verified: ferrocoll::Verified,
    summary: String,
    detail: Vec<String>,
    /// Its simulated busbw at the call size, once known.
    busbw: Option<f64>,
}

/// `verified`'s simulated busbw on `t` for a call of `size` bytes.
fn simulated(verified: &ferrocoll::Verified, t: &Topology, size: usize) -> Result<f64, String> {
    let compiler = Compiler::new(Arc::new(verified.clone()));
    Ok(sim::simulate(&compiler, t, size, &SimOptions::default())
        .map_err(|e| e.to_string())?
        .busbw)
}

/// Rings packed into the topology.
fn ring_candidate(
    t: &Topology,
    devices: &[NodeId],
    cost: &CostModel,
    collective: Collective,
) -> Result<Candidate, String> {
    let n = devices.len() as u32;
    let rings = search::rings(t, devices, cost, search::MAX_RINGS).map_err(|e| e.to_string())?;
    let params = AlgorithmParams {
        channels: rings.orders.len() as u32,
        ring_orders: rings.orders.clone(),
        ..AlgorithmParams::default()
    };
    let mut schedule =
        generate(Algorithm::Ring, collective, n, &params).map_err(|e| e.to_string())?;
    schedule.name = format!("synth-rings-{}x{}", t.name, rings.orders.len());
    let verified = verify(schedule, &VerifyOptions::default()).map_err(|e| e.to_string())?;
    let name = |r: Rank| t.nodes[devices[r as usize]].name.as_str();
    let detail = rings
        .orders
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let names: Vec<&str> = o.iter().map(|&r| name(r)).collect();
            format!("ring {i}: {}", names.join(" -> "))
        })
        .collect();
    Ok(Candidate {
        verified,
        summary: format!(
            "rings: {} packed, {:.1} GB/s together",
            rings.orders.len(),
            rings.bandwidth
        ),
        detail,
        busbw: None,
    })
}

/// Tree packings simulated at the call size: the fastest of the few the
/// load model rates best (it cannot see fair sharing hold trees back).
fn best_trees(
    t: &Topology,
    devices: &[NodeId],
    cost: &CostModel,
    collective: Collective,
    size: usize,
) -> Result<Option<Candidate>, String> {
    let e = |e: ferrocoll::topo::TopologyError| e.to_string();
    let started = std::time::Instant::now();
    let packings = search::tree_packings(t, devices, cost, collective.kind()).map_err(e)?;
    let packing_secs = started.elapsed().as_secs_f64();
    let mut best: Option<(f64, Candidate)> = None;
    // Simulating a large group's packing takes long: fewer candidates.
    let take = if devices.len() > 16 {
        1
    } else {
        TREE_CANDIDATES
    };
    let tried = packings.len().min(take);
    for p in packings.into_iter().take(take) {
        let c = tree_candidate(t, collective, p)?;
        let busbw = simulated(&c.verified, t, size)?;
        if best.as_ref().is_none_or(|b| busbw > b.0) {
            best = Some((busbw, c));
        }
    }
    Ok(best.map(|(busbw, mut c)| {
        c.summary.push_str(&format!(
            "; packed in {packing_secs:.2} s, the fastest of {tried} simulated"
        ));
        c.busbw = Some(busbw);
        c
    }))
}

/// The hierarchical all-reduce on the machines the devices sit in, at the
/// channel count the simulator finds fastest.
fn best_hierarchical(
    t: &Topology,
    devices: &[NodeId],
    cost: &CostModel,
    collective: Collective,
    size: usize,
) -> Result<Option<Candidate>, String> {
    if collective != Collective::AllReduce {
        return Ok(None);
    }
    let Some(h) = search::hierarchy(t, devices, cost).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let n = devices.len() as u32;
    let mut best: Option<(f64, ferrocoll::Verified, u32)> = None;
    for channels in [1, 2, 4, 8] {
        let mut schedule =
            hierarchical::schedule(collective, n, &h, channels).map_err(|e| e.to_string())?;
        schedule.name = format!("synth-hierarchical-{}x{channels}", t.name);
        let verified = verify(schedule, &VerifyOptions::default()).map_err(|e| e.to_string())?;
        let busbw = simulated(&verified, t, size)?;
        if best.as_ref().is_none_or(|b| busbw > b.0) {
            best = Some((busbw, verified, channels));
        }
    }
    let name = |r: Rank| t.nodes[devices[r as usize]].name.as_str();
    Ok(best.map(|(busbw, verified, channels)| Candidate {
        verified,
        summary: format!(
            "hierarchical: {} machines of {}, {channels} channel(s) of three phases, the fastest of 1, 2, 4, 8",
            h.nodes.len(),
            h.nodes[0].len()
        ),
        detail: h
            .nodes
            .iter()
            .enumerate()
            .map(|(m, node)| {
                let names: Vec<&str> = node.iter().map(|&r| name(r)).collect();
                format!("machine {m} ring (rail = position): {}", names.join(" -> "))
            })
            .collect(),
        busbw: Some(busbw),
    }))
}

/// Tree packings simulated per `synth` run, the load model's best first.
const TREE_CANDIDATES: usize = 6;

/// Spanning trees packed into the topology.
fn tree_candidate(
    t: &Topology,
    collective: Collective,
    p: search::TreePacking,
) -> Result<Candidate, String> {
    let n = t.devices().len() as u32;
    let mut schedule = forest::schedule(collective, n, &p.forest).map_err(|e| e.to_string())?;
    let trees = p.forest.trees.len();
    schedule.name = format!("synth-trees-{}x{trees}", t.name);
    let verified = verify(schedule, &VerifyOptions::default()).map_err(|e| e.to_string())?;
    // All-reduce runs its broadcasts on channels of their own: the file's.
    let channels = verified.schedule().ranks[0].channels.len();
    Ok(Candidate {
        verified,
        summary: format!(
            "trees: {trees} over {n} roots on {channels} channels, block in {} chunks; load model {:.1} GB/s ({:.1} before rounding to chunks)",
            p.forest.chunks_per_block, p.bandwidth, p.fractional
        ),
        detail: Vec::new(),
        busbw: None,
    })
}
