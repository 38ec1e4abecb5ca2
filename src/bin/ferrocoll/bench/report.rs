//! The table (nccl-tests' columns), its footer, and the SVG plot (the
//! JSON and CSV files are `files.rs`).

use std::fmt::Write as _;
use std::path::Path;

use std::process::ExitCode;

use super::files::{RunFacts, write_csv, write_json};
use super::paired::{self, Paired};
use super::row::{Measure, Outside, Row};
use super::setup::Setup;
use super::target::Target;
use super::{BenchArgs, Section};
use crate::spec::AlgoSpec;
use ferrocoll::topo::probe::membw::MemoryBandwidth;

/// busbw ceiling of an in-process all-reduce (see [`paired::ceiling`])
/// from the probe before or after the sweep.
fn ceiling(bw: &MemoryBandwidth, n: u32) -> f64 {
    paired::ceiling(bw.best, n)
}

pub(crate) fn print_header(args: &BenchArgs, setup: &Setup, target: &dyn Target) {
    println!(
        "# ferrocoll bench: backend {} ranks {} minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} validation: {}",
        args.backend,
        args.ranks,
        args.min_bytes,
        args.max_bytes,
        args.step_factor,
        args.warmup,
        args.iters,
        args.check
    );
    let config = &setup.config;
    let algorithm = match (&args.algo, config.planning.algorithm) {
        (AlgoSpec::File(path), _) => format!("the schedule file {}", path.display()),
        (AlgoSpec::Auto, Some(forced)) => format!("{forced} (FERROCOLL_ALGO)"),
        (spec, _) => spec.to_string(),
    };
    if matches!(args.backend, super::Backend::Cpu) {
        println!("# host kernels: {}", ferrocoll::kernels::calibration());
    }
    for line in target.describe(args, config, &algorithm) {
        println!("{line}");
    }
}

pub(crate) fn print_membw(bw: &MemoryBandwidth, n: u32) {
    let nt = bw.nt_copy.map_or("n/a".to_owned(), |v| format!("{v:.2}"));
    println!(
        "# memory bandwidth ({} threads, GB/s): copy {:.2}  non-temporal copy {nt}  accumulate {:.2}  best {:.2}",
        bw.threads, bw.copy, bw.accumulate, bw.best
    );
    if n < 2 {
        println!("# no ceiling at n={n}: one rank moves nothing between ranks, so its busbw is 0");
        return;
    }
    println!(
        "# in-process ceiling for all-reduce busbw, BW·(n−1)/n² at n={n}: {:.2} GB/s",
        ceiling(bw, n)
    );
}

pub(crate) fn print_section(s: &Section, n: u32, spec: &AlgoSpec) {
    println!("#");
    let algorithm = match (spec.file(), s.algorithm) {
        (Some(path), _) if s.custom => format!("from the schedule file {}", path.display()),
        (_, Some(a)) => a.name().to_owned(),
        (_, None) => "auto".to_owned(),
    };
    println!("# {} on {n} ranks, algorithm {algorithm}", s.kind);
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>6}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
        "", "", "", "", "", "out-of-place", "", "", "", "in-place", "", "", ""
    );
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>6}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>6}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
}

fn cells(m: Option<Measure>) -> String {
    match m {
        Some(m) => format!(
            "{:>9.2} {:>7.2} {:>7.2} {:>6}",
            m.time_us, m.algbw, m.busbw, m.wrong
        ),
        None => format!("{:>9} {:>7} {:>7} {:>6}", "N/A", "N/A", "N/A", "N/A"),
    }
}

pub(crate) fn print_row(row: &Row, bw: Option<&MemoryBandwidth>, n: u32) {
    let mut line = format!(
        "  {:>10} {:>12} {:>8} {:>6} {:>6}   {}   {}",
        row.size,
        row.count,
        row.dtype,
        row.redop,
        row.root,
        cells(row.out_of_place),
        cells(row.in_place)
    );
    match (bw, row.out_of_place) {
        (
            _,
            Some(Measure {
                paired: Some(p), ..
            }),
        ) => {
            let _ = write!(
                line,
                "   {:.2}x ceiling (paired: {:.2}-{:.2} over {} rounds, memory {:.1} GB/s)",
                p.ratio, p.ratio_min, p.ratio_max, p.rounds, p.memory_gbps
            );
        }
        (Some(bw), Some(m)) if row.collective == "all-reduce" && n >= 2 => {
            let _ = write!(line, "   {:.2}x ceiling", m.busbw / ceiling(bw, n));
        }
        _ => {}
    }
    if let (Some(p), Some(m)) = (row.predicted_us, row.out_of_place) {
        let _ = write!(line, "   {}", prediction(p, m.time_us));
    }
    println!("{line}");
}

