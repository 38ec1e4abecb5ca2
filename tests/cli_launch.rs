//! `ferrocoll launch` and the env:// bootstrap, end to end with real
//! processes on this machine.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn ferrocoll(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(args)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .output()
        .expect("the binary runs")
}

#[test]
fn launched_ranks_meet_at_rank_zeros_store() {
    let bin = env!("CARGO_BIN_EXE_ferrocoll");
    let out = ferrocoll(&[
        "launch",
        "-n",
        "4",
        "--",
        bin,
        "rendezvous",
        "--timeout",
        "20",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..4 {
        assert!(
            text.contains(&format!("[rank {r}] rank {r} of 4")),
            "{text}"
        );
    }
    assert_eq!(text.matches("all 4 ranks met").count(), 4, "{text}");
}

#[test]
fn a_failing_or_killed_rank_stops_the_rest_fast() {
    for script in [
        "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 30",
        "if [ \"$RANK\" = 2 ]; then kill -9 $$; fi; sleep 30",
    ] {
        let started = Instant::now();
        let out = ferrocoll(&["launch", "-n", "4", "--", "sh", "-c", script]);
        assert!(!out.status.success());
        assert!(started.elapsed() < Duration::from_secs(10), "{script}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("failed") && err.contains("stopped"), "{err}");
    }
}

#[test]
fn a_rank_outside_a_launch_is_told_how_to_start() {
    let out = ferrocoll(&["rendezvous", "--timeout", "1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("RANK is not set") && err.contains("ferrocoll launch"),
        "{err}"
    );
}
