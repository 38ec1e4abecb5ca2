//! The ASCII grid view of a schedule: one row per step, one column per rank.

use std::fmt::Write as _;

use super::{Schedule, Slice, Step};

/// Render `schedule` as a text grid, one table per channel.
///
/// Cell notation: `<3` receive from rank 3; `in2`/`+in2` read (and reduce
/// with) input chunk 2; `=out2` write output chunk 2; `>1` send to rank 1;
/// `x4` the step covers 4 chunks; `^c0.5` wait for step 5 of channel 0.
pub fn render_grid(schedule: &Schedule) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# {} {} n={} chunks/block={} scratch={} steps={} messages={}",
        schedule.name,
        schedule.collective,
        schedule.world_size,
        schedule.chunks_per_block,
        schedule.scratch_chunks,
        schedule.step_count(),
        schedule.message_count()
    );
    let _ = writeln!(
        out,
        "# <p recv from p | +buf reduce with | =buf write | >p send to p | xK chunks | ^cC.S after"
    );
    for channel in 0..schedule.channel_count() {
        let columns: Vec<Vec<String>> = schedule
            .ranks
            .iter()
            .map(|p| {
                p.channels
                    .get(channel)
                    .map(|steps| steps.iter().map(cell).collect())
                    .unwrap_or_default()
            })
            .collect();
        let rows = columns.iter().map(Vec::len).max().unwrap_or(0);
        let width = columns
            .iter()
            .flatten()
            .map(String::len)
            .max()
            .unwrap_or(0)
            .max(6);
        let _ = writeln!(out, "\nchannel {channel}");
        let _ = write!(out, "step ");
        for r in 0..columns.len() {
            let _ = write!(out, "| {:<width$} ", format!("rank {r}"));
        }
        out.push('\n');
        for row in 0..rows {
            let _ = write!(out, "{row:>4} ");
            for col in &columns {
                let _ = write!(
                    out,
                    "| {:<width$} ",
                    col.get(row).map_or("", String::as_str)
                );
            }
            out.push('\n');
        }
    }
    out
}

fn slice(s: &Slice) -> String {
    format!("{}{}", s.buffer.short_name(), s.chunk)
}

fn cell(step: &Step) -> String {
    let mut parts: Vec<String> = step.recv_from.iter().map(|p| format!("<{p}")).collect();
    if let Some(r) = &step.read {
        let plus = if step.recv_from.is_empty() { "" } else { "+" };
        parts.push(format!("{plus}{}", slice(r)));
    }
    if let Some(w) = &step.write {
        parts.push(format!("={}", slice(w)));
    }
    parts.extend(step.send_to.iter().map(|p| format!(">{p}")));
    if step.chunks != 1 {
        parts.push(format!("x{}", step.chunks));
    }
    parts.extend(
        step.after
            .iter()
            .map(|a| format!("^c{}.{}", a.channel, a.step)),
    );
    parts.join(" ")
}
