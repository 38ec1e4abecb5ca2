//! `ferrocoll bench`: nccl-tests' table, on ferrocoll's executors.
//!
//! Sizes follow nccl-tests: `size` is the bytes of the larger buffer of one
//! rank (the all-gather output, the reduce-scatter input, the whole
//! all-to-all buffer), `count` its elements; `algbw = size / time` and
//! `busbw = algbw × factor` (all-reduce 2(n−1)/n; reduce-scatter,
//! all-gather, all-to-all (n−1)/n; others 1), with GB = 1e9 bytes.

mod cuda;
mod device;
mod nccl;
mod predict;
mod process;
mod report;
mod run;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use ferrocoll::comm::Communicator;
use ferrocoll::cpu::CpuConfig;
use ferrocoll::topo::probe::membw;
use ferrocoll::{Algorithm, CollectiveKind, DataType, ReduceOp};

pub(crate) use report::Row;

#[derive(Args, Debug, Clone)]
pub(crate) struct BenchArgs {
    /// Executor: `cpu` (threads), `cuda` (ferrocoll's schedules on GPUs)
    /// or `nccl` (NCCL on the same GPUs, for comparison).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Number of ranks (threads, or ranks on GPUs). With `--transport`
    /// the group's size comes from `ferrocoll launch` instead.
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// `cpu` only: ranks are processes started by `ferrocoll launch`,
    /// exchanging over `shm` (one host) or `tcp`; rank 0 prints the table.
    #[arg(long)]
    transport: Option<ferrocoll::process::TransportKind>,
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
    #[arg(long, default_value = "auto")]
    algo: String,
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
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup: u32,
    /// Check results (1) or not (0); wrong elements go in `#wrong`.
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: u32,
    /// Element type (`float`, `half`, `bf16`, `int32`, ... or `all`).
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: String,
    /// Reduction op (`sum`, `prod`, `min`, `max`, `avg`, or `all`).
    #[arg(short = 'o', long = "redop", default_value = "sum")]
    redop: String,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: u32,
    /// Also write the rows as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write the rows as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw busbw against size as SVG, one line per algorithm.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Measure memory bandwidth first and report busbw against the
    /// in-process ceiling BW·(n−1)/n² (all-reduce).
    #[arg(long)]
    membw: bool,
    /// Largest chunk per step, in bytes (pipelining granularity). Giving it
    /// turns the topology-aware `auto` back into the fixed rule, whose
    /// plans take their chunk size from here.
    #[arg(long, value_parser = parse_size)]
    max_chunk_bytes: Option<usize>,
    /// Print the simulator's prediction for each row on this host's
    /// measured topology, and its error against the measurement.
    #[arg(long)]
    predict: bool,
    /// With `--backend cuda`: also run NCCL (`nccl`) on the same GPUs,
    /// sizes and data, print its rows and the busbw ratio per size; the
    /// plot shows both curves.
    #[arg(long)]
    compare: Option<String>,
}

/// `4096`, `4K`, `64M`, `1G` (binary multiples, as nccl-tests).
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 10),
        Some('M') => (&s[..s.len() - 1], 20),
        Some('G') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|v| v.checked_mul(1 << shift))
        .ok_or_else(|| format!("`{s}` is not a size (e.g. 4096, 4K, 64M)"))
}

fn list<T: Copy>(
    s: &str,
    all: &[T],
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(all.to_vec());
    }
    s.split(',').map(|x| parse(x.trim())).collect()
}

/// One table: a collective, algorithm, type and op over all sizes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Section {
    pub kind: CollectiveKind,
    pub algorithm: Option<Algorithm>,
    /// Set when the section runs the configured schedule file.
    pub custom: bool,
    pub dtype: DataType,
    pub op: ReduceOp,
}

