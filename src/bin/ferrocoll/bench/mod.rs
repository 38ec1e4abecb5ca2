//! `ferrocoll bench`: nccl-tests' table, on ferrocoll's executors.
//!
//! Sizes follow nccl-tests: `size` is the bytes of the larger buffer of one
//! rank (the all-gather output, the reduce-scatter input, the whole
//! all-to-all buffer), `count` its elements; `algbw = size / time` and
//! `busbw = algbw × factor` (all-reduce 2(n−1)/n; reduce-scatter,
//! all-gather, all-to-all (n−1)/n; others 1), with GB = 1e9 bytes.

mod backend;
mod buffers;
mod check;
mod cuda;
mod device;
mod files;
mod launched;
mod limits;
mod nccl;
mod paired;
mod predict;
mod process;
mod report;
mod row;
mod run;
pub(crate) mod setup;
mod target;
mod terminate;
#[cfg(test)]
mod tests;
mod threads;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};

use crate::spec::{self, AlgoSpec, parse_size};
pub(crate) use row::Row;
pub(crate) use setup::Section;

/// The executors `bench` drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
    /// ferrocoll's schedules on CPU threads (or processes, with `--transport`).
    Cpu,
    /// ferrocoll's schedules on GPUs: the device interpreter, one launch
    /// per call, in place between ranks that reach each other's buffers
    /// (`cuda-v2`, its name while a first executor existed, still works).
    #[value(alias = "cuda-v2")]
    Cuda,
    /// NCCL on the same GPUs, for comparison.
    Nccl,
}

/// What `--compare` runs beside the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Peer {
    /// NCCL on the same GPUs, sizes and data.
    Nccl,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.to_possible_value().expect("no skipped variants");
        f.write_str(v.get_name())
    }
}

