//! `ferrocoll launch` and the env:// bootstrap, end to end with real
//! processes on this machine.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{Stopped, launch_banner, launch_with_banner, processes_with, unique_secret};

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

/// Every rank runs the host kernel width the launcher measured once (the
/// stores each call takes by the same rule everywhere: no store kind is
/// forced); a variant the caller forces is passed through untouched.
#[test]
fn ranks_share_one_kernel_choice() {
    let out = ferrocoll(&[
        "launch",
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo \"k=$FERROCOLL_KERNELS\"",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let specs: Vec<&str> = text.lines().filter_map(|l| l.split("k=").nth(1)).collect();
    assert_eq!(specs.len(), 3, "{text}");
    assert!(
        specs
            .iter()
            .all(|s| *s == specs[0] && s.starts_with("in:") && s.contains(";past:")),
        "{text}"
    );
    let forced = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args([
            "launch",
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            "echo \"k=$FERROCOLL_KERNELS\"",
        ])
        .env("FERROCOLL_KERNELS", "baseline,cached")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&forced.stdout);
    assert_eq!(text.matches("k=baseline,cached").count(), 2, "{text}");
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
        assert!(err.contains("failed") && err.contains("killed"), "{err}");
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

#[test]
fn bench_runs_every_collective_across_processes_over_shm_and_tcp() {
    let bin = env!("CARGO_BIN_EXE_ferrocoll");
    for (transport, n) in [("shm", "4"), ("tcp", "3")] {
        let out = ferrocoll(&[
            "launch",
            "-n",
            n,
            "--",
            bin,
            "bench",
            "--backend",
            "cpu",
            "--transport",
            transport,
            "--op",
            "all",
            "-b",
            "1K",
            "-e",
            "256K",
            "-f",
            "16",
            "-n",
            "2",
            "-w",
            "1",
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{transport}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("Out of bounds values : 0 OK"), "{text}");
        assert!(
            text.contains(&format!("processes over {transport}")),
            "{text}"
        );
        // Only rank 0 prints the table; every collective has its section.
        for op in [
            "all-reduce",
            "reduce-scatter",
            "all-gather",
            "broadcast",
            "reduce",
            "all-to-all",
            "send-recv",
        ] {
            assert!(
                text.contains(&format!("[rank 0] # {op} on {n} ranks")),
                "{op}: {text}"
            );
        }
        assert!(!text.contains("[rank 1] #"), "{text}");
    }
}

/// The launcher killed outright (no handler runs) takes its ranks with it.
#[test]
fn a_killed_launcher_leaves_no_orphan() {
    // Each rank starts a child of its own: PR_SET_PDEATHSIG reaches the
    // rank but not its child, which only the watchdog's killpg reaches.
    let secret = unique_secret();
    let (mut child, banner) =
        launch_with_banner(&["-n", "3", "--", "sh", "-c", "sleep 60 & wait"], &secret);
    let deadline = Instant::now() + Duration::from_secs(10);
    // Three shells and their three sleeps (and the launcher itself).
    let launcher = child.id();
    let ranks = || {
        let mut p = processes_with(&secret);
        p.retain(|&p| p != launcher);
        p
    };
    while ranks().len() < 6 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ranks().len(), 6, "{banner}");
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with(&secret).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(processes_with(&secret), Vec::<u32>::new(), "orphans");
}

/// Ctrl-C while the launcher is still starting its ranks stops the
/// starting and takes down the ones already running (it once went on
/// starting every rank, deaf to signals).
#[test]
fn a_signal_while_ranks_start_stops_the_starting() {
    let secret = unique_secret();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["launch", "-n", "1024", "--", "sleep", "60"])
        .env("FERROCOLL_JOB_SECRET", &secret)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while processes_with(&secret).len() < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the launcher did not stop");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(130), "{status}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(processes_with(&secret), Vec::<u32>::new(), "orphans");
}

/// `ferrocoll` as the launched command is the launcher's own executable,
/// wherever cargo built it: the README's and CI's commands once named
/// `target/release/ferrocoll` and broke under `CARGO_TARGET_DIR`.
#[test]
fn ferrocoll_as_the_command_runs_the_launchers_own_executable() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["launch", "-n", "2", "--", "ferrocoll", "rendezvous"])
        .env("PATH", "/usr/bin:/bin")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("all 2 ranks met"), "{text}");
}

