//! The launcher's safety net, round 4 of the adversarial runs
//! (docs/reliability.md): blame for the `.unwrap()` pattern (R1), a
//! watchdog that never kills a reused pid's group (R2), a wrapper whose
//! child stopped (R3) and descendants that left their group (R4).
//!
//! The ranks of the blame tests are this test binary itself, re-run by
//! `ferrocoll launch` with `FERROCOLL_TEST_ROLE` set: the `rank` test,
//! ignored otherwise, then does what a user's training script would.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{
    alive, launch_banner, launch_with_banner, processes_with, unique_secret, wait_within,
};
use ferrocoll::comm::CommunicatorExt;
use ferrocoll::process::{ProcessConfig, TransportKind};

const ROLE: &str = "FERROCOLL_TEST_ROLE";

/// A rank of the blame tests (run by `launch`, never on its own).
#[test]
#[ignore = "not a test on its own: the blame tests below run it as each rank, through `ferrocoll launch` with FERROCOLL_TEST_ROLE set"]
fn rank() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let (transport, role) = role.split_once(':').unwrap();
    let config = ProcessConfig {
        transport: if transport == "tcp" {
            TransportKind::Tcp
        } else {
            TransportKind::Shm
        },
        ..ProcessConfig::default()
    };
    let mut comm = ferrocoll::env::process_communicator_from_env(&config).unwrap();
    let mut data = vec![1.0f32; 4096];
    comm.all_reduce_in_place(&mut data, ferrocoll::ReduceOp::Sum)
        .unwrap();
    let me: u32 = std::env::var("RANK").unwrap().parse().unwrap();
    match (role, me) {
        // The culprit exits with an error of its own.
        ("exit", 1) => std::process::exit(3),
        // The culprit panics on its own bug.
        ("panic", 0) => panic!("a bug in rank 0's own code"),
        // Survivors that unwrap what the culprit's failure gave them.
        ("exit", _) => {
            comm.all_reduce_in_place(&mut data, ferrocoll::ReduceOp::Sum)
                .unwrap();
        }
        // Survivors that exit with an error code at once.
        _ => {
            if comm
                .all_reduce_in_place(&mut data, ferrocoll::ReduceOp::Sum)
                .is_err()
            {
                std::process::exit(2);
            }
        }
    }
}

fn launch_ranks(transport: &str, role: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["launch", "-n", "3", "--grace", "5", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "rank",
            "--include-ignored",
            "--test-threads",
            "1",
        ])
        .env(ROLE, format!("{transport}:{role}"))
        .env("FERROCOLL_TIMEOUT_MS", "20000")
        .output()
        .unwrap()
}

fn blamed(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    err.lines()
        .find(|l| l.contains("failed first"))
        .unwrap_or_else(|| panic!("no blame line:\n{err}"))
        .to_owned()
}

/// R1: the culprit exits 3; the survivors `.unwrap()` the `PeerFailed` it
/// gave them and exit 101 moments later. Before, a panic outranked an
/// error for 500 ms and a survivor was named in 6 of 6 runs.
#[test]
fn survivors_that_unwrap_a_peers_failure_are_not_blamed() {
    for transport in ["shm", "tcp"] {
        let out = launch_ranks(transport, "exit");
        assert!(!out.status.success());
        let line = blamed(&out);
        assert!(
            line.contains("rank 1 failed first (exit status: 3)"),
            "{transport}: {line}"
        );
    }
}

/// The other order: the culprit panics and is reaped after the peers that
/// saw it go. Their notes name them consequences.
#[test]
fn a_rank_that_panics_on_its_own_is_blamed_over_the_peers_it_failed() {
    for transport in ["shm", "tcp"] {
        let out = launch_ranks(transport, "panic");
        let line = blamed(&out);
        assert!(line.contains("rank 0 failed first"), "{transport}: {line}");
    }
}

/// Writes `last` to the kernel's last-allocated pid of this pid
/// namespace, so the next fork gets `last + 1`; `false` where that is not
/// allowed (not root, or no such file).
fn set_last_pid(last: u32) -> bool {
    std::fs::write("/proc/sys/kernel/ns_last_pid", last.to_string()).is_ok()
}

