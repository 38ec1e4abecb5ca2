//! `ferrocoll trace DIR`: the flight recorder's dumps of every rank
//! (written under `FERROCOLL_TRACE_DIR`), read together: per group, the
//! first call the ranks do not all finish and where each rank is with it,
//! calls the ranks describe differently, each rank's last finished call.
//!
//! `ferrocoll trace --timeline OUT FILE…`: the Chrome traces of one run's
//! ranks (`FERROCOLL_TIMELINE=…%r…`, a file per process) merged into one,
//! each file's events under a process named after its rank.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use ferrocoll::trace::merge::{RankAt, read_dir};
use serde_json::{Value, json};

#[derive(Args)]
pub(crate) struct TraceArgs {
    /// The directory the ranks dumped into (their `FERROCOLL_TRACE_DIR`;
    /// copy every host's dumps into one directory first); with
    /// `--timeline`, the Chrome traces to merge.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Merge the `FERROCOLL_TIMELINE` files given into this one.
    #[arg(long)]
    timeline: Option<PathBuf>,
}

/// Print the report; exit 1 when some group has a call not every rank
/// finished (a hang or a failure to look at), 0 when none has.
pub(crate) fn run(args: &TraceArgs) -> Result<ExitCode, String> {
    if let Some(out) = &args.timeline {
        return merge_timelines(&args.inputs, out);
    }
    let [dir] = args.inputs.as_slice() else {
        return Err("one directory of dumps (or --timeline OUT FILE…)".into());
    };
    let report = read_dir(dir).map_err(|e| e.to_string())?;
    print!("{report}");
    let troubled = report.groups.iter().any(|g| {
        g.stuck
            .as_ref()
            .is_some_and(|s| s.ranks.iter().any(|(_, at)| *at != RankAt::Done))
    });
    Ok(if troubled {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A Chrome trace's events; a file cut off before its closing `]` (a
/// process killed mid-run) is read up to its last whole event.
fn events(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Ok(Value::Array(all)) = serde_json::from_str(&text) {
        return Ok(all);
    }
    let body = text.trim_end().trim_end_matches(',');
    let cut = body.rfind('}').map_or(body, |i| &body[..=i]);
    match serde_json::from_str(&format!("{cut}\n]")) {
        Ok(Value::Array(all)) => Ok(all),
        _ => Err(format!("{}: not a Chrome trace", path.display())),
    }
}

/// A number in an event's arguments (tracing-chrome writes them as text).
fn arg(e: &Value, key: &str) -> Option<u64> {
    let v = &e["args"][key];
    v.as_u64().or_else(|| v.as_str()?.parse().ok())
}

/// The rank a file's events carry (their spans' `rank` argument).
fn rank_of(events: &[Value]) -> Option<u64> {
    events.iter().find_map(|e| arg(e, "rank"))
}

/// When the file's clock started, µs since the Unix epoch: its
/// `timeline start` mark's time less its offset in the file.
fn origin_us(events: &[Value]) -> Option<f64> {
    events.iter().find_map(|e| {
        let unix = arg(e, "unix_us")? as f64;
        Some(unix - e["ts"].as_f64()?)
    })
}

fn merge_timelines(inputs: &[PathBuf], out: &Path) -> Result<ExitCode, String> {
    let files = inputs
        .iter()
        .map(|p| events(p))
        .collect::<Result<Vec<_>, _>>()?;
    // The earliest start is time 0 of the merged trace.
    let origins: Vec<Option<f64>> = files.iter().map(|f| origin_us(f)).collect();
    let first = origins
        .iter()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let mut merged = Vec::new();
    for (i, (path, mut all)) in inputs.iter().zip(files).enumerate() {
        let pid = rank_of(&all).unwrap_or(10_000 + i as u64);
        let shift = origins[i].map_or(0.0, |o| o - first);
        for e in &mut all {
            e["pid"] = pid.into();
            if let Some(ts) = e["ts"].as_f64() {
                e["ts"] = (ts + shift).into();
            }
        }
        merged.push(json!({
            "ph": "M", "pid": pid, "name": "process_name",
            "args": { "name": format!("rank {pid} ({})", path.display()) },
        }));
        merged.extend(all);
    }
    let text = serde_json::to_string(&merged).map_err(|e| e.to_string())?;
    std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    println!(
        "{} events of {} ranks in {}",
        merged.len(),
        inputs.len(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}
