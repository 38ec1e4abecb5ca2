//! What of `scripts/gpu-check.sh` and `scripts/gpu-table.py` can be tried
//! without a GPU: the usage, and a table from the files a partial run
//! leaves (a step that failed must not cost the others their rows).

use std::process::Command;

fn script(args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gpu-check.sh"))
        .args(args)
        .output()
        .expect("bash runs")
}

#[test]
fn help_prints_the_usage_and_an_unknown_argument_starts_nothing() {
    let out = script(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("--build") && text.contains("Steps"), "{text}");
    let out = script(&["--bilud"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown argument"));
}

/// Only the LL small-call file of K = 2 exists (the Simple step failed):
/// the table still has its rows, and says "no run" where nothing ran.
#[test]
fn the_table_rows_every_file_that_exists() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-gpu-table-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("lat-ll-2.json");
    let bench = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["bench", "--ranks", "2", "-b", "8", "-e", "64", "-f", "8"])
        .args(["-n", "2", "-w", "0", "-J"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(bench.status.success());
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gpu-table.py"))
        .arg(&dir)
        .output()
        .expect("python3 runs (CI installs wheels with it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("| 2 | 8 B | - |"), "{text}");
    assert!(text.contains("| 2 | 64 B | - |"), "{text}");
    assert!(text.contains("| 8 | (no run)"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn ferrocoll(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// The calibration rows from the files the check's calibration steps
/// write (here from CPU runs of the same commands): a block's rate from
/// the one-rank copy, an instruction's cost from the difference of the
/// 8 B calls over the plan's instructions per rank.
#[test]
fn the_calibration_rows_come_from_the_runs() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-gpu-cal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let at = |name: &str| dir.join(name).display().to_string();
    let block = at("cal-block.json");
    let out = ferrocoll(&[
        "bench",
        "--ranks",
        "1",
        "--algo",
        "ring",
        "--channels",
        "1",
        "-b",
        "1M",
        "-e",
        "1M",
        "-n",
        "3",
        "-w",
        "1",
        "-c",
        "0",
        "-J",
        &block,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for k in ["1", "8"] {
        let json = at(&format!("cal-ins-{k}.json"));
        let out = ferrocoll(&[
            "bench",
            "--ranks",
            k,
            "--algo",
            "ring",
            "--channels",
            "1",
            "-b",
            "8",
            "-e",
            "8",
            "-n",
            "20",
            "-w",
            "2",
            "-c",
            "0",
            "-J",
            &json,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let plan = ferrocoll(&[
            "plan",
            "--algo",
            "ring",
            "--ranks",
            k,
            "--channels",
            "1",
            "--count",
            "2",
        ]);
        let text = String::from_utf8_lossy(&plan.stdout);
        // The same extraction as the script's.
        let total = text
            .split("; ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .expect("the plan's header names its instructions");
        std::fs::write(at(&format!("cal-instructions-{k}.txt")), total).unwrap();
    }
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gpu-table.py"))
        .arg(&dir)
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("| {name}")))
            .unwrap_or_else(|| panic!("no {name} row: {text}"))
            .to_owned()
    };
    let block = row("gpu_block_gbps");
    let measured: f64 = block
        .split('|')
        .nth(2)
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{block}"));
    assert!(measured > 0.0, "{block}");
    let ins = row("gpu_instruction_us");
    assert!(
        ins.split('|').nth(2).unwrap().trim().parse::<f64>().is_ok(),
        "{ins}"
    );
    assert!(ins.contains("over (15 − 1) instructions per rank"), "{ins}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The table prints the simulator's assumptions beside what it measured:
/// they must be the simulator's.
#[test]
fn the_table_assumes_what_the_simulator_assumes() {
    let table = include_str!("../scripts/gpu-table.py");
    let cost = include_str!("../crates/topo/src/sim/cost.rs");
    let value = |text: &str, prefix: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}`"));
        let v = line[prefix.len()..].trim().trim_end_matches(';');
        v.parse().unwrap_or_else(|_| panic!("{line}"))
    };
    assert_eq!(
        value(table, "ASSUMED_BLOCK_GBPS = "),
        value(cost, "pub const GPU_BLOCK_GBPS: f64 = ")
    );
    assert_eq!(
        value(table, "ASSUMED_INSTRUCTION_US = "),
        value(cost, "pub const GPU_INSTRUCTION_US: f64 = ")
    );
}