/// A bad argument is refused before any rank starts (`--grace=-1` once
/// started the ranks, then orphaned them).
#[test]
fn bad_launch_arguments_start_nothing() {
    for args in [
        &["launch", "-n", "2", "--grace=-1", "--", "sleep", "30"][..],
        &[
            "launch",
            "-n",
            "2",
            "--term-timeout=nan",
            "--",
            "sleep",
            "30",
        ][..],
        &["launch", "-n", "0", "--", "sleep", "30"][..],
        // It once started all 100 000, deaf to signals while it did.
        &["launch", "-n", "100000", "--", "sleep", "30"][..],
    ] {
        let started = Instant::now();
        let out = ferrocoll(args);
        assert!(!out.status.success(), "{args:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("pids"), "ranks were started: {err}");
    }
}

/// One process per GPU with NCCL, on a machine without NCCL: every rank
/// fails at once with rank 0's reason, none waits out a timeout.
#[test]
fn nccl_bench_under_launch_without_nccl_fails_fast_with_the_reason() {
    if ferrocoll::nccl::version().is_ok() {
        return; // NCCL is here; the GPU check runs this path for real.
    }
    let bin = env!("CARGO_BIN_EXE_ferrocoll");
    let text = gpu_bench_fails_fast(bin, "nccl", "3");
    assert!(
        text.contains("] error: rank 0 could not make the NCCL unique id: NCCL not found"),
        "{text}"
    );
    assert!(!text.contains("closed the connection"), "{text}");
}

/// One process per GPU with the CUDA executor, on a machine without
/// CUDA: every rank fails with the reason, none waits out a timeout, and
/// no board file is left in shared memory.
#[test]
fn cuda_bench_under_launch_without_cuda_fails_fast_with_the_reason() {
    if ferrocoll::cuda::probe::available().is_ok() {
        return; // A GPU is here; the GPU check runs this path for real.
    }
    let bin = env!("CARGO_BIN_EXE_ferrocoll");
    let boards = || {
        std::fs::read_dir("/dev/shm").map_or(0, |d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().contains("board-"))
                .count()
        })
    };
    let before = boards();
    let text = gpu_bench_fails_fast(bin, "cuda", "2");
    assert!(text.contains("] error: CUDA backend unavailable"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    assert_eq!(boards(), before, "{text}");
}

/// `launch -n ranks -- bench --backend backend --from-env` where the
/// backend's library is missing: it must fail, within seconds; returns
/// everything it printed.
fn gpu_bench_fails_fast(bin: &str, backend: &str, ranks: &str) -> String {
    let started = Instant::now();
    let out = ferrocoll(&[
        "launch",
        "-n",
        ranks,
        "--",
        bin,
        "bench",
        "--backend",
        backend,
        "--from-env",
        "-b",
        "1K",
        "-e",
        "1K",
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(started.elapsed() < Duration::from_secs(15), "{text}");
    text
}

/// A rank stopped mid-run (SIGSTOP): the others time out and dump their
/// flight recorders, and `ferrocoll trace` names the stopped rank (it
/// wrote no dump) and the call the others are stuck in. Before that,
/// SIGUSR1 makes a running rank dump without stopping it.
#[test]
fn the_trace_names_a_stopped_rank_and_the_call_the_others_wait_in() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-cli-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Rank 0 times out after 2 s, the others only after 60: with no
    // grace the launcher kills them while they still wait, so their dumps
    // can only come from the SIGUSR1 it sends first (before it did, CI saw
    // a survivor killed without a dump).
    let bin = env!("CARGO_BIN_EXE_ferrocoll");
    let bench = format!(
        "if [ \"$RANK\" = 0 ]; then t=2000; else t=60000; fi; \
         FERROCOLL_TIMEOUT_MS=$t exec {bin} bench --backend cpu --transport shm \
         -b 64K -e 64K -n 1000000 -w 1"
    );
    let mut launcher = Stopped(
        Command::new(bin)
            .args(["launch", "-n", "4", "--", "sh", "-c", &bench])
            .env("FERROCOLL_TRACE_DIR", &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = mpsc::channel::<String>();
    let streams: [Box<dyn std::io::Read + Send>; 2] = [
        Box::new(launcher.0.stdout.take().unwrap()),
        Box::new(launcher.0.stderr.take().unwrap()),
    ];
    for stream in streams {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    let (mut pids, mut log, mut formed) = (Vec::new(), Vec::new(), false);
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
        if line.contains("pids ") {
            pids = launch_banner(&line).0;
        }
        formed |= line.starts_with("[rank 0] #") && line.contains("on 4 ranks");
        log.push(line);
        if formed && !pids.is_empty() {
            break;
        }
    }
    assert_eq!(pids.len(), 4, "{log:#?}");
    std::thread::sleep(Duration::from_millis(500));
    let signal = |sig: &str, pid: u32| {
        assert!(
            Command::new("kill")
                .args([sig, &pid.to_string()])
                .status()
                .unwrap()
                .success()
        )
    };
    signal("-USR1", pids[0]);
    let dumped = |rank: u32| {
        std::fs::read_dir(&dir).is_ok_and(|d| {
            d.filter_map(Result::ok).any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .ends_with(&format!(".r{rank}.json"))
            })
        })
    };
    let asked = Instant::now();
    while !dumped(0) {
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "SIGUSR1 wrote no dump"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        launcher.0.try_wait().unwrap().is_none(),
        "SIGUSR1 stopped rank 0"
    );
    signal("-STOP", pids[1]);
    let stopped = Instant::now();
    while launcher.0.try_wait().unwrap().is_none() {
        assert!(
            stopped.elapsed() < Duration::from_secs(60),
            "the launcher hangs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .arg("trace")
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(!dumped(1), "a stopped rank cannot dump:\n{text}");
    assert!(text.contains("rank 1: WROTE NO DUMP"), "{text}");
    assert!(text.contains("suspects: rank 1 ("), "{text}");
    assert!(
        text.contains("first call not finished by every rank: #"),
        "{text}"
    );
    assert!(text.contains("all-reduce f32 x16384"), "{text}");
    // Every survivor dumped: by itself when it failed, or asked by the
    // launcher while still inside (or past: rank 1 may stop after feeding
    // some peers the call it then holds up).
    for r in [0, 2, 3] {
        assert!(dumped(r), "rank {r} left no dump:\n{text}");
        let at = ["failed it", "STILL INSIDE it", "finished it"];
        assert!(
            at.iter().any(|a| text.contains(&format!("rank {r}: {a}"))),
            "{text}"
        );
    }
    assert!(text.contains(": failed it"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `FERROCOLL_TRACE_DIR` set, the ranks the launcher is about to kill
/// get SIGUSR1 first, and a moment to dump: here rank 0 fails, and the
/// others (shells that write a file on SIGUSR1, as a rank writes its
/// flight recorder) are killed after writing it, not before.
#[test]
fn ranks_about_to_be_killed_are_asked_to_dump_first() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-cli-ask-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = "if [ \"$RANK\" = 0 ]; then sleep 0.5; exit 3; fi; \
                  trap 'touch \"$FERROCOLL_TRACE_DIR/r$RANK\"' USR1; \
                  while :; do sleep 0.05; done";
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["launch", "-n", "3", "--", "sh", "-c", script])
        .env("FERROCOLL_TRACE_DIR", &dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("rank 0 failed first"), "{text}");
    for r in [1, 2] {
        assert!(
            dir.join(format!("r{r}")).exists(),
            "rank {r} was not asked: {text}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(10), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
