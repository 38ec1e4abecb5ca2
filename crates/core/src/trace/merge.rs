//! `ferrocoll trace DIR`: the dumps of every rank read together, and what
//! they say about a hang or a failure.
//!
//! Per group: the first call the ranks do not all finish (the stuck
//! call) and where each rank is with it — finished, still inside, failed
//! (with its error), never started (with its last call), or silent (no
//! dump: a stopped or killed rank writes none); calls the ranks describe
//! differently; and each rank's last finished call.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::call::{CallRecord, CallState};
use super::dump::{Dump, FORMAT};

/// Why a directory of dumps could not be read.
#[derive(Debug, Error)]
pub enum MergeError {
    /// The directory itself.
    #[error("cannot read {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// Nothing in it is a dump.
    #[error("no flight recorder dumps (*.json in format {FORMAT}) in {0}")]
    Empty(PathBuf),
}

/// Where one rank is with the stuck call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankAt {
    /// It finished it.
    Done,
    /// Its dump shows it inside the call.
    Running,
    /// It returned this error.
    Failed(String),
    /// Its last recorded call came before (`None`: it recorded none).
    NeverStarted(Option<u64>),
    /// The call is older than the oldest its ring kept.
    Forgotten,
    /// It wrote no dump: stopped, killed, or never formed the group.
    NoDump,
}

/// The first call of a group the ranks do not all finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stuck {
    /// Its number.
    pub call: u64,
    /// What it is, as the first rank recording it describes it.
    pub what: String,
    /// Each rank of the group.
    pub ranks: Vec<(u32, RankAt)>,
}

impl Stuck {
    /// The ranks that hold the others up: those that wrote no dump or
    /// never started the call; where there are none, those still inside
    /// it. A rank that dumped from inside the call was alive and waiting
    /// (a SIGUSR1 dump, as `ferrocoll launch` asks of ranks it is about to
    /// kill); one that could not dump, or never came, is what it waited on.
    pub fn suspects(&self) -> Vec<u32> {
        let pick = |f: fn(&RankAt) -> bool| -> Vec<u32> {
            self.ranks
                .iter()
                .filter(|(_, at)| f(at))
                .map(|&(rank, _)| rank)
                .collect()
        };
        let absent = pick(|at| matches!(at, RankAt::NoDump | RankAt::NeverStarted(_)));
        if absent.is_empty() {
            pick(|at| matches!(at, RankAt::Running))
        } else {
            absent
        }
    }
}

/// Ranks that describe one call differently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    /// The call's number.
    pub call: u64,
    /// Each description and the ranks giving it.
    pub versions: Vec<(String, Vec<u32>)>,
}

/// What the dumps of one group say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupReport {
    /// The group's name.
    pub group: String,
    /// Its size (the largest any dump gives).
    pub world_size: u32,
    /// Each rank's newest dump.
    pub dumps: BTreeMap<u32, Dump>,
    /// The stuck call, if any.
    pub stuck: Option<Stuck>,
    /// Calls described differently (at most [`MAX_DISAGREEMENTS`]).
    pub disagreements: Vec<Disagreement>,
}

/// Disagreements a report lists per group.
pub const MAX_DISAGREEMENTS: usize = 20;

/// Every group found in a directory, and the files that were not dumps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Per group, by name.
    pub groups: Vec<GroupReport>,
    /// Files skipped, with why.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Read every dump in `dir` and report on each group.
