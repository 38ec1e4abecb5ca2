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
