//! `ferrocoll bench` with sizes and rank counts that cannot fit: a clear
//! error and exit status 2, never a panic, an abort or a hang.

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
        "more than the 1024 ranks",
    );
    refused(
        &["bench", "--ranks", "1025", "-b", "4", "-e", "4"],
        "more than the 1024 ranks",
    );
}