pub fn read_dir(dir: &Path) -> Result<Report, MergeError> {
    let entries = std::fs::read_dir(dir).map_err(|source| MergeError::Dir {
        path: dir.to_owned(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    files.sort();
    let (mut dumps, mut skipped) = (Vec::new(), Vec::new());
    for path in files {
        match read_dump(&path) {
            Ok(d) => dumps.push(d),
            Err(why) => skipped.push((path, why)),
        }
    }
    if dumps.is_empty() {
        return Err(MergeError::Empty(dir.to_owned()));
    }
    Ok(Report {
        groups: merge(dumps),
        skipped,
    })
}

fn read_dump(path: &Path) -> Result<Dump, String> {
    let text = std::fs::read(path).map_err(|e| e.to_string())?;
    let dump: Dump = serde_json::from_slice(&text).map_err(|e| format!("not a dump: {e}"))?;
    if dump.format != FORMAT {
        return Err(format!("format `{}`, not {FORMAT}", dump.format));
    }
    plausible(&dump)?;
    Ok(dump)
}

/// The largest group a dump may claim: the report lists every rank, and a
/// file that says four billion must not make it try.
pub const MAX_GROUP: u32 = 1 << 16;

/// Whether a dump's rank and group size can be believed.
fn plausible(dump: &Dump) -> Result<(), String> {
    if dump.world_size > MAX_GROUP || dump.rank >= dump.world_size {
        return Err(format!(
            "rank {} of a group of {} (groups of at most {MAX_GROUP} ranks are read)",
            dump.rank, dump.world_size
        ));
    }
    Ok(())
}

/// Group the dumps and report on each group; dumps whose rank or group
/// size cannot be believed are left out.
pub fn merge(dumps: Vec<Dump>) -> Vec<GroupReport> {
    let mut groups: BTreeMap<String, BTreeMap<u32, Dump>> = BTreeMap::new();
    for d in dumps.into_iter().filter(|d| plausible(d).is_ok()) {
        let ranks = groups.entry(d.group.clone()).or_default();
        // A rank's newest dump says the most.
        if ranks
            .get(&d.rank)
            .is_none_or(|old| old.written_us <= d.written_us)
        {
            ranks.insert(d.rank, d);
        }
    }
    groups
        .into_iter()
        .map(|(group, dumps)| {
            let world_size = dumps.values().map(|d| d.world_size).max().unwrap_or(0);
            GroupReport {
                stuck: stuck(&dumps, world_size),
                disagreements: disagreements(&dumps),
                group,
                world_size,
                dumps,
            }
        })
        .collect()
}

fn open(r: &CallRecord) -> bool {
    r.state != CallState::Done
}

/// The first call some rank did not finish, or did not start while
/// another did.
fn stuck(dumps: &BTreeMap<u32, Dump>, world_size: u32) -> Option<Stuck> {
    let started: BTreeSet<u64> = dumps
        .values()
        .flat_map(|d| d.calls.iter().map(|c| c.call))
        .collect();
    let last = |d: &Dump| d.calls.iter().map(|c| c.call).max();
    let unfinished = dumps
        .values()
        .flat_map(|d| d.calls.iter().filter(|c| open(c)).map(|c| c.call))
        .min();
    let unstarted = dumps
        .values()
        .map(|d| last(d).map_or(0, |l| l + 1))
        .filter(|next| started.contains(next))
        .min();
    let call = match (unfinished, unstarted) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    let record = |d: &Dump| d.calls.iter().find(|c| c.call == call).cloned();
    let what = dumps
        .values()
        .find_map(record)
        .map_or_else(String::new, |r| r.signature());
    let ranks = (0..world_size)
        .map(|rank| {
            let at = match dumps.get(&rank) {
                None => RankAt::NoDump,
                Some(d) => match record(d) {
                    Some(r) => match r.state {
                        CallState::Done => RankAt::Done,
                        CallState::Running => RankAt::Running,
                        CallState::Failed(why) => RankAt::Failed(why),
                    },
                    None if last(d).is_none_or(|l| l < call) => RankAt::NeverStarted(last(d)),
                    None => RankAt::Forgotten,
                },
            };
            (rank, at)
        })
        .collect();
    Some(Stuck { call, what, ranks })
}

fn disagreements(dumps: &BTreeMap<u32, Dump>) -> Vec<Disagreement> {
    let mut by_call: BTreeMap<u64, BTreeMap<String, Vec<u32>>> = BTreeMap::new();
    for (&rank, d) in dumps {
        for c in &d.calls {
            by_call
                .entry(c.call)
                .or_default()
                .entry(c.signature())
                .or_default()
                .push(rank);
        }
    }
    by_call
        .into_iter()
        .filter(|(_, versions)| versions.len() > 1)
        .take(MAX_DISAGREEMENTS)
        .map(|(call, versions)| Disagreement {
            call,
            versions: versions.into_iter().collect(),
        })
        .collect()
}

impl fmt::Display for RankAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankAt::Done => f.write_str("finished it"),
            RankAt::Running => f.write_str("STILL INSIDE it when it dumped"),
            RankAt::Failed(why) => write!(f, "failed it: {why}"),
            RankAt::NeverStarted(Some(last)) => {
                write!(f, "NEVER STARTED it (its last call was #{last})")
            }
            RankAt::NeverStarted(None) => f.write_str("NEVER STARTED it (it recorded no call)"),
            RankAt::Forgotten => f.write_str("no longer has it in its ring"),
            RankAt::NoDump => f.write_str(
                "WROTE NO DUMP: stopped, killed, or hung where it cannot dump (send it SIGUSR1 if it runs)",
            ),
        }
    }
}

