//! MSCCL's algorithm XML (`<algo><gpu><tb><step>`), in and out: what
//! MSCCLang and TACCL emit and what the MSCCL executors run.
//!
//! The two step models map closely:
//!
//! | MSCCL | ferrocoll |
//! |---|---|
//! | `<tb>` (one peer to send to, one to receive from, a `chan`) | a channel of the rank |
//! | `s` | read `src`, send |
//! | `r` | receive, write `dst` |
//! | `rcs` | receive, write `dst`, send |
//! | `rrs` | receive, reduce with `src`, send |
//! | `rrc` | receive, reduce with `src`, write `dst` |
//! | `rrcs` | receive, reduce with `src`, write `dst`, send |
//! | `cpy` | read `src`, write `dst` (with a following `s` of the same `src`: one step) |
//! | `depid`/`deps` | `after` |
//! | `nop` | its dependency moves onto the next real step |
//! | `cnt` | `chunks` |
//! | `i_chunks` / `o_chunks` / `s_chunks` | chunks per block, scratch chunks |
//!
//! Refused by name ([`MscclError::Unsupported`]): the local reduce `re`
//! (two local operands; a ferrocoll step has one), collectives with a
//! root, in-place programs of collectives whose in-place output lies
//! inside the input, and threadblocks a chain of connections forces onto
//! one channel of one GPU. `proto` and `nchannels` are read past: ferrocoll
//! chooses its own protocol and channels run as the schedule says.
//!
//! An in-place program (`inplace="1"`) reads its input where the output
//! holds it; ferrocoll adds one channel per rank that copies the input
//! there first (nothing to do on an in-place call) and makes every other
//! channel wait for it.
//!
//! Imports are not trusted: everything is range-checked here, and the
//! result goes through the verifier like any schedule file.

mod export;
mod import;
mod read;
#[cfg(test)]
mod tests;

use super::Schedule;
use crate::error::MscclError;
use crate::types::Rank;

/// A schedule read from MSCCL XML and where each of its steps came from.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The schedule (not verified yet).
    pub schedule: Schedule,
    /// Each step's MSCCL origin, to name a violation in the file's terms.
    pub origin: Origin,
}

/// Disjoint sets over `0..n` (which threadblocks, or which steps, go
/// together); the smaller root wins, so numbering by root is stable.
struct Sets(Vec<usize>);

impl Sets {
    fn new(n: usize) -> Sets {
        Sets((0..n).collect())
    }

    fn root(&mut self, mut x: usize) -> usize {
        while self.0[x] != x {
            self.0[x] = self.0[self.0[x]];
            x = self.0[x];
        }
        x
    }

    fn join(&mut self, a: usize, b: usize) {
        let (a, b) = (self.root(a), self.root(b));
        self.0[a.max(b)] = a.min(b);
    }
}

/// An XML step: (threadblock, step index).
type XmlStepId = (u32, u32);

/// One rank's origins: `[channel][step]`, the XML steps behind each.
type RankOrigin = Vec<Vec<Vec<XmlStepId>>>;

/// Where the steps of an imported schedule came from in the XML.
#[derive(Debug, Clone)]
pub struct Origin {
    /// `[rank][channel][step]`: the XML steps, as (threadblock, step).
    steps: Vec<RankOrigin>,
    /// `[gpu][tb][step]`: the line of each XML step.
    lines: Vec<Vec<Vec<usize>>>,
    /// Each rank's channel of the in-place prologue, if one was added.
    prologue: Vec<Option<u32>>,
}

impl Origin {
    /// The XML step(s) behind ferrocoll step `step` of `channel` on
    /// `rank`: `gpu 1 tb 0 step 3 (line 27)`, or what the import added.
    pub fn describe(&self, rank: Rank, channel: u32, step: u32) -> Option<String> {
        if self.prologue.get(rank as usize).copied().flatten() == Some(channel) {
            return Some(
                "the input's copy into place that the import adds to in-place programs".into(),
            );
        }
        let from = self
            .steps
            .get(rank as usize)?
            .get(channel as usize)?
            .get(step as usize)?;
        let named: Vec<String> = from
            .iter()
            .map(|&(tb, s)| {
                let line = self.lines[rank as usize][tb as usize][s as usize];
                format!("gpu {rank} tb {tb} step {s} (line {line})")
            })
            .collect();
        Some(named.join(" + "))
    }
}

/// Whether a schedule file at `path` is read as MSCCL XML: its name ends
/// in `.xml` (any case). The one rule the loader, `verify` and `synth -o`
/// share.
pub fn is_msccl_path(path: &std::path::Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("xml"))
}

/// Read an MSCCL algorithm document.
pub fn import(text: &str) -> Result<Imported, MscclError> {
    let root = crate::xml::parse_document(text)?;
    let algo = read::algo(&root)?;
    let (schedule, origin) = import::convert(&algo)?;
    Ok(Imported { schedule, origin })
}

impl Schedule {
    /// Parse an MSCCL algorithm (XML); see [`crate::schedule::msccl`]. The
    /// result is not verified yet.
    pub fn from_msccl_xml(text: &str) -> Result<Schedule, MscclError> {
        import(text).map(|i| i.schedule)
    }

    /// The schedule as MSCCL XML, or why MSCCL's model cannot express it.
    pub fn to_msccl_xml(&self) -> Result<String, MscclError> {
        export::write(self)
    }
}
