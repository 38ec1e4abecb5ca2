//! `ferrocoll` with sizes, rank counts, settings and inputs that cannot
//! work: a clear error and exit status 2, never a panic, an abort or a
//! hang.

use std::process::{Command, Output};

fn ferrocoll(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// Exit status 2 with an error line containing `want`, and no panic.
fn refused(args: &[&str], want: &str) {
    let out = ferrocoll(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

#[test]
fn bench_with_the_largest_size_is_an_overflow_error() {
    let max = u64::MAX.to_string();
    refused(&["bench", "-b", &max, "-e", &max], "overflows");
}

#[test]
fn bench_larger_than_memory_says_what_it_needs() {
    refused(
        &["bench", "-b", "64G", "-e", "64G", "-n", "1", "-w", "0"],
        "bench needs",
    );
    refused(
        &["bench", "-b", "64G", "-e", "64G", "-c", "0"],
        "for 4 rank(s)",
    );
}

#[test]
fn bench_with_more_ranks_than_threads_allows_is_refused() {
    refused(
        &["bench", "--ranks", "100000", "-b", "4", "-e", "4"],
        "more than the 256 ranks",
    );
    // 1024 was allowed: one 4 KiB row took a minute and 4 GB.
    refused(
        &["bench", "--ranks", "1024", "-b", "4K", "-e", "4K"],
        "more than the 256 ranks",
    );
}

#[test]
fn bench_with_absurd_iteration_counts_is_refused_not_an_abort() {
    // -n 4294967295 once aborted allocating 32 GiB for the calls' times.
    refused(
        &["bench", "-n", "4294967295", "-b", "4K", "-e", "4K"],
        "at most 1000000",
    );
    refused(
        &["bench", "-w", "4294967295", "-b", "4K", "-e", "4K"],
        "at most 1000000",
    );
}

#[test]
fn bench_with_no_timed_iterations_is_refused() {
    // It once printed times averaged over zero iterations.
    refused(
        &["bench", "-n", "0", "-b", "4K", "-e", "4K"],
        "-n (--iters)",
    );
}

#[test]
fn a_zero_timeout_is_refused_not_a_raw_socket_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["bench", "-b", "4K", "-e", "4K", "-n", "1"])
        .env("FERROCOLL_TIMEOUT_MS", "0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("FERROCOLL_TIMEOUT_MS"), "{err}");
    // One error, not a warning from the defaults followed by it.
    assert!(!err.contains("WARN"), "{err}");
}

/// Inputs that never end (`/dev/zero`) once grew memory without bound
/// (gigabytes in seconds); every file reader stops at its cap.
#[test]
fn endless_input_files_are_refused_at_the_cap() {
    if !std::path::Path::new("/dev/zero").exists() {
        return;
    }
    for args in [
        &["topo", "--smi", "/dev/zero"][..],
        &["topo", "--file", "/dev/zero"][..],
        &["topo", "--nccl-xml", "/dev/zero"][..],
        &["sim", "--topo", "dgx-h100", "--plan", "/dev/zero"][..],
    ] {
        refused(args, "larger than");
    }
}

#[test]
fn the_simulator_and_topo_refuse_absurd_rank_counts() {
    // A million host ranks once ran without end.
    refused(
        &["sim", "--topo", "host", "--ranks", "1000000"],
        "--ranks must be between 1 and",
    );
    refused(
        &["sim", "--topo", "host", "--ranks", "0"],
        "--ranks must be between 1 and",
    );
    refused(
        &["topo", "--preset", "host", "--ranks", "1000000"],
        "--ranks must be between 1 and",
    );
}

/// `ferrocoll args` with the work budget `budget`, given `within` to end.
fn with_budget(args: &[&str], budget: &str, within: std::time::Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(args)
        .env("FERROCOLL_WORK_BUDGET", budget)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() >= deadline {
            child.kill().unwrap();
            panic!("{args:?} ran past {within:?}: no work budget");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn the_topology_tools_stop_at_their_work_budget() {
    // Before: `sim` on the 64-GPU preset ran for over ten minutes, and
    // `synth` of its trees for a minute, with nothing to stop them.
    let within = std::time::Duration::from_secs(60);
    for args in [
        &["sim", "--topo", "dgx-h100x8"][..],
        &[
            "synth",
            "--topo",
            "dgx-h100x8",
            "--kind",
            "trees",
            "-o",
            "/dev/null",
        ],
        &[
            "sim", "--topo", "host", "--ranks", "1000", "-b", "4K", "-e", "4K",
        ],
    ] {
        let out = with_budget(args, "100000000", within);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("work budget"), "{args:?}: {err}");
    }
    // A small question fits the same budget.
    let out = with_budget(
        &["sim", "--topo", "dgx-h100", "-b", "4K", "-e", "64K"],
        "100000000",
        within,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    refused_with_budget("0");
    refused_with_budget("lots");
}

fn refused_with_budget(budget: &str) {
    let out = with_budget(
        &["sim", "--topo", "dgx-h100"],
        budget,
        std::time::Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("FERROCOLL_WORK_BUDGET"), "{err}");
}