/// A process of its own group with pid `want`, if one can be made.
fn group_leader_with_pid(want: u32) -> Option<std::process::Child> {
    use std::os::unix::process::CommandExt;
    for _ in 0..50 {
        if !set_last_pid(want - 1) {
            return None;
        }
        let mut child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .ok()?;
        if child.id() == want {
            return Some(child);
        }
        child.kill().ok();
        child.wait().ok();
    }
    None
}

/// R2: a rank ends cleanly and is reaped; an unrelated process group gets
/// its old pid; the launcher is SIGKILLed. Its watchdog must kill the
/// live rank's group and leave the innocent one alone (before, it killed
/// every group it was ever told about).
#[test]
fn a_killed_launchers_watchdog_spares_a_group_that_reused_a_ranks_pid() {
    if !set_last_pid(1) {
        eprintln!("skipped: ns_last_pid is not writable here (needs root)");
        return;
    }
    let secret = unique_secret();
    let (mut launcher, banner) = launch_with_banner(
        &[
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            "if [ $RANK = 1 ]; then exit 0; fi; exec sleep 100",
        ],
        &secret,
    );
    let (pids, _) = launch_banner(&banner);
    let (live, ended) = (pids[0], pids[1]);
    let deadline = Instant::now() + Duration::from_secs(10);
    // Reaped: gone from /proc altogether, not a zombie.
    while std::path::Path::new(&format!("/proc/{ended}")).exists() {
        assert!(Instant::now() < deadline, "rank 1 was never reaped");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Give the launcher's turn after the reap time to say `gone`.
    std::thread::sleep(Duration::from_millis(100));
    let Some(mut innocent) = group_leader_with_pid(ended) else {
        eprintln!("skipped: pid {ended} could not be reused (others are forking)");
        launcher.kill().unwrap();
        launcher.wait().unwrap();
        return;
    };
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(live) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!alive(live), "the live rank outlived its launcher");
    std::thread::sleep(Duration::from_millis(300));
    let spared = innocent.try_wait().unwrap().is_none();
    innocent.kill().ok();
    innocent.wait().ok();
    assert!(
        spared,
        "the watchdog killed a group that reused rank 1's pid"
    );
}

fn launch_sh(script: &str, secret: &str) -> (Option<std::process::ExitStatus>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["launch", "-n", "2", "--term-timeout", "2", "--", "sh", "-c"])
        .arg(script)
        .env("FERROCOLL_JOB_SECRET", secret)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let status = wait_within(&mut child, Duration::from_secs(30));
    (status, reader.join().unwrap())
}

/// R3: a wrapper shell whose child stopped itself, after the other rank
/// exited cleanly. Before, the launcher read the wrapper (sleeping, not
/// stopped) and waited forever.
#[test]
fn a_wrapper_whose_child_stopped_fails_the_job_instead_of_hanging() {
    let secret = unique_secret();
    let (status, err) = launch_sh(
        r#"if [ $RANK = 1 ]; then sh -c 'kill -STOP $$'; fi; true"#,
        &secret,
    );
    let status = status.unwrap_or_else(|| panic!("the launcher hangs:\n{err}"));
    assert!(!status.success(), "{err}");
    assert!(err.contains("rank 1 failed first (stayed stopped"), "{err}");
    assert_eq!(processes_with(&secret), Vec::<u32>::new(), "left running");
}

/// R4: descendants that leave the rank's process group (`set -m`,
/// `setsid`) do not outlive the job (before: two `sleep 40` were left).
#[test]
fn descendants_that_left_their_group_do_not_outlive_the_job() {
    for script in [
        // The pause lets the background job leave the group before its
        // rank exits (else the group's kill takes it, as it should).
        "bash -c 'set -m; sleep 40 & sleep 0.3; exit 0'",
        "setsid sleep 40 & sleep 0.3; exit 0",
    ] {
        let secret = unique_secret();
        let (status, err) = launch_sh(script, &secret);
        assert!(status.is_some_and(|s| s.success()), "{script}: {err}");
        assert!(
            err.contains("processes the ranks left running outside their process groups"),
            "{script}: {err}"
        );
        assert_eq!(processes_with(&secret), Vec::<u32>::new(), "{script}");
    }
}