impl fmt::Display for GroupReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let executor = self
            .dumps
            .values()
            .next()
            .map_or("", |d| d.executor.as_str());
        writeln!(
            f,
            "group {} ({} ranks, {executor}; dumps from {} of them)",
            self.group,
            self.world_size,
            self.dumps.len()
        )?;
        match &self.stuck {
            None => writeln!(f, "  every rank finished every call it recorded")?,
            Some(s) => {
                writeln!(
                    f,
                    "  first call not finished by every rank: #{} {}",
                    s.call, s.what
                )?;
                for (rank, at) in &s.ranks {
                    writeln!(f, "    rank {rank}: {at}")?;
                }
                let suspects = s.suspects();
                if !suspects.is_empty() && suspects.len() < s.ranks.len() {
                    let named: Vec<String> = suspects.iter().map(|r| format!("rank {r}")).collect();
                    writeln!(
                        f,
                        "  suspects: {} (never reached the call, or never left it, while the others did)",
                        named.join(", ")
                    )?;
                }
            }
        }
        for d in &self.disagreements {
            writeln!(f, "  call #{} is not the same call on every rank:", d.call)?;
            for (what, ranks) in &d.versions {
                writeln!(f, "    {what}: ranks {ranks:?}")?;
            }
        }
        writeln!(f, "  last finished call per rank:")?;
        for rank in 0..self.world_size {
            match self.dumps.get(&rank) {
                None => writeln!(f, "    rank {rank}: no dump")?,
                Some(d) => {
                    let done = d.calls.iter().rev().find(|c| !open(c));
                    let at = format!("{} pid {}, dumped because {}", d.host, d.pid, d.reason);
                    match done {
                        Some(c) => writeln!(
                            f,
                            "    rank {rank}: #{} {} ({}) [{at}]",
                            c.call,
                            c.signature(),
                            c.algorithm.as_deref().unwrap_or("not planned")
                        )?,
                        None => writeln!(f, "    rank {rank}: none [{at}]")?,
                    }
                    if let Some(oldest) = d.queued.first() {
                        let waited = d.written_us.saturating_sub(oldest.queued_us) as f64 / 1e6;
                        writeln!(
                            f,
                            "      {} call(s) queued behind it, not started; the oldest, {}, for {waited:.3} s",
                            d.queued.len(),
                            oldest.what
                        )?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for g in &self.groups {
            writeln!(f, "{g}")?;
        }
        for (path, why) in &self.skipped {
            writeln!(f, "skipped {}: {why}", path.display())?;
        }
        Ok(())
    }
}
