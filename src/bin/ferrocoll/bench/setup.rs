//! What a bench run runs: the sections (collective × algorithm × type ×
//! op), the sizes, and the executor settings each section gets.

use std::sync::Arc;

use ferrocoll::comm::Planning;
use ferrocoll::cpu::CpuConfig;
use ferrocoll::{Algorithm, Collective, CollectiveKind, DataType, ReduceOp, Verified};

use super::BenchArgs;
use crate::spec::{self, AlgoSpec};

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

/// The planned run.
pub(crate) struct Setup {
    /// Settings shared by every section (the topology-aware selector,
    /// `FERROCOLL_*`, `--max-chunk-bytes`, the schedule file).
    pub config: CpuConfig,
    pub sections: Vec<Section>,
    pub sizes: Vec<usize>,
}

/// The most timed (or warm-up) calls per row.
pub(crate) const MAX_ITERS: u32 = 1_000_000;

impl Setup {
    /// Check the arguments and list what to run; `custom` is the schedule
    /// file `--algo` names, already proven.
    pub(crate) fn new(args: &BenchArgs, custom: Option<Arc<Verified>>) -> Result<Setup, String> {
        if args.ranks == 0 {
            return Err("--ranks must be at least 1".to_owned());
        }
        if args.iters == 0 {
            // Zero timed iterations would print times of nothing.
            return Err("-n (--iters) must be at least 1".to_owned());
        }
        if args.iters > MAX_ITERS || args.warmup > MAX_ITERS {
            // Each timed call keeps its time (and, on a GPU, a CUDA event).
            return Err(format!(
                "-n (--iters) and -w (--warmup_iters) are at most {MAX_ITERS}; a row's median \
                 settles long before that"
            ));
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
        let mut config = cpu_config(CpuConfig::builtin(), args.max_chunk_bytes)?;
        if let Some(channels) = args.channels {
            config.planning.channels = Some(channels);
            config.planning.selector = None;
        }
        let kinds: Vec<CollectiveKind> = match &custom {
            Some(v) => vec![v.schedule().collective.kind()],
            None => args.op.0.clone(),
        };
        let sections = sections(args, &kinds, custom.is_some())?;
        config.planning.schedule = custom;
        Ok(Setup {
            config,
            sections,
            sizes: spec::sizes(args.min_bytes, args.max_bytes, args.step_factor),
        })
    }

    /// The settings of one section's calls.
    pub(crate) fn section_config(&self, section: &Section) -> CpuConfig {
        CpuConfig {
            planning: Planning {
                algorithm: section.algorithm.or(self.config.planning.algorithm),
                ..self.config.clone().planning
            },
            ..self.config.clone()
        }
    }

    /// The collective a section calls (a schedule file brings its root).
    pub(crate) fn collective(&self, section: &Section, args: &BenchArgs) -> Collective {
        match (&self.config.planning.schedule, section.custom) {
            (Some(v), true) => v.schedule().collective,
            _ => section.kind.with_root(args.root),
        }
    }
}

/// The CPU executor's settings as the tool runs it: `base` with the
/// topology-aware selector and the `FERROCOLL_*` overrides; an explicit
/// chunk size replaces the selector's (which brings its own).
pub(crate) fn cpu_config(
    base: CpuConfig,
    max_chunk_bytes: Option<usize>,
) -> Result<CpuConfig, String> {
    let base = CpuConfig {
        planning: Planning {
            max_chunk_bytes: Some(
                max_chunk_bytes.unwrap_or(base.planner_settings().max_chunk_bytes),
            ),
            ..base.planning
        },
        ..base
    };
    let mut config = ferrocoll::auto::cpu_config(base).map_err(|e| e.to_string())?;
    if max_chunk_bytes.is_some() {
        config.planning.selector = None;
    }
    Ok(config)
}

/// Every (collective, algorithm, type, op) the arguments name that can run.
fn sections(
    args: &BenchArgs,
    kinds: &[CollectiveKind],
    custom: bool,
) -> Result<Vec<Section>, String> {
    let algorithms: Vec<Option<Algorithm>> = match &args.algo {
        AlgoSpec::Auto | AlgoSpec::File(_) => vec![None],
        other => other.builtins().into_iter().map(Some).collect(),
    };
    let dtypes = list(&args.dtype, &DataType::ALL)?;
    let ops = list(&args.redop, &ReduceOp::ALL)?;
    let mut out = Vec::new();
    for &kind in kinds {
        for &algorithm in &algorithms {
            if algorithm.is_some_and(|a| a.supports(kind).is_err()) {
                continue;
            }
            for &dtype in &dtypes {
                let reduces = kind.with_root(0).reduces();
                for &op in if reduces { &ops[..] } else { &ops[..1] } {
                    out.push(Section {
                        kind,
                        algorithm,
                        custom,
                        dtype,
                        op,
                    });
                }
            }
        }
    }
    if out.is_empty() {
        return Err("no algorithm given can run the collective(s) asked for".to_owned());
    }
    Ok(out)
}

/// `all` or a comma-separated list of names.
fn list<T: Copy + std::str::FromStr<Err = ferrocoll::ParseNameError>>(
    s: &str,
    all: &[T],
) -> Result<Vec<T>, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(all.to_vec());
    }
    s.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|e: ferrocoll::ParseNameError| e.to_string())
        })
        .collect()
}

/// The schedule file `--algo` names, loaded and proven for `ranks` ranks.
pub(crate) fn custom_schedule(
    algo: &AlgoSpec,
    ranks: u32,
) -> Result<Option<Arc<Verified>>, String> {
    let Some(path) = algo.file() else {
        return Ok(None);
    };
    let schedule = ferrocoll::Schedule::load(path).map_err(|e| e.to_string())?;
    if schedule.world_size != ranks {
        return Err(format!(
            "{} is a schedule for {} ranks; pass --ranks {}",
            path.display(),
            schedule.world_size,
            schedule.world_size
        ));
    }
    let verified = ferrocoll::verify(schedule, &ferrocoll::VerifyOptions::default())
        .map_err(|e| e.to_string())?;
    Ok(Some(Arc::new(verified)))
}
