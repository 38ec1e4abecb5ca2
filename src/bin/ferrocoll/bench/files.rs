//! The bench's files: `-J`/`--json` (nccl-tests' flag) with what a run
//! months later needs to be compared — the command line, the
//! environment that shapes it, the versions, the host, when it ran — and
//! `--csv` with every column the JSON rows have, quoted as RFC 4180 says
//! (a schedule's name may hold a comma).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::row::{Measure, Row};
use super::{Backend, BenchArgs};
use crate::host_facts;
use ferrocoll::topo::probe::membw::MemoryBandwidth;

/// The JSON's layout version: 2 added argv, environment, versions, host
/// and times.
const JSON_VERSION: u32 = 2;

/// What the run was, beside its rows.
#[derive(Debug, Serialize)]
pub(crate) struct RunFacts {
    argv: Vec<String>,
    /// `FERROCOLL_*`, `NCCL_*` and `CUDA_*` as set (secrets as `<set>`).
    environment: BTreeMap<String, String>,
    versions: BTreeMap<&'static str, String>,
    host: BTreeMap<&'static str, String>,
    /// Seconds since the Unix epoch.
    started_unix_s: f64,
    /// What the run could not do and went on without (a comparison that
    /// failed), as printed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl RunFacts {
    /// Taken as the run starts.
    pub(crate) fn start(args: &BenchArgs) -> RunFacts {
        RunFacts {
            argv: std::env::args().collect(),
            environment: environment(std::env::vars()),
            versions: versions(args.backend),
            host: host_facts::summary(),
            started_unix_s: now_s(),
            notes: Vec::new(),
        }
    }

    /// Record what the run went on without.
    pub(crate) fn note(&mut self, text: String) {
        self.notes.push(text);
    }

    /// What was recorded so far.
    #[cfg(test)]
    pub(crate) fn notes(&self) -> &[String] {
        &self.notes
    }
}

/// The variables that shape a run, with anything secret masked.
fn environment(vars: impl Iterator<Item = (String, String)>) -> BTreeMap<String, String> {
    vars.filter(|(k, _)| {
        ["FERROCOLL_", "NCCL_", "CUDA_"]
            .iter()
            .any(|p| k.starts_with(p))
    })
    .map(|(k, v)| {
        let secret = ["SECRET", "TOKEN", "PASSWORD", "KEY"]
            .iter()
            .any(|s| k.contains(s));
        let v = if secret { "<set>".to_owned() } else { v };
        (k, v)
    })
    .collect()
}

fn versions(backend: Backend) -> BTreeMap<&'static str, String> {
    let mut v = BTreeMap::from([
        ("ferrocoll", env!("CARGO_PKG_VERSION").to_owned()),
        (
            "build",
            format!(
                "{} build for {}",
                env!("FERROCOLL_BUILD_PROFILE"),
                env!("FERROCOLL_BUILD_TARGET")
            ),
        ),
    ]);
    // The GPU libraries only where the run loads them anyway.
    if backend != Backend::Cpu {
        if let Ok((a, b, c)) = ferrocoll::nccl::version() {
            v.insert("nccl", format!("{a}.{b}.{c}"));
        }
        if let Ok(d) = ferrocoll::cuda::info::driver() {
            v.insert("cuda_driver", format!("{}.{}", d.version.0, d.version.1));
        }
    }
    v
}

#[derive(Serialize)]
struct JsonReport<'a> {
    version: u32,
    #[serde(flatten)]
    run: &'a RunFacts,
    /// Seconds since the Unix epoch, as the file is written.
    ended_unix_s: f64,
    memory_bandwidth: Option<&'a MemoryBandwidth>,
    rows: &'a [Row],
}

pub(crate) fn write_json(
    path: &Path,
    rows: &[Row],
    bw: Option<&MemoryBandwidth>,
    run: &RunFacts,
) -> std::io::Result<()> {
    let report = JsonReport {
        version: JSON_VERSION,
        run,
        ended_unix_s: now_s(),
        memory_bandwidth: bw,
        rows,
    };
    let text = serde_json::to_string_pretty(&report).map_err(std::io::Error::other)?;
    std::fs::write(path, text)
}

/// One mode's columns.
const MEASURE_COLUMNS: [&str; 8] = [
    "time_us",
    "time_us_min",
    "time_us_median",
    "time_us_max",
    "algbw",
    "busbw",
    "wrong",
    "paired_ratio",
];

fn measure_cells(m: Option<&Measure>) -> Vec<String> {
    match m {
        None => vec![String::new(); MEASURE_COLUMNS.len()],
        Some(m) => vec![
            format!("{:.3}", m.time_us),
            format!("{:.3}", m.time_us_min),
            format!("{:.3}", m.time_us_median),
            format!("{:.3}", m.time_us_max),
            format!("{:.4}", m.algbw),
            format!("{:.4}", m.busbw),
            m.wrong.to_string(),
            m.paired
                .as_ref()
                .map_or_else(String::new, |p| format!("{:.4}", p.ratio)),
        ],
    }
}

pub(crate) fn write_csv(path: &Path, rows: &[Row]) -> Result<(), csv::Error> {
    let mut out = csv::Writer::from_path(path)?;
    let mut header: Vec<String> = [
        "collective",
        "algorithm",
        "ranks",
        "size",
        "count",
        "type",
        "redop",
        "root",
    ]
    .map(str::to_owned)
    .to_vec();
    for mode in ["oop", "ip"] {
        header.extend(MEASURE_COLUMNS.iter().map(|c| format!("{mode}_{c}")));
    }
    header.push("predicted_us".to_owned());
    out.write_record(&header)?;
    for r in rows {
        let mut record = vec![
            r.collective.clone(),
            r.algorithm.clone(),
            r.ranks.to_string(),
            r.size.to_string(),
            r.count.to_string(),
            r.dtype.clone(),
            r.redop.clone(),
            r.root.to_string(),
        ];
        record.extend(measure_cells(r.out_of_place.as_ref()));
        record.extend(measure_cells(r.in_place.as_ref()));
        record.push(
            r.predicted_us
                .map_or_else(String::new, |p| format!("{p:.3}")),
        );
        out.write_record(&record)?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_and_only_the_runs_variables_kept() {
        let vars = [
            ("FERROCOLL_JOB_SECRET", "hunter2"),
            ("FERROCOLL_ALGO", "ring"),
            ("NCCL_DEBUG", "INFO"),
            ("HOME", "/root"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let env = environment(vars.into_iter());
        assert_eq!(env.len(), 3);
        assert_eq!(env["FERROCOLL_JOB_SECRET"], "<set>");
        assert_eq!(env["FERROCOLL_ALGO"], "ring");
    }
}
