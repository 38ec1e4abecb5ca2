//! `ferrocoll sim`: the `bench` table, predicted on a topology, with the
//! bottleneck link of each row.

use std::process::ExitCode;

use std::sync::Arc;

use clap::Args;
use ferrocoll::plan::Compiler;
use ferrocoll::topo::select::{Candidate, SelectOptions, TopologySelector};
use ferrocoll::topo::sim::{self, Fidelity, Prediction, SimOptions};
use ferrocoll::{Algorithm, CollectiveKind, DataType, Schedule, VerifyOptions, verify};

use crate::spec::{self, AlgoSpec, parse_size, sizes};
use crate::topo::source;

#[derive(Args, Debug)]
pub(crate) struct SimArgs {
    /// Topology: a preset, `discover`, or a file (.json ours, .xml NCCL,
    /// else `nvidia-smi topo -m` text).
    #[arg(long, default_value = "host")]
    topo: String,
    /// Ranks; default every device of the topology (4 threads for `host`).
    #[arg(long)]
    ranks: Option<u32>,
    /// Collective.
    #[arg(long, default_value = "all-reduce")]
    op: CollectiveKind,
    /// `auto` (the selector's pick per size), `ring`, `tree`, `direct`,
    /// `halving-doubling`, `all` (every algorithm, with crossovers), or a
    /// schedule file.
    #[arg(long, default_value = "auto", value_parser = spec::parse_algo)]
    algo: AlgoSpec,
    /// Smallest size (bytes; K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "4K", value_parser = parse_size)]
    min_bytes: usize,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "1G", value_parser = parse_size)]
    max_bytes: usize,
    /// Multiply the size by this much each row.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    step_factor: usize,
    /// Element type (sets the element size).
    #[arg(
        short = 'd',
        long = "datatype",
        alias = "dtype",
        default_value = "float"
    )]
    dtype: DataType,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long, default_value_t = 0)]
    root: u32,
    /// An execution plan file (`ferrocoll plan --json`): simulate exactly
    /// that call, instead of a size sweep.
    #[arg(long)]
    plan: Option<std::path::PathBuf>,
    /// Only these devices of the topology (e.g. `0-5` or `0,1,4`).
    #[arg(long, value_parser = crate::topo::bound::parse_gpus)]
    gpus: Option<crate::topo::bound::Gpus>,
    /// Simulator model: `detailed` (fair shares recomputed whenever a
    /// flow starts or ends), `steady` (each flow at its steady-state
    /// share: fast at cluster scale), or `auto` (detailed while its work
    /// is small).
    #[arg(long, default_value = "auto", value_parser = parse_model)]
    model: Fidelity,
}

fn parse_model(s: &str) -> Result<Fidelity, String> {
    match s {
        "auto" => Ok(Fidelity::Auto),
        "detailed" => Ok(Fidelity::Detailed),
        "steady" => Ok(Fidelity::Steady),
        _ => Err(format!("`{s}`: expected auto, detailed or steady")),
    }
}

struct Row {
    size: usize,
    label: String,
    prediction: Prediction,
    chosen: bool,
}