#[derive(Args, Debug, Clone)]
pub(crate) struct BenchArgs {
    /// Executor.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    backend: Backend,
    /// Number of ranks (threads, or ranks on GPUs; at most 1024 as
    /// threads of one process). With `--transport` the group's size comes
    /// from `ferrocoll launch` instead.
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// `cpu` only: ranks are processes started by `ferrocoll launch` (or
    /// by `mpirun`, in a build with the `mpi` feature), linked by `auto`
    /// (shared memory inside a host, the network across hosts), `shm`
    /// (one host), `tcp` or `mpi` (every pair); rank 0 prints the table.
    #[arg(long)]
    transport: Option<ferrocoll::process::TransportKind>,
    /// `--transport auto`: what links hosts, `tcp` (ferrocoll's own) or
    /// `mpi` (MPI point-to-point); `auto`: MPI under mpirun in a build
    /// with the `mpi` feature, else TCP.
    #[arg(long, default_value_t = ferrocoll::process::NetKind::Auto)]
    net: ferrocoll::process::NetKind,
    /// `--transport auto|tcp` across hosts: each host's network port in
    /// Gbit/s (default `FERROCOLL_NET_GBPS`). `auto` then selects per
    /// size on a model of the cluster (hosts like rank 0's, one switch)
    /// instead of the fixed rule (hierarchical all-reduce across equal
    /// hosts).
    #[arg(long, value_parser = parse_net_gbps)]
    net_gbps: Option<f64>,
    /// As `--net-gbps`, the cluster's topology file instead (default
    /// `FERROCOLL_CLUSTER`; its devices, in order, are the ranks).
    #[arg(long, conflicts_with = "net_gbps")]
    cluster: Option<std::path::PathBuf>,
    /// `nccl` only: this process is one rank of the group the env://
    /// variables describe (`ferrocoll launch`, torchrun, `srun`), on the
    /// GPU numbered `LOCAL_RANK`; rank 0 prints the table.
    #[arg(long)]
    from_env: bool,
    /// `--transport shm|auto`: keep each rank's buffers private, so every
    /// message is copied through a slot, instead of placing them in the
    /// group's shared heap where peers read them in place.
    #[arg(long)]
    no_shared_heap: bool,
    /// `cuda` only: the device of each rank, e.g. `0,0,1,1`; shorter lists
    /// repeat. Default: ranks go round the visible devices.
    #[arg(long)]
    devices: Option<String>,
    /// Collective: all-reduce, reduce-scatter, all-gather, broadcast,
    /// reduce, all-to-all, send-recv, or `all`.
    #[arg(long, default_value = "all-reduce", value_parser = crate::spec::parse_ops)]
    op: crate::spec::Ops,
    /// `auto`, `ring`, `tree`, `direct`, `halving-doubling`, `all`, or a
    /// schedule file (`FILE.json`, proven before it runs; its collective
    /// and root replace `--op` and `-r`).
    #[arg(long, default_value = "auto", value_parser = spec::parse_algo)]
    algo: AlgoSpec,
    /// Smallest size (bytes; K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "4K", value_parser = parse_size)]
    min_bytes: usize,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    max_bytes: usize,
    /// Multiply the size by this much each row.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    step_factor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: u32,
    /// Untimed warm-up iterations per size.
    #[arg(
        short = 'w',
        long = "warmup-iters",
        alias = "warmup_iters",
        default_value_t = 5
    )]
    warmup: u32,
    /// Check results (1) or not (0); wrong elements go in `#wrong`.
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: u32,
    /// Element type (`float`, `half`, `bf16`, `int32`, ... or `all`).
    #[arg(
        short = 'd',
        long = "datatype",
        alias = "dtype",
        default_value = "float"
    )]
    dtype: String,
    /// Reduction op (`sum`, `prod`, `min`, `max`, `avg`, or `all`).
    #[arg(short = 'o', long = "redop", default_value = "sum")]
    redop: String,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: u32,
    /// Also write the run as JSON (nccl-tests' `-J`): the command line,
    /// the FERROCOLL_/NCCL_/CUDA_ environment (secrets masked), versions,
    /// host, start and end, and the rows with each mode's fastest, median
    /// and slowest call.
    #[arg(short = 'J', long)]
    json: Option<PathBuf>,
    /// Also write the rows as CSV, every column the JSON rows have
    /// (quoted where a field holds a comma or a quote).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw busbw against size as SVG, one line per algorithm.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Measure memory bandwidth before and after the sweep and report
    /// all-reduce busbw against the in-process ceiling BW·(n−1)/n²; rows
    /// past the last-level cache (threads, shm) time their calls in 5
    /// rounds with the memory probed between them, each round against its
    /// own probes.
    #[arg(long)]
    membw: bool,
    /// Largest chunk per step, in bytes (pipelining granularity). Giving it
    /// turns the topology-aware `auto` back into the fixed rule, whose
    /// plans take their chunk size from here.
    #[arg(long, value_parser = parse_size)]
    max_chunk_bytes: Option<usize>,
    /// Channels of each call (1 to 64): parallel rings or trees, each a
    /// thread block per rank on `cuda` (default there: an equal share of
    /// what the GPU holds at once, at most 64). Giving it, like
    /// `--max-chunk-bytes`, turns `auto` back into the fixed rule.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    channels: Option<u32>,
    /// With `--backend cuda`: the small-message (LL) protocol's size.
    /// LL slots carry messages of up to this many bytes, and calls up to
    /// it take LL unless `FERROCOLL_PROTO` says otherwise (default: the
    /// executor's, 64 KiB; 0 turns LL off). To force a protocol, set
    /// `FERROCOLL_PROTO` (`Simple`, `LL`, `^LL`, per collective) as
    /// NCCL_PROTO.
    #[arg(long, value_parser = parse_size)]
    ll_max_bytes: Option<usize>,
    /// Print the simulator's prediction for each row on this host's
    /// measured topology, and its error against the measurement.
    #[arg(long)]
    predict: bool,
    /// With `--backend cuda`: also run NCCL on the same GPUs, sizes and
    /// data, print its rows and the busbw ratio per size; the plot shows
    /// both curves.
    #[arg(long, value_enum)]
    compare: Option<Peer>,
}