/// The prediction beside a measured time, saying which way it errs:
/// "(-80%)" once left readers guessing whether the model or the run was
/// the slower one.
fn prediction(predicted_us: f64, measured_us: f64) -> String {
    let ratio = predicted_us / measured_us;
    let way = if ratio < 1.0 {
        format!("{:.0}% faster than measured", 100.0 * (1.0 - ratio))
    } else {
        format!("{:.0}% slower than measured", 100.0 * (ratio - 1.0))
    };
    format!("predicted {predicted_us:.2} us = {ratio:.2}x measured ({way})")
}

/// Where rank 0's time outside the timed calls went, over every row:
/// the bench's own work (data, placing, checking) per GiB of its buffers,
/// and the calls it made untimed.
pub(crate) fn outside_line(rows: &[Row]) -> Option<String> {
    let mut all = Outside::default();
    for o in rows.iter().filter_map(|r| r.outside) {
        all.data_s += o.data_s;
        all.placing_s += o.placing_s;
        all.untimed_calls_s += o.untimed_calls_s;
        all.checking_s += o.checking_s;
        all.buffer_bytes += o.buffer_bytes;
    }
    let gib = all.buffer_bytes as f64 / f64::from(1u32 << 30);
    let own = all.data_s + all.placing_s + all.checking_s;
    // Per GiB only where there are enough of them to mean something.
    let per_gib = if gib >= 0.25 {
        format!(" ({:.2} s/GiB of rank 0's buffers)", own / gib)
    } else {
        String::new()
    };
    (all.buffer_bytes > 0).then(|| {
        format!(
            "# Outside timed calls : {own:.2} s of data {:.2}, placing {:.2}, checks {:.2}{per_gib}, \
             and {:.2} s of untimed calls",
            all.data_s, all.placing_s, all.checking_s, all.untimed_calls_s
        )
    })
}

/// Print the footer; returns the number of wrong elements.
pub(crate) fn print_footer(rows: &[Row], bw: Option<&MemoryBandwidth>, n: u32) -> u64 {
    let measures: Vec<Measure> = rows
        .iter()
        .flat_map(|r| [r.out_of_place, r.in_place])
        .flatten()
        .collect();
    let wrong: u64 = measures.iter().map(|m| m.wrong).sum();
    let avg = if measures.is_empty() {
        0.0
    } else {
        measures.iter().map(|m| m.busbw).sum::<f64>() / measures.len() as f64
    };
    println!(
        "# Out of bounds values : {wrong} {}",
        if wrong == 0 { "OK" } else { "FAILED" }
    );
    println!("# Avg bus bandwidth    : {avg:.4} ");
    if let Some(line) = outside_line(rows) {
        println!("{line}");
    }
    if let Some(bw) = bw
        && n >= 2
        && let Some(largest) = rows
            .iter()
            .filter(|r| r.collective == "all-reduce")
            .max_by_key(|r| r.size)
    {
        let paired = |m: Option<Measure>| m.and_then(|m| m.paired);
        if paired(largest.out_of_place).is_some() || paired(largest.in_place).is_some() {
            let ratio = |p: Option<Paired>| {
                p.map_or("N/A".to_owned(), |p| {
                    format!("{:.3} ({:.3}-{:.3})", p.ratio, p.ratio_min, p.ratio_max)
                })
            };
            println!(
                "# busbw / ceiling at {} B ({}), each round against the memory probed around it, median (lowest-highest): out-of-place {}, in-place {}",
                largest.size,
                largest.algorithm,
                ratio(paired(largest.out_of_place)),
                ratio(paired(largest.in_place))
            );
        }
        let ratio = |m: Option<Measure>| {
            m.map_or("N/A".to_owned(), |m| {
                format!("{:.3}", m.busbw / ceiling(bw, n))
            })
        };
        println!(
            "# busbw / ceiling at {} B ({}), against the higher probe of the sweep: out-of-place {}, in-place {}",
            largest.size,
            largest.algorithm,
            ratio(largest.out_of_place),
            ratio(largest.in_place)
        );
        let above = rows
            .iter()
            .filter(|r| r.collective == "all-reduce")
            .flat_map(|r| [r.out_of_place, r.in_place])
            .flatten()
            .any(|m| m.busbw > ceiling(bw, n) || m.paired.is_some_and(|p| p.ratio > 1.0));
        if above {
            println!(
                "# note: a ratio above 1 means a memory probe read low (it is timed on a shared, noisy host), or the data fit in cache; the paired rows show the spread of their rounds, the sweep's probes before and after bound the rest"
            );
        }
    }
    println!("#");
    wrong
}