pub(crate) fn run(args: &SimArgs) -> Result<ExitCode, String> {
    if args.min_bytes > args.max_bytes || args.step_factor < 2 {
        return Err("need -b <= -e and -f >= 2".into());
    }
    if let Some(n) = args.ranks
        && !(1..=source::MAX_RANKS).contains(&n)
    {
        return Err(format!(
            "--ranks must be between 1 and {}",
            source::MAX_RANKS
        ));
    }
    let host_ranks = args.ranks.unwrap_or(source::DEFAULT_HOST_RANKS);
    let full = source::load(&args.topo, host_ranks)?;
    let gpus = crate::topo::bound::Gpus::of(&args.gpus);
    let topology = crate::topo::bound::members_of(&full, gpus)?;
    let e = |e: ferrocoll::topo::TopologyError| e.to_string();
    let sizes = sizes(args.min_bytes, args.max_bytes, args.step_factor);
    println!(
        "# ferrocoll sim: topology {} ({})",
        topology.name, topology.description
    );
    if let Some(path) = &args.plan {
        return run_plan(path, &topology, args.model);
    }
    if let Some(path) = args.algo.file() {
        return run_file(args, path, &topology, &sizes);
    }
    let n = args.ranks.unwrap_or(topology.devices().len() as u32);
    let collective = args.op.with_root(args.root % n.max(1));
    // Asked for some algorithms, the selector considers only those (and
    // synthesizes nothing): every other candidate would be simulated only
    // to be left out of the table.
    let only = match &args.algo {
        AlgoSpec::Builtin(list) => list.clone(),
        _ => Vec::new(),
    };
    let options = SelectOptions {
        dtype: args.dtype,
        fidelity: args.model,
        algorithms: only,
        ..SelectOptions::default()
    };
    let busy = crate::busy::Busy::steps(sizes.len(), "sizes");
    busy.say("searching rings and trees");
    let selector = TopologySelector::new(topology.clone(), n, options).map_err(e)?;
    busy.suspend(|| {
        println!(
            "# {collective} on {n} ranks, algorithm {}, sizes {}..{} x{}; predicted, not measured",
            args.algo, args.min_bytes, args.max_bytes, args.step_factor
        )
    });
    let all = args.algo == AlgoSpec::All;
    let wanted: Vec<Algorithm> = args.algo.builtins();
    let mut rows: Vec<Row> = Vec::new();
    for &size in &sizes {
        busy.say(format!("{size} B"));
        busy.step();
        if wanted.is_empty() {
            let verdict = selector.verdict(collective, size).map_err(e)?;
            rows.push(Row {
                size,
                label: verdict.candidate.to_string(),
                prediction: verdict.prediction.clone(),
                chosen: true,
            });
            continue;
        }
        let evaluated = selector.evaluate(collective, size).map_err(e)?;
        let verdict = if all {
            let among = selector.verdict_among(collective, size, evaluated.clone());
            Some(among.map_err(e)?)
        } else {
            None
        };
        for a in &families(&wanted, all, &evaluated) {
            // Comparing all, the chosen algorithm shows the very plan
            // `auto` runs; otherwise each algorithm its fastest variant.
            if let Some(verdict) = verdict.as_ref().filter(|v| a == v.candidate.family()) {
                rows.push(Row {
                    size,
                    label: verdict.candidate.to_string(),
                    prediction: verdict.prediction.clone(),
                    chosen: true,
                });
                continue;
            }
            let best: Option<&(Candidate, Prediction)> = evaluated
                .iter()
                .filter(|(c, _)| c.family() == a)
                .min_by(|x, y| x.1.time_us.total_cmp(&y.1.time_us));
            match best {
                Some((c, p)) => rows.push(Row {
                    size,
                    label: c.to_string(),
                    prediction: p.clone(),
                    chosen: false,
                }),
                None if !all => return Err(format!("{a} cannot run {collective}")),
                None => {}
            }
        }
    }
    drop(busy);
    print_table(&rows, args, collective.root().map_or(-1, i64::from));
    if all {
        print_crossovers(&rows);
    }
    if n as usize == topology.devices().len() {
        print_bound(args, &full, gpus, &rows)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A schedule of the user's: proven once, simulated per size.
fn run_file(
    args: &SimArgs,
    path: &std::path::Path,
    topology: &ferrocoll::topo::Topology,
    sizes: &[usize],
) -> Result<ExitCode, String> {
    let e = |e: ferrocoll::topo::TopologyError| e.to_string();
    let schedule = Schedule::load(path).map_err(|e| e.to_string())?;
    let verified = verify(schedule, &VerifyOptions::default()).map_err(|e| e.to_string())?;
    let compiler = Compiler::new(Arc::new(verified));
    let s = compiler.verified().schedule();
    println!(
        "# {} on {} ranks, schedule `{}` from {}; predicted, not measured",
        s.collective,
        s.world_size,
        s.name,
        path.display()
    );
    let options = SimOptions {
        dtype: args.dtype,
        fidelity: args.model,
        ..SimOptions::default()
    };
    let mut rows = Vec::new();
    let busy = crate::busy::Busy::steps(sizes.len(), "sizes");
    for &size in sizes {
        busy.say(format!("{size} B"));
        let p = sim::simulate(&compiler, topology, size, &options).map_err(e)?;
        busy.step();
        rows.push(Row {
            size,
            label: s.name.clone(),
            prediction: p,
            chosen: false,
        });
    }
    drop(busy);
    print_table(&rows, args, s.collective.root().map_or(-1, i64::from));
    Ok(ExitCode::SUCCESS)
}

/// The rows' families: the wanted algorithms and, comparing all, what the
/// selector synthesized for this topology.
pub(crate) fn families(
    wanted: &[Algorithm],
    all: bool,
    evaluated: &[(Candidate, Prediction)],
) -> Vec<String> {
    let mut families: Vec<String> = wanted.iter().map(|a| a.name().to_owned()).collect();
    for (c, _) in evaluated.iter().filter(|_| all) {
        if c.algorithm().is_none() && !families.iter().any(|f| f == c.family()) {
            families.push(c.family().to_owned());
        }
    }
    families
}

/// For the collectives it bounds, the members' throughput bound and the
/// best row of the largest size as a fraction of it.
fn print_bound(
    args: &SimArgs,
    full: &ferrocoll::topo::Topology,
    gpus: Option<&[usize]>,
    rows: &[Row],
) -> Result<(), String> {
    if !matches!(
        args.op,
        CollectiveKind::AllReduce | CollectiveKind::AllGather | CollectiveKind::ReduceScatter
    ) {
        return Ok(());
    }
    println!("#");
    let largest = rows.iter().map(|r| r.size).max();
    if let Some(c) = crate::topo::bound::report(full, gpus)?
        && let Some(best) = rows
            .iter()
            .filter(|r| Some(r.size) == largest)
            .max_by(|a, b| a.prediction.busbw.total_cmp(&b.prediction.busbw))
    {
        println!(
            "# best at {} B: {} busbw {:.1} GB/s{}",
            best.size,
            best.label,
            best.prediction.busbw,
            c.fraction(args.op, best.prediction.busbw)
        );
    }
    Ok(())
}

/// `--plan FILE`: one plan, checked, simulated as it is.
fn run_plan(
    path: &std::path::Path,
    topology: &ferrocoll::topo::Topology,
    model: Fidelity,
) -> Result<ExitCode, String> {
    let text = ferrocoll::input::read_text(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let plan = ferrocoll::ExecutionPlan::from_json(&text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let options = SimOptions {
        fidelity: model,
        ..SimOptions::default()
    };
    let p = sim::simulate_plan(&plan, topology, &options).map_err(|e| e.to_string())?;
    println!(
        "# plan {:016x} from {}: `{}` {} on {} ranks, {} B; predicted, not measured",
        plan.hash,
        path.display(),
        plan.schedule,
        plan.collective,
        plan.world_size,
        plan.size_bytes()
    );
    println!(
        "time {:.2} us  algbw {:.2} GB/s  busbw {:.2} GB/s  segments {}",
        p.time_us, p.algbw, p.busbw, p.segments
    );
    if let Some(b) = p.bottleneck() {
        println!("bottleneck {} at {:.0}%", b.resource, b.utilisation * 100.0);
    }
    for l in &p.links {
        println!(
            "link {}->{} channel {}: {} message(s), {} bytes",
            l.link.from, l.link.to, l.link.channel, l.messages, l.bytes
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(rows: &[Row], args: &SimArgs, root: i64) {
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>6}   {:<24} {:>10} {:>8} {:>8}   bottleneck",
        "size", "count", "type", "redop", "root", "algorithm", "time", "algbw", "busbw"
    );
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>6}   {:<24} {:>10} {:>8} {:>8}",
        "(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)"
    );
    let redop = if args.op.with_root(0).reduces() {
        "sum"
    } else {
        "none"
    };
    for r in rows {
        let mut label = if r.chosen && args.algo == AlgoSpec::All {
            format!("{} *", r.label)
        } else {
            r.label.clone()
        };
        if r.prediction.model == Fidelity::Steady {
            label.push_str(" ~");
        }
        let b = r.prediction.bottleneck().map_or("-".to_owned(), |l| {
            format!("{} {:.0}%", l.resource, l.utilisation * 100.0)
        });
        println!(
            "  {:>10} {:>12} {:>8} {:>6} {:>6}   {:<24} {:>10.2} {:>8.2} {:>8.2}   {b}",
            r.size,
            r.size / args.dtype.size_bytes(),
            args.dtype.nccl_tests_name(),
            redop,
            root,
            label,
            r.prediction.time_us,
            r.prediction.algbw,
            r.prediction.busbw
        );
    }
    if args.algo == AlgoSpec::All {
        println!(
            "# * marks the selector's choice: the preferred candidate within {:.0}% of the fastest",
            100.0 * ferrocoll::topo::select::TIE_MARGIN
        );
    }
    if rows.iter().any(|r| r.prediction.model == Fidelity::Steady) {
        println!(
            "# ~ marks the steady-state estimate (flows at fixed shares; docs/topology.md gives its accuracy): the detailed engine would cost too much there; --model detailed forces it"
        );
    }
}

/// Where the selector's choice changes as the size grows.
fn print_crossovers(rows: &[Row]) {
    let mut last: Option<(usize, String)> = None;
    for r in rows.iter().filter(|r| r.chosen) {
        let algo = r.label.split(' ').next().unwrap_or("").to_owned();
        match &last {
            Some((prev, a)) if *a != algo => {
                println!("# crossover: {a} -> {algo} between {prev} and {} B", r.size);
            }
            None => println!("# chosen at {} B: {algo}", r.size),
            _ => {}
        }
        last = Some((r.size, algo));
    }
}
