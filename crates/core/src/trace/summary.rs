//! The per-op summary a run can print when its communicator goes away
//! (`FERROCOLL_SUMMARY=1`, as DeepSpeed's comms logger does): per
//! collective and size, how many calls, their latency and bus bandwidth,
//! over the calls the ring still holds.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::call::{CallState, Entry};

/// One row: a collective at one size.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    /// The collective (with its root).
    pub collective: String,
    /// Bytes of the call (nccl-tests' size).
    pub bytes: u64,
    /// Calls that finished.
    pub calls: usize,
    /// Median, 90th percentile and largest latency, µs.
    pub p50_us: f64,
    /// 90th percentile latency, µs.
    pub p90_us: f64,
    /// Largest latency, µs.
    pub max_us: f64,
    /// Bus bandwidth at the median latency, GB/s (nccl-tests' factor).
    pub busbw_p50: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// The rows of `entries` (finished collectives only) on `world_size`
/// ranks, by collective then size.
pub(super) fn rows<'a>(
    entries: impl Iterator<Item = &'a Entry>,
    world_size: u32,
) -> Vec<SummaryRow> {
    let mut groups: BTreeMap<(String, u64), (f64, Vec<f64>)> = BTreeMap::new();
    for e in entries {
        let (Some(shape), Some(end), CallState::Done) = (&e.shape, e.ended_us, &e.state) else {
            continue;
        };
        let bytes = shape.size_bytes(world_size) as u64;
        let factor = shape.collective.bus_bandwidth_factor(world_size);
        let group = groups
            .entry((shape.collective.to_string(), bytes))
            .or_insert((factor, Vec::new()));
        group.1.push(end.saturating_sub(e.started_us) as f64);
    }
    groups
        .into_iter()
        .map(|((collective, bytes), (factor, mut times))| {
            times.sort_by(f64::total_cmp);
            let p50 = percentile(&times, 0.5);
            SummaryRow {
                collective,
                bytes,
                calls: times.len(),
                p50_us: p50,
                p90_us: percentile(&times, 0.9),
                max_us: *times.last().expect("a group has a call"),
                busbw_p50: if p50 > 0.0 {
                    bytes as f64 * factor / (p50 * 1e3)
                } else {
                    0.0
                },
            }
        })
        .collect()
}

/// The rows as a table.
pub fn render(rows: &[SummaryRow]) -> String {
    let mut out = format!(
        "{:>20} {:>14} {:>8} {:>12} {:>12} {:>12} {:>11}\n",
        "collective", "bytes", "calls", "p50 (us)", "p90 (us)", "max (us)", "busbw p50"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>20} {:>14} {:>8} {:>12.1} {:>12.1} {:>12.1} {:>11.2}",
            r.collective, r.bytes, r.calls, r.p50_us, r.p90_us, r.max_us, r.busbw_p50
        );
    }
    out
}
