//! `ferrocoll launch` against ranks that misbehave with their output, their
//! children and their state (the third adversarial round): each test
//! failed — hung, lost output or left processes — before the fix it
//! names.

#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{alive, launch_banner, processes_with, unique_secret, wait_within};

/// `ferrocoll launch` with `args`, its job tagged by `secret`.
fn launch(args: &[&str], secret: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrocoll"));
    c.arg("launch")
        .args(args)
        .env("FERROCOLL_JOB_SECRET", secret)
        // The ranks here are shells: no kernel measurement needed.
        .env("FERROCOLL_KERNELS", "auto")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE");
    c
}

/// The pids and job id the launcher's banner (its first stderr line)
/// names, and the rest of its stderr.
fn banner(child: &mut Child) -> (Vec<u32>, String, BufReader<std::process::ChildStderr>) {
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let (pids, job) = launch_banner(&line);
    (pids, job, err)
}

fn wait_until(what: &str, within: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_rank_that_leaves_a_background_child_ends_the_job_when_it_exits() {
    // Before: the launcher waited for the pipe the `sleep` held, forever,
    // deaf to Ctrl-C.
    let secret = unique_secret();
    let mut child = launch(
        &["-n", "1", "--", "sh", "-c", "sleep 1000 & exit 0"],
        &secret,
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let status = wait_within(&mut child, Duration::from_secs(20)).expect("the launcher hung");
    assert!(status.success(), "{status}");
    wait_until(
        "the background sleep was left running",
        Duration::from_secs(5),
        || processes_with(&secret).is_empty(),
    );
}

#[test]
fn output_that_is_not_utf8_is_forwarded_byte_for_byte() {
    // Before: the first byte that was not UTF-8 stopped the forwarding
    // and the rank died of SIGPIPE on its next line.
    let script =
        r#"printf 'a\377b\n'; i=0; while [ $i -lt 3000 ]; do echo "line $i"; i=$((i+1)); done"#;
    let out = launch(&["-n", "1", "--", "sh", "-c", script], &unique_secret())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let needle: &[u8] = b"[rank 0] a\xffb\n";
    assert!(out.stdout.windows(needle.len()).any(|w| w == needle));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[rank 0] line 2999\n"), "the rest was lost");
}

#[test]
fn a_line_without_end_is_passed_on_in_bounded_memory() {
    // 300 MB with no newline. Before: held whole in memory (a 1.5 GB line
    // took 1.5 GB and more).
    let script = "head -c 300000000 /dev/zero | tr '\\0' a";
    let mut child = launch(&["-n", "1", "--", "sh", "-c", script], &unique_secret())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak_kib = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the forwarding never finished");
        if let Some(kib) = high_water_kib(pid) {
            peak_kib = peak_kib.max(kib);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.wait().unwrap().success());
    assert!(peak_kib > 0, "never measured");
    assert!(
        peak_kib < 128 << 10,
        "the launcher's peak RSS was {peak_kib} KiB"
    );
}

/// `VmHWM` of `pid`: its peak resident memory so far.
fn high_water_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn a_rank_left_stopped_after_the_others_ended_is_a_failure_not_a_wait() {
    // Before: the launcher waited for the stopped rank forever.
    let script = r#"if [ "$RANK" = 1 ]; then kill -STOP $$; fi; exit 0"#;
    let mut child = launch(
        &["-n", "2", "--term-timeout", "1", "--", "sh", "-c", script],
        &unique_secret(),
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let status = wait_within(&mut child, Duration::from_secs(20)).expect("the launcher hung");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("rank 1 failed first") && err.contains("stopped"),
        "{err}"
    );
}

#[test]
fn the_watchdog_survives_sigterm_and_still_cleans_up_after_a_killed_launcher() {
    // Before: `pkill ferrocoll` (SIGTERM) took the watchdog first; the
    // launcher SIGKILLed after it left the ranks' children running.
    let secret = unique_secret();
    let mut child = launch(&["-n", "2", "--", "sh", "-c", "sleep 60 & wait"], &secret)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (_, job, _err) = banner(&mut child);
    let launcher = child.id();
    let ranks = || {
        processes_with(&secret)
            .into_iter()
            .filter(|&p| p != launcher)
            .count()
    };
    wait_until("four rank processes", Duration::from_secs(10), || {
        ranks() == 4
    });
    let watchdog = watchdog_of(&job).expect("a watchdog runs");
    // SAFETY: signalling a process of this test's own job.
    unsafe { libc::kill(watchdog as i32, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(200));
    assert!(alive(watchdog), "SIGTERM took the watchdog");
    child.kill().unwrap();
    child.wait().unwrap();
    wait_until(
        "orphans after the launcher was killed",
        Duration::from_secs(5),
        || processes_with(&secret).is_empty(),
    );
    wait_until(
        "the watchdog outlived its job",
        Duration::from_secs(5),
        || !alive(watchdog),
    );
}

/// The watchdog process of job `job`.
fn watchdog_of(job: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|&b| b == 0).collect();
                args.contains(&&b"launch-watchdog"[..]) && args.contains(&job.as_bytes())
            }) && alive(*pid)
        })
}