/// Every section on `target`, with its comparison where asked: a
/// comparison that fails (NCCL too old for ranks sharing a GPU, say) is a
/// printed note in `facts`, and the run goes on with its own rows.
fn sweep(
    target: &dyn target::Target,
    args: &BenchArgs,
    setup: &setup::Setup,
    progress: Option<&indicatif::ProgressBar>,
    predictor: Option<&predict::Predictor>,
    bandwidth: Option<&ferrocoll::topo::probe::membw::MemoryBandwidth>,
    facts: &mut files::RunFacts,
) -> Result<Vec<Row>, String> {
    let mut rows: Vec<Row> = Vec::new();
    for section in &setup.sections {
        if target.prints() {
            report::print_section(section, args.ranks, &args.algo);
        }
        let config = setup.section_config(section);
        let sweep = target::Sweep {
            args,
            config: &config,
            section,
            sizes: &setup.sizes,
            progress,
        };
        let mut section_rows = target.run_section(&sweep)?;
        if let Some(p) = predictor {
            for row in &mut section_rows {
                let collective = setup.collective(section, args);
                row.predicted_us = p.time_us(&config, collective, section.dtype, row.size);
            }
        }
        for row in &section_rows {
            report::print_row(row, bandwidth, args.ranks);
        }
        rows.extend(section_rows);
        match target.compare(&sweep) {
            Ok(Some(theirs)) => {
                let ours = &rows[rows.len() - setup.sizes.len()..];
                report::print_comparison(ours, &theirs, bandwidth, args.ranks);
                rows.extend(theirs);
            }
            Ok(None) => {}
            Err(e) => {
                let note = format!("no comparison for {}: {e}", section.kind.name());
                println!("# {note}");
                facts.note(note);
            }
        }
    }
    Ok(rows)
}

/// Run the benchmark: choose the backend, plan the sections, sweep them,
/// report.
pub(crate) fn run(args: &BenchArgs) -> Result<ExitCode, String> {
    let facts = files::RunFacts::start(args);
    limits::check_ranks(args)?;
    let (target, args) = backend::open(args)?;
    let setup = setup::Setup::new(&args, target.custom())?;
    limits::check_memory(&args, &setup)?;
    let show = target.prints();
    if show {
        report::print_header(&args, &setup, &*target);
    }
    let bandwidth = match args.membw && show {
        true => {
            let bw = target.memory_bandwidth()?;
            report::print_membw(&bw, args.ranks);
            Some(bw)
        }
        false => None,
    };
    let progress = (show && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new((setup.sections.len() * setup.sizes.len()) as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {bar:40} {pos}/{len} sizes {msg}")
                .expect("valid template"),
        );
        // Drawn and turning from the start, so a phase of seconds (placing
        // and checking a 1 GiB row) shows it is alive.
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        bar
    });
    let predictor = match args.predict {
        true => Some(predict::Predictor::new(args.ranks, bandwidth.as_ref())),
        false => None,
    };
    let mut facts = facts;
    let rows = match sweep(
        &*target,
        &args,
        &setup,
        progress.as_ref(),
        predictor.as_ref(),
        bandwidth.as_ref(),
        &mut facts,
    ) {
        Ok(rows) => rows,
        // The launcher is ending the job and kills what is left in a
        // moment: say why now, and leave without the group's teardown,
        // which would wait for peers that are gone.
        Err(e) if terminate::terminated().is_some() => {
            eprintln!("error: {e}");
            std::process::exit(128 + terminate::terminated().unwrap_or(0));
        }
        Err(e) => return Err(e),
    };
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    // Shared machines drift: measure again and judge against the higher of
    // the two, so the reported fraction errs low, never high.
    let bandwidth = bandwidth.map(|before| {
        let after = target.memory_bandwidth().unwrap_or(before);
        println!(
            "# memory bandwidth again after the sweep: best {:.2} GB/s (before: {:.2})",
            after.best, before.best
        );
        if after.best > before.best {
            after
        } else {
            before
        }
    });
    if !show {
        return Ok(ExitCode::SUCCESS);
    }
    report::finish(&args, &rows, bandwidth.as_ref(), &facts)
}

fn parse_net_gbps(value: &str) -> Result<f64, String> {
    ferrocoll::network::parse_rate(value)
}
