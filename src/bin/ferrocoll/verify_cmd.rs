//! `ferrocoll verify`: prove schedules, print one line each and every violation.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use ferrocoll::{
    Algorithm, AlgorithmError, AlgorithmParams, Collective, Schedule, VerifyError, VerifyOptions,
    generate, verify,
};
use rayon::prelude::*;

use ferrocoll::schedule::msccl::Origin;

use crate::spec::{self, AlgoSpec};

#[derive(Args)]
pub(crate) struct VerifyArgs {
    /// `ring`, `tree`, `direct`, `halving-doubling`, a comma-separated list,
    /// `all`, or a schedule file (`FILE.json`).
    #[arg(long, default_value = "all", value_parser = spec::parse_algo)]
    algo: AlgoSpec,
    /// Collective(s): `all-reduce`, `reduce-scatter`, `all-gather`,
    /// `broadcast`, `reduce`, `all-to-all`, `send-recv`, a list, or `all`.
    /// Default `all`; a schedule file fixes its own, which these must match.
    #[arg(long, value_parser = spec::parse_ops)]
    op: Option<spec::Ops>,
    /// World sizes: `8`, `1..64` (inclusive), or a list such as `1..8,16,32`.
    /// Default `1..16`; a schedule file fixes its own, which these must match.
    #[arg(long, value_parser = spec::parse_ranks)]
    ranks: Option<spec::Ranks>,
    /// Root of broadcast and reduce (taken modulo the world size); not
    /// for a schedule file.
    #[arg(long)]
    root: Option<u32>,
    /// Channels for ring, tree and direct; not for a schedule file.
    #[arg(long)]
    channels: Option<u32>,
    /// Slots per link of the buffering model.
    #[arg(long, default_value_t = ferrocoll::verify::DEFAULT_SLOTS_PER_LINK)]
    slots: u32,
    /// Prove out-of-place calls only.
    #[arg(long)]
    no_in_place: bool,
    /// Print only failures and the summary.
    #[arg(long, short)]
    quiet: bool,
}

/// A schedule file fixes its collective, root, world size and channels:
/// flags that name others are an error, not silently ignored.
fn file_flags_match(args: &VerifyArgs, schedule: &Schedule) -> Result<(), String> {
    let what = format!(
        "the schedule file is {} on {} ranks",
        schedule.collective, schedule.world_size
    );
    if let Some(ops) = &args.op
        && !ops.0.contains(&schedule.collective.kind())
    {
        return Err(format!("--op does not apply: {what} (drop --op)"));
    }
    if let Some(ranks) = &args.ranks
        && !ranks.0.contains(&schedule.world_size)
    {
        return Err(format!("--ranks does not apply: {what} (drop --ranks)"));
    }
    if args.root.is_some() || args.channels.is_some() {
        return Err(format!(
            "--root and --channels do not apply: {what}, with its own root and channels"
        ));
    }
    Ok(())
}

/// One verification job and its outcome.
struct Outcome {
    label: String,
    result: Result<String, Failure>,
    /// Where an imported file's steps came from, to name violations in
    /// its own terms.
    origin: Option<Origin>,
}

/// A schedule file, and for MSCCL XML where each step came from.
fn load(path: &std::path::Path) -> Result<(Schedule, Option<Origin>), String> {
    if !ferrocoll::schedule::msccl::is_msccl_path(path) {
        return Ok((Schedule::load(path).map_err(|e| e.to_string())?, None));
    }
    let text = ferrocoll::input::read_text(path)
        .map_err(|e| format!("cannot read schedule file {}: {e}", path.display()))?;
    let imported = ferrocoll::schedule::msccl::import(&text)
        .map_err(|e| format!("{}: MSCCL XML: {e}", path.display()))?;
    Ok((imported.schedule, Some(imported.origin)))
}

enum Failure {
    Generate(AlgorithmError),
    Verify(VerifyError),
}