#[test]
fn port_zero_is_refused_before_anything_starts() {
    // Before: accepted; the ranks failed only after the full timeout.
    let out = launch(
        &["--port", "0", "-n", "2", "--", "echo", "started"],
        &unique_secret(),
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--port"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("started"));
}

#[test]
fn ctrl_c_during_the_grace_keeps_the_first_failure() {
    // Before: the report said only "interrupted by SIGINT" (exit 130).
    let secret = unique_secret();
    let script = r#"if [ "$RANK" = 0 ]; then exit 3; fi; sleep 60"#;
    let mut child = launch(
        &["-n", "2", "--grace", "30", "--", "sh", "-c", script],
        &secret,
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let (pids, _, mut err) = banner(&mut child);
    wait_until("rank 0 to fail", Duration::from_secs(10), || {
        !alive(pids[0])
    });
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = wait_within(&mut child, Duration::from_secs(20)).expect("the launcher hung");
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert_eq!(status.code(), Some(1), "{rest}");
    assert!(rest.contains("rank 0 failed first"), "{rest}");
    assert!(rest.contains("interrupted by SIGINT"), "{rest}");
}

#[test]
fn a_launcher_whose_output_is_closed_keeps_its_ranks_running() {
    // `ferrocoll launch … | head -1`. Before: the launcher died of SIGPIPE
    // at its next line, and its ranks with it.
    let dir = std::env::temp_dir().join(format!("launch-head-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("finished");
    let script = format!(
        r#"i=0; while [ $i -lt 20000 ]; do echo "line $i"; i=$((i+1)); done; echo ok > {}"#,
        marker.display()
    );
    let mut child = launch(&["-n", "1", "--", "sh", "-c", &script], &unique_secret())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("[rank 0] line 0"), "{first}");
    // The reader is gone now: the pipe is closed.
    let status = wait_within(&mut child, Duration::from_secs(30)).expect("the launcher hung");
    assert!(status.success(), "{status}");
    assert!(marker.exists(), "the rank did not finish");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `%r` in `FERROCOLL_LOG_FILE` names the launcher's own file `launcher`,
/// and the launcher writes no timeline: before, both came out as an
/// empty file named `x` beside the ranks' (it has no `RANK`).
#[test]
fn the_launcher_names_its_log_file_and_writes_no_timeline() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-launch-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["launch", "-n", "2", "--", "true"])
        .env("FERROCOLL_LOG", "info")
        .env("FERROCOLL_LOG_FILE", dir.join("log.%r"))
        .env("FERROCOLL_TIMELINE", dir.join("timeline.%r.json"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["log.launcher"], "{names:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
