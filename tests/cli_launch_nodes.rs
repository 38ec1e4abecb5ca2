//! `ferrocoll launch --nnodes M --node-rank K --rdzv-endpoint HOST:PORT`:
//! one launcher per host, meeting before any rank runs. Here the "hosts"
//! are launchers on this machine with different `FERROCOLL_HOST_ID`s
//! (the lab section of `.ci/run` runs the same across network
//! namespaces): torchrun's variables, one group across them, refusals
//! before any rank runs, and a failure on one host ending the others.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, unique_secret, wait_within};

/// One node's launcher: `node` of `nnodes`, `nproc` ranks, with the
/// job secret `secret`, running `command`; its output goes to `log`.
fn node(
    (node, nnodes, nproc): (u32, u32, u32),
    endpoint: &str,
    secret: &str,
    log: &Path,
    command: &[&str],
) -> Child {
    let file = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .arg("launch")
        .args(["--nnodes", &nnodes.to_string()])
        .args(["--node-rank", &node.to_string()])
        .args(["--nproc-per-node", &nproc.to_string()])
        .args(["--rdzv-endpoint", endpoint, "--rdzv-timeout", "5"])
        .arg("--")
        .args(command)
        .env("FERROCOLL_JOB_SECRET", secret)
        .env("FERROCOLL_HOST_ID", format!("node{node}"))
        // One open file for both, so neither writes over the other.
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap()
}

/// A fresh directory for one test's logs and markers.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrocoll-nodes-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn endpoint() -> String {
    format!("127.0.0.1:{}", free_port())
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// End every launcher within `limit`; their exit codes.
fn finish(children: &mut [Child], limit: Duration) -> Vec<Option<i32>> {
    children
        .iter_mut()
        .map(|c| wait_within(c, limit).and_then(|s| s.code()))
        .collect()
}

/// A job of two nodes of `nproc` ranks each running `command`: the
/// launchers, their logs and the job secret.
fn two_nodes(name: &str, nproc: u32, command: &[&str]) -> (Vec<Child>, [PathBuf; 2], String) {
    let dir = scratch(name);
    let (at, secret) = (endpoint(), unique_secret());
    let logs = [dir.join("n0"), dir.join("n1")];
    let nodes = (0..2)
        .map(|k| node((k, 2, nproc), &at, &secret, &logs[k as usize], command))
        .collect();
    (nodes, logs, secret)
}

#[test]
fn two_nodes_give_their_ranks_torchruns_variables() {
    let say = "echo vars $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR";
    let (mut nodes, logs, _) = two_nodes("vars", 2, &["sh", "-c", say]);
    assert_eq!(
        finish(&mut nodes, Duration::from_secs(30)),
        [Some(0), Some(0)]
    );
    let all = format!("{}{}", read(&logs[0]), read(&logs[1]));
    for line in [
        "vars 0 0 4 2 0 127.0.0.1",
        "vars 1 1 4 2 0 127.0.0.1",
        "vars 2 0 4 2 1 127.0.0.1",
        "vars 3 1 4 2 1 127.0.0.1",
    ] {
        assert!(all.contains(line), "no `{line}` in\n{all}");
    }
    assert!(all.contains("node 1 of 2"), "{all}");
}

#[test]
fn two_nodes_form_one_group_linked_by_shared_memory_inside_each() {
    let bench = [
        "ferrocoll",
        "bench",
        "--transport",
        "auto",
        "-b",
        "64K",
        "-e",
        "256K",
        "-n",
        "2",
        "-w",
        "1",
    ];
    let (mut nodes, logs, _) = two_nodes("group", 2, &bench);
    let codes = finish(&mut nodes, Duration::from_secs(120));
    let out = read(&logs[0]);
    assert_eq!(codes, [Some(0), Some(0)], "{out}\n{}", read(&logs[1]));
    assert!(
        out.contains("4 processes over shm inside each of 2 hosts"),
        "{out}"
    );
    assert!(out.contains("Out of bounds values : 0 OK"), "{out}");
}