/// The rows of `--compare nccl`, and the busbw ratio per size.
pub(crate) fn print_comparison(ours: &[Row], theirs: &[Row], bw: Option<&MemoryBandwidth>, n: u32) {
    println!("# the same on NCCL");
    for row in theirs {
        print_row(row, bw, n);
    }
    for (ours, theirs) in ours.iter().zip(theirs) {
        if let (Some(a), Some(b)) = (ours.out_of_place, theirs.out_of_place) {
            let ratio = if b.busbw > 0.0 {
                a.busbw / b.busbw
            } else {
                0.0
            };
            println!(
                "# {:>10} B: ferrocoll busbw {:.2} GB/s, NCCL {:.2} GB/s, ratio {ratio:.3}",
                ours.size, a.busbw, b.busbw,
            );
        }
    }
}

/// The footer and the files asked for; a failure exit status when any
/// element was wrong.
pub(crate) fn finish(
    args: &BenchArgs,
    rows: &[Row],
    bw: Option<&MemoryBandwidth>,
    run: &RunFacts,
) -> Result<ExitCode, String> {
    let wrong = print_footer(rows, bw, args.ranks);
    if let Some(path) = &args.json {
        write_json(path, rows, bw, run).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.csv {
        write_csv(path, rows).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        write_svg(path, rows).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub(crate) fn write_svg(path: &Path, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let Some(m) = r.out_of_place else { continue };
        let label = format!("{} {} {} {}", r.collective, r.algorithm, r.dtype, r.redop);
        let point = ((r.size.max(1) as f64).log2(), m.busbw);
        match series.iter_mut().find(|(l, _)| *l == label) {
            Some((_, pts)) => pts.push(point),
            None => series.push((label, vec![point])),
        }
    }
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p)
        .map(|p| p.0)
        .fold(1.0, f64::max);
    let x_min = series
        .iter()
        .flat_map(|(_, p)| p)
        .map(|p| p.0)
        .fold(x_max, f64::min);
    let y_max = series
        .iter()
        .flat_map(|(_, p)| p)
        .map(|p| p.1)
        .fold(0.0, f64::max)
        * 1.1
        + 1e-9;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("busbw vs message size (out-of-place)", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x_min..x_max.max(x_min + 1.0), 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("size (bytes)")
        .y_desc("busbw (GB/s)")
        .x_label_formatter(&|x| human(2f64.powf(*x)))
        .draw()?;
    for (i, (label, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    Ok(())
}

fn human(bytes: f64) -> String {
    let b = bytes.round() as u64;
    match b {
        b if b >= 1 << 30 => format!("{}G", b >> 30),
        b if b >= 1 << 20 => format!("{}M", b >> 20),
        b if b >= 1 << 10 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::{Outside, Row, outside_line, prediction};

    /// The footer adds every row's time outside the calls, and prices it
    /// per GiB only where the rows' buffers make a quarter of one.
    #[test]
    fn the_time_outside_the_calls_adds_up_over_rows() {
        let row = |bytes: usize, s: f64| Row {
            collective: "all-reduce".into(),
            algorithm: "auto".into(),
            ranks: 2,
            size: bytes / 2,
            count: bytes / 8,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            out_of_place: None,
            in_place: None,
            predicted_us: None,
            outside: Some(Outside {
                data_s: s,
                placing_s: s,
                untimed_calls_s: 1.0,
                checking_s: s,
                buffer_bytes: bytes,
            }),
        };
        let big = outside_line(&[row(1 << 29, 0.25), row(1 << 29, 0.25)]).unwrap();
        assert!(
            big.contains(": 1.50 s of data 0.50, placing 0.50, checks 0.50 (1.50 s/GiB")
                && big.contains("and 2.00 s of untimed calls"),
            "{big}"
        );
        let small = outside_line(&[row(4096, 0.01)]).unwrap();
        assert!(!small.contains("s/GiB"), "{small}");
        let none = Row {
            outside: None,
            ..row(4096, 0.0)
        };
        assert_eq!(
            outside_line(&[none]),
            None,
            "rows that kept no account say nothing"
        );
    }

    #[test]
    fn a_prediction_says_which_way_it_errs() {
        let fast = prediction(8.0, 10.0);
        assert!(
            fast.contains("0.80x measured") && fast.contains("20% faster"),
            "{fast}"
        );
        let slow = prediction(15.0, 10.0);
        assert!(
            slow.contains("1.50x measured") && slow.contains("50% slower"),
            "{slow}"
        );
    }
}