pub(crate) fn run(args: &VerifyArgs) -> Result<ExitCode, String> {
    let options = VerifyOptions {
        slots_per_link: args.slots,
        in_place: !args.no_in_place,
    };
    let started = Instant::now();
    let outcomes = match &args.algo {
        AlgoSpec::File(path) => {
            let (schedule, origin) = load(path)?;
            file_flags_match(args, &schedule)?;
            let label = format!("{} ({})", path.display(), schedule.name);
            let mut outcome = check(label, schedule, &options);
            outcome.origin = origin;
            vec![outcome]
        }
        AlgoSpec::Auto => {
            return Err(
                "`auto` selects an algorithm per call; verify proves schedules: name algorithms, `all`, or a schedule file"
                    .into(),
            );
        }
        builtin => builtin_jobs(args, &builtin.builtins(), &options)?,
    };
    let elapsed = started.elapsed();
    let mut failed = 0;
    for o in &outcomes {
        match &o.result {
            Ok(summary) => {
                if !args.quiet {
                    println!("ok    {}  {summary}", o.label);
                }
            }
            Err(Failure::Generate(e)) => {
                failed += 1;
                println!("FAIL  {}  cannot generate: {e}", o.label);
            }
            Err(Failure::Verify(e)) => {
                failed += 1;
                println!(
                    "FAIL  {}  {} violation(s)",
                    o.label,
                    e.violations.len() + e.omitted
                );
                for v in &e.violations {
                    let from = o
                        .origin
                        .as_ref()
                        .and_then(|origin| origin.describe(v.rank?, v.channel?, v.step?));
                    match from {
                        Some(from) => println!("      {v}\n        from {from}"),
                        None => println!("      {v}"),
                    }
                }
                if e.omitted > 0 {
                    println!("      ... and {} more", e.omitted);
                }
            }
        }
    }
    println!(
        "# verified {} schedule(s) in {:.2} s: {} ok, {failed} failed",
        outcomes.len(),
        elapsed.as_secs_f64(),
        outcomes.len() - failed
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn builtin_jobs(
    args: &VerifyArgs,
    algorithms: &[Algorithm],
    options: &VerifyOptions,
) -> Result<Vec<Outcome>, String> {
    let mut jobs = Vec::new();
    for &algorithm in algorithms {
        let ops = args.op.clone().map_or_else(|| spec::parse_ops("all"), Ok)?;
        let ranks = args
            .ranks
            .clone()
            .map_or_else(|| spec::parse_ranks("1..16"), Ok)?;
        let (root, channels_flag) = (args.root.unwrap_or(0), args.channels.unwrap_or(1));
        for &kind in &ops.0 {
            if let Err(reason) = algorithm.supports(kind) {
                if algorithms.len() == 1 && ops.0.len() == 1 {
                    return Err(format!("{algorithm} cannot run {kind}: {reason}"));
                }
                if !args.quiet {
                    println!("skip  {algorithm:<16} {kind:<14} {reason}");
                }
                continue;
            }
            let channels = if algorithm == Algorithm::HalvingDoubling {
                1
            } else {
                channels_flag
            };
            for &n in &ranks.0 {
                jobs.push((algorithm, kind.with_root(root % n), n, channels));
            }
        }
    }
    Ok(jobs
        .into_par_iter()
        .map(|(algorithm, collective, n, channels)| {
            let label = label(algorithm, collective, n);
            let params = AlgorithmParams {
                channels,
                ..AlgorithmParams::default()
            };
            match generate(algorithm, collective, n, &params) {
                Ok(schedule) => check(label, schedule, options),
                Err(e) => Outcome {
                    label,
                    result: Err(Failure::Generate(e)),
                    origin: None,
                },
            }
        })
        .collect())
}

fn label(algorithm: Algorithm, collective: Collective, n: u32) -> String {
    let op = match collective.root() {
        Some(root) => format!("{}(root={root})", collective.kind()),
        None => collective.kind().to_string(),
    };
    format!("{:<16} {op:<20} n={n:<4}", algorithm.name())
}

fn check(label: String, schedule: Schedule, options: &VerifyOptions) -> Outcome {
    let (steps, messages) = (schedule.step_count(), schedule.message_count());
    let result = verify(schedule, options)
        .map(|v| {
            let mode = if v.supports_in_place() {
                "in+out-of-place"
            } else {
                "out-of-place"
            };
            format!("steps={steps} messages={messages} {mode}")
        })
        .map_err(Failure::Verify);
    Outcome {
        label,
        result,
        origin: None,
    }
}