/// Launchers that disagree are refused before any rank runs: each rank
/// would leave a marker file.
fn refused(nodes: &[((u32, u32, u32), bool)], expect: &str, name: &str) {
    let dir = scratch(name);
    let (at, secret) = (endpoint(), unique_secret());
    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let mut children = Vec::new();
    for (i, &(shape, right_secret)) in nodes.iter().enumerate() {
        let secret = if right_secret {
            secret.clone()
        } else {
            format!("{secret}-wrong")
        };
        children.push(node(
            shape,
            &at,
            &secret,
            &dir.join(format!("n{i}")),
            &["sh", "-c", &touch],
        ));
        // Node 0 first: it hosts the store the others meet in.
        std::thread::sleep(Duration::from_millis(100));
    }
    let started = Instant::now();
    let codes = finish(&mut children, Duration::from_secs(30));
    let logs: String = (0..nodes.len())
        .map(|i| read(&dir.join(format!("n{i}"))))
        .collect();
    assert!(
        codes.iter().all(|c| c.is_some_and(|c| c != 0)),
        "every launcher fails: {codes:?}\n{logs}"
    );
    assert!(!marker.exists(), "a rank ran\n{logs}");
    assert!(logs.contains(expect), "nobody said `{expect}`:\n{logs}");
    assert!(started.elapsed() < Duration::from_secs(20), "{logs}");
}

#[test]
fn a_node_rank_claimed_twice_is_refused_before_any_rank_runs() {
    let shapes = [((0, 3, 1), true), ((1, 3, 1), true), ((1, 3, 1), true)];
    refused(&shapes, "node rank 1 was claimed twice", "twice");
}

#[test]
fn a_node_with_another_nproc_per_node_is_refused_before_any_rank_runs() {
    let shapes = [((0, 2, 2), true), ((1, 2, 3), true)];
    refused(&shapes, "node 1 (host", "nproc");
}

#[test]
fn a_node_with_the_wrong_secret_is_refused_before_any_rank_runs() {
    let shapes = [((0, 2, 1), true), ((1, 2, 1), false)];
    refused(&shapes, "refused this process's job secret", "secret");
}

#[test]
fn a_node_that_never_arrives_is_named() {
    let shapes = [((0, 3, 1), true), ((2, 3, 1), true)];
    refused(&shapes, "node ranks [1] of 3 never arrived", "missing");
}

#[test]
fn a_rank_failing_on_one_host_stops_the_others() {
    let script = "if [ $RANK = 3 ]; then sleep 0.5; exit 3; fi; exec sleep 60";
    let (mut nodes, logs, secret) = two_nodes("failfast", 2, &["sh", "-c", script]);
    let started = Instant::now();
    let codes = finish(&mut nodes, Duration::from_secs(30));
    let all = format!("{}\n{}", read(&logs[0]), read(&logs[1]));
    assert_eq!(codes, [Some(1), Some(1)], "{all}");
    assert!(started.elapsed() < Duration::from_secs(10), "{all}");
    assert!(
        read(&logs[0]).contains("failed on another host (node 1: rank 3 failed first"),
        "{all}"
    );
    assert!(common::processes_with(&secret).is_empty(), "{all}");
}

#[test]
fn a_killed_launcher_is_noticed_by_the_other_hosts() {
    let (mut nodes, logs, secret) = two_nodes("killed", 1, &["sleep", "60"]);
    // Both running: each printed its banner.
    let until = Instant::now() + Duration::from_secs(20);
    while !(read(&logs[0]).contains("pids") && read(&logs[1]).contains("pids")) {
        assert!(
            Instant::now() < until,
            "{}{}",
            read(&logs[0]),
            read(&logs[1])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    nodes[1].kill().unwrap();
    let killed = Instant::now();
    let code = wait_within(&mut nodes[0], Duration::from_secs(20)).and_then(|s| s.code());
    let _ = nodes[1].wait();
    let out = read(&logs[0]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("node 1's launcher has been silent"), "{out}");
    assert!(killed.elapsed() < Duration::from_secs(8), "{out}");
    // Node 1's rank died with its launcher, node 0's was stopped.
    let until = Instant::now() + Duration::from_secs(5);
    while !common::processes_with(&secret).is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(common::processes_with(&secret).is_empty(), "{out}");
}

#[test]
fn node_flags_are_checked_before_anything_starts() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
            .arg("launch")
            .args(args)
            .args(["--", "true"])
            .env("FERROCOLL_JOB_SECRET", "x")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&["--nnodes", "2"]).contains("need --rdzv-endpoint"));
    let at = ["--rdzv-endpoint", "127.0.0.1:1"];
    let said = run(&[&["--nnodes", "2", "--node-rank", "2"][..], &at].concat());
    assert!(said.contains("out of range"), "{said}");
    let said = run(&["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:0"]);
    assert!(said.contains("HOST:PORT"), "{said}");
    let said = run(&[&["--nnodes", "2", "--port", "5000"][..], &at].concat());
    assert!(said.contains("--port is for one host"), "{said}");
}