pub(crate) fn run(args: &BenchArgs) -> Result<ExitCode, String> {
    let mut owned;
    let mut group = None;
    let args = match args.transport {
        None => args,
        Some(transport) => {
            if args.backend != "cpu" || args.predict || args.compare.is_some() {
                return Err(
                    "--transport runs the CPU executor across processes: use it with --backend cpu, without --predict or --compare".to_owned(),
                );
            }
            // FERROCOLL_ALGO and FERROCOLL_TIMEOUT_MS apply as for threads.
            let env = ferrocoll::env::cpu_config_from_env(CpuConfig::default())
                .map_err(|e| e.to_string())?;
            let boot =
                ferrocoll::env::bootstrap_from_env(env.timeout).map_err(|e| e.to_string())?;
            owned = args.clone();
            owned.ranks = boot.world_size;
            let config = ferrocoll::process::ProcessConfig {
                transport,
                timeout: env.timeout,
                algorithm: env.algorithm,
                max_message_bytes: args
                    .max_chunk_bytes
                    .unwrap_or(ferrocoll::process::ProcessConfig::default().max_message_bytes),
                schedule: custom_schedule(&owned)?,
                ..ferrocoll::process::ProcessConfig::default()
            };
            let comm = ferrocoll::process::ProcessCommunicator::connect(
                boot.store,
                boot.rank,
                boot.world_size,
                &config,
            )
            .map_err(|e| e.to_string())?;
            group = Some((std::sync::Mutex::new(comm), config));
            &owned
        }
    };
    let show = group
        .as_ref()
        .is_none_or(|(c, _)| c.lock().map_or(true, |c| c.rank() == 0));
    if let Some(other) = &args.compare {
        if other != "nccl" || args.backend != "cuda" {
            return Err(format!(
                "--compare {other}: only `--backend cuda --compare nccl` is supported"
            ));
        }
        ferrocoll::nccl::version().map_err(|e| e.to_string())?;
    }
    let (cuda, use_nccl): (Option<Vec<usize>>, bool) = match args.backend.as_str() {
        "cpu" => (None, false),
        "cuda" => (
            Some(cuda::devices(args.ranks, args.devices.as_deref())?),
            false,
        ),
        "nccl" => {
            ferrocoll::nccl::version().map_err(|e| e.to_string())?;
            (
                Some(cuda::devices(args.ranks, args.devices.as_deref())?),
                true,
            )
        }
        other => {
            return Err(format!(
                "backend `{other}` is not available; `cpu`, `cuda` and `nccl` are"
            ));
        }
    };
    if args.ranks == 0 {
        return Err("--ranks must be at least 1".to_owned());
    }
    if args.root >= args.ranks {
        return Err(format!(
            "--root {} is out of range for {} ranks",
            args.root, args.ranks
        ));
    }
    if args.min_bytes > args.max_bytes || args.step_factor < 2 {
        return Err("need -b <= -e and -f >= 2".to_owned());
    }
    let custom = custom_schedule(args)?;
    let algorithms: Vec<Option<Algorithm>> = match args.algo.as_str() {
        _ if custom.is_some() => vec![None],
        "auto" => vec![None],
        "all" => Algorithm::ALL.map(Some).to_vec(),
        other => other
            .split(',')
            .map(|a| a.parse::<Algorithm>().map(Some).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?,
    };
    let dtypes = list(&args.dtype, &DataType::ALL, |s| {
        s.parse()
            .map_err(|e: ferrocoll::ParseNameError| e.to_string())
    })?;
    let ops = list(&args.redop, &ReduceOp::ALL, |s| {
        s.parse()
            .map_err(|e: ferrocoll::ParseNameError| e.to_string())
    })?;
    let base = CpuConfig {
        max_chunk_bytes: args
            .max_chunk_bytes
            .unwrap_or(CpuConfig::default().max_chunk_bytes),
        ..CpuConfig::default()
    };
    let mut config = ferrocoll::auto::cpu_config(base).map_err(|e| e.to_string())?;
    if args.max_chunk_bytes.is_some() {
        // A chooser brings its own chunk size; an explicit one wins.
        config.chooser = None;
    }
    let kinds: Vec<CollectiveKind> = match &custom {
        Some(v) => vec![v.schedule().collective.kind()],
        None => args.op.0.clone(),
    };
    config.schedule = custom.clone();

    let mut sections = Vec::new();
    for &kind in &kinds {
        for &algorithm in &algorithms {
            if let Some(a) = algorithm
                && a.supports(kind).is_err()
            {
                continue;
            }
            for &dtype in &dtypes {
                let reduces = kind.with_root(0).reduces();
                for &op in if reduces { &ops[..] } else { &ops[..1] } {
                    sections.push(Section {
                        kind,
                        algorithm,
                        custom: custom.is_some(),
                        dtype,
                        op,
                    });
                }
            }
        }
    }
    if sections.is_empty() {
        return Err("no algorithm given can run the collective(s) asked for".to_owned());
    }
    let sizes = sizes(args.min_bytes, args.max_bytes, args.step_factor);
    if show {
        report::print_header(args, &config, group.as_ref().map(|(_, p)| p));
    }
    let measure = || -> Result<membw::MemoryBandwidth, String> {
        match &cuda {
            Some(devices) => cuda::device_bandwidth(devices[0]),
            None => Ok(membw::measure(
                membw::ARRAY_BYTES,
                std::thread::available_parallelism().map_or(1, |n| n.get()),
                5,
            )),
        }
    };
    let bandwidth = match args.membw && show {
        true => {
            let bw = measure()?;
            report::print_membw(&bw, args.ranks);
            Some(bw)
        }
        false => None,
    };
    let progress = (show && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new((sections.len() * sizes.len()) as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} sizes {msg}")
                .expect("valid template"),
        );
        bar
    });
    let predictor = if args.predict {
        Some(predict::Predictor::new(
            args.ranks,
            &config,
            bandwidth.as_ref(),
        )?)
    } else {
        None
    };
    let mut rows: Vec<Row> = Vec::new();
    for section in &sections {
        if show {
            report::print_section(section, args.ranks);
        }
        let config = CpuConfig {
            algorithm: section.algorithm.or(config.algorithm),
            ..config.clone()
        };
        let mut section_rows = match &cuda {
            None if group.is_some() => {
                let (comm, process_config) = group.as_ref().expect("checked");
                comm.lock()
                    .map_err(|_| "the communicator is poisoned")?
                    .set_algorithm(config.algorithm);
                let backend = process::Process {
                    comm,
                    schedule: process_config.schedule.as_deref(),
                };
                run::section(args, &backend, section, &sizes, progress.as_ref())?
            }
            Some(devices) if use_nccl => {
                let backend = nccl::Nccl::new(devices.clone(), &config);
                run::section(args, &backend, section, &sizes, progress.as_ref())?
            }
            Some(devices) => {
                let backend = cuda::Cuda::new(devices.clone(), &config, args.ranks);
                run::section(args, &backend, section, &sizes, progress.as_ref())?
            }
            None => {
                let backend = run::Cpu {
                    n: args.ranks,
                    config: &config,
                };
                run::section(args, &backend, section, &sizes, progress.as_ref())?
            }
        };
        if let Some(p) = &predictor {
            for row in &mut section_rows {
                let collective = match (&config.schedule, section.custom) {
                    (Some(v), true) => v.schedule().collective,
                    _ => section.kind.with_root(args.root),
                };
                row.predicted_us = p.time_us(section, collective, row.size);
            }
        }
        for row in &section_rows {
            report::print_row(row, bandwidth.as_ref(), args.ranks);
        }
        if let (Some(devices), Some(_)) = (&cuda, &args.compare) {
            let backend = nccl::Nccl::new(devices.clone(), &config);
            let mut theirs = run::section(args, &backend, section, &sizes, progress.as_ref())?;
            println!("# the same on NCCL");
            for row in &mut theirs {
                row.algorithm = "nccl".to_owned();
                report::print_row(row, bandwidth.as_ref(), args.ranks);
            }
            for (ours, theirs) in section_rows.iter().zip(&theirs) {
                if let (Some(a), Some(b)) = (ours.out_of_place, theirs.out_of_place) {
                    println!(
                        "# {:>10} B: ferrocoll busbw {:.2} GB/s, NCCL {:.2} GB/s, ratio {:.3}",
                        ours.size,
                        a.busbw,
                        b.busbw,
                        if b.busbw > 0.0 {
                            a.busbw / b.busbw
                        } else {
                            0.0
                        }
                    );
                }
            }
            rows.extend(theirs);
        }
        rows.extend(section_rows);
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    // Shared machines drift: measure again and judge against the higher of
    // the two, so the reported fraction errs low, never high.
    let bandwidth = bandwidth.map(|before| {
        let after = measure().unwrap_or(before);
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
    let wrong = report::print_footer(&rows, bandwidth.as_ref(), args.ranks);
    if let Some(path) = &args.json {
        report::write_json(path, &rows, bandwidth.as_ref())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.csv {
        report::write_csv(path, &rows).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        report::write_svg(path, &rows).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The schedule file `--algo` names, loaded and proven, if it names one.
fn custom_schedule(
    args: &BenchArgs,
) -> Result<Option<std::sync::Arc<ferrocoll::Verified>>, String> {
    let path = std::path::Path::new(&args.algo);
    if !(args.algo.ends_with(".json") || path.is_file()) {
        return Ok(None);
    }
    let schedule = ferrocoll::Schedule::load(path).map_err(|e| e.to_string())?;
    if schedule.world_size != args.ranks {
        return Err(format!(
            "{} is a schedule for {} ranks; pass --ranks {}",
            path.display(),
            schedule.world_size,
            schedule.world_size
        ));
    }
    let verified = ferrocoll::verify(schedule, &ferrocoll::VerifyOptions::default())
        .map_err(|e| e.to_string())?;
    Ok(Some(std::sync::Arc::new(verified)))
}

/// `min, min·factor, …` up to `max`, stopping before an overflow.
pub(crate) fn sizes(min: usize, max: usize, factor: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = Some(min.max(1));
    while let Some(size) = s.filter(|&v| v <= max) {
        out.push(size);
        s = size.checked_mul(factor);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_step() {
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("64m").unwrap(), 64 << 20);
        assert!(parse_size("lots").is_err());
        assert_eq!(sizes(4096, 16384, 2), vec![4096, 8192, 16384]);
        assert_eq!(sizes(1 << 62, usize::MAX, 2).len(), 2);
        assert!(parse_size("99999999999999999G").is_err());
    }
}
