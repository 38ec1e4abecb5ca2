//! MPI links (feature `mpi`): groups formed inside `MPI_Init`, every rank a
//! process `mpirun` started. The conformance kit's reduced matrix over
//! MPI point-to-point for every pair at 2, 3 and 4 ranks, and over shared
//! memory inside two emulated hosts with MPI between them; a split of an
//! MPI group; and a rank that fails mid-call, which every other rank must
//! report as a typed error while mpirun ends.
//!
//! `mpirun` runs copies of this test binary, each running the ignored
//! `child` test with the scenario in `FERROCOLL_TEST_MPI`.

#![cfg(feature = "mpi")]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferrocoll_core::ReduceOp;
use ferrocoll_core::comm::{CommError, Communicator, CommunicatorExt, Planning};
use ferrocoll_core::conformance::check_rank;
use ferrocoll_process::mpi::Mpi;
use ferrocoll_process::{ProcessCommunicator, ProcessConfig, TransportKind};

/// This process's rank in `MPI_COMM_WORLD`, from the launcher's variables
/// (needed before the group forms, to pick its emulated host).
fn world_rank() -> u32 {
    std::env::var("OMPI_COMM_WORLD_RANK")
        .or_else(|_| std::env::var("PMI_RANK"))
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

#[test]
#[ignore = "one rank of the MPI tests in this file: mpirun starts copies of this binary running it with FERROCOLL_TEST_MPI set; alone it does nothing"]
fn child() {
    let Ok(scenario) = std::env::var("FERROCOLL_TEST_MPI") else {
        return;
    };
    let transport: TransportKind = std::env::var("FERROCOLL_TEST_TRANSPORT")
        .expect("the transport")
        .parse()
        .expect("a transport");
    let mpi = Mpi::init().expect("MPI starts");
    let fragment = std::env::var("FERROCOLL_TEST_FRAGMENT")
        .ok()
        .and_then(|f| f.parse().ok());
    let config = ProcessConfig {
        transport,
        mpi_fragment_bytes: fragment.unwrap_or(ProcessConfig::builtin().mpi_fragment_bytes),
        host_id: common::emulated_host(world_rank()),
        // Small messages, so that even short buffers cross many segments
        // and every slot of every link is reused.
        max_message_bytes: 4096,
        planning: Planning {
            timeout: Duration::from_secs(20),
            ..ProcessConfig::builtin().planning
        },
        ..ProcessConfig::builtin()
    };
    let mut comm = ProcessCommunicator::connect_mpi(&mpi, &config).expect("form the group");
    match scenario.as_str() {
        "conformance" => conformance(&mut comm),
        "split" => split(&mut comm),
        "fail" => fail(&mut comm),
        other => panic!("unknown scenario {other}"),
    }
}

fn conformance(comm: &mut ProcessCommunicator) {
    let mut ran = 0;
    for case in common::kit_cases(comm.world_size()) {
        comm.set_algorithm(case.algorithm);
        if let Err(e) = check_rank(comm, &case) {
            panic!("{e}");
        }
        ran += 1;
    }
    println!(
        "rank {} on {} hosts passed {ran} cases over {}",
        comm.rank(),
        comm.layout().hosts(),
        comm.links()
    );
}

/// Even and odd ranks form groups of their own, with colors and keys past
/// 2³¹ and keys that reverse the order: each part sums its ranks, and its
/// new rank 0 — the highest old rank of the part — broadcasts its old rank
/// (a part whose MPI ranks differed from ferrocoll's would send to the
/// wrong process).
fn split(comm: &mut ProcessCommunicator) {
    let rank = comm.rank();
    let n = comm.world_size();
    let mut part = comm
        .split(Some(3_000_000_000 + rank % 2), u32::MAX - rank)
        .expect("split")
        .expect("every rank has a color");
    let mine: Vec<u32> = (0..n).filter(|r| r % 2 == rank % 2).collect();
    let want_rank = mine.iter().rev().position(|&r| r == rank).unwrap() as u32;
    assert_eq!(part.rank(), want_rank, "new rank of old rank {rank}");
    let mut v = vec![rank as f32; 1001];
    part.all_reduce_in_place(&mut v, ReduceOp::Sum)
        .expect("all-reduce in the part");
    let sum: u32 = mine.iter().sum();
    assert!(v.iter().all(|&x| x == sum as f32), "{} vs {sum}", v[0]);
    let mut b = vec![rank as f64; 5000];
    part.broadcast_in_place(&mut b, 0)
        .expect("broadcast in the part");
    let root = *mine.last().unwrap();
    assert!(
        b.iter().all(|&x| x == f64::from(root)),
        "{} vs {root}",
        b[0]
    );
    // The parent still works after its split.
    let mut w = vec![1.0f64; 77];
    comm.all_reduce_in_place(&mut w, ReduceOp::Sum)
        .expect("all-reduce in the parent");
    assert!(w.iter().all(|&x| x == f64::from(n)));
    println!("rank {rank} split into {} ranks", part.world_size());
}

/// The last rank calls with a length nobody else uses; every rank must
/// end its call with a typed error, none hang.
fn fail(comm: &mut ProcessCommunicator) {
    let n = comm.world_size();
    let count = if comm.rank() == n - 1 { 4097 } else { 4096 };
    let mut v = vec![1.0f32; count];
    let started = Instant::now();
    let e = comm
        .all_reduce_in_place(&mut v, ReduceOp::Sum)
        .expect_err("a mismatched call fails");
    assert!(
        matches!(e, CommError::Mismatch { .. } | CommError::PeerFailed { .. }),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    println!("rank {} failed as it should: {e}", comm.rank());
}

/// Run `scenario` on `n` ranks under mpirun; each rank's emulated host
/// from `hosts` (comma-separated; empty: one host). Every rank's output.
fn mpirun(scenario: &str, n: u32, transport: TransportKind, hosts: &str) -> String {
    mpirun_with(scenario, n, transport, hosts, &[])
}

/// As [`mpirun`], with more variables for the ranks.
fn mpirun_with(
    scenario: &str,
    n: u32,
    transport: TransportKind,
    hosts: &str,
    env: &[(&str, &str)],
) -> String {
    let exe = std::env::current_exe().expect("this test binary");
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
    ])
    // One host: shared memory and loopback only, whatever the
    // library would prefer (Debian's build tries UCX first).
    .args(["--mca", "pml", "ob1", "--mca", "btl", "self,vader"])
    .args(["-n", &n.to_string()])
    .arg(&exe)
    .args([
        "--exact",
        "child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("FERROCOLL_TEST_MPI", scenario)
    .env("FERROCOLL_TEST_TRANSPORT", transport.to_string())
    .envs(env.iter().copied())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if hosts.is_empty() {
        cmd.env_remove("FERROCOLL_TEST_HOSTS");
    } else {
        cmd.env("FERROCOLL_TEST_HOSTS", hosts);
    }
    let child = cmd.spawn().expect("mpirun runs (OpenMPI's mpirun on PATH)");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(240)) {
        Ok(out) => out.expect("mpirun's output"),
        Err(_) => {
            // SAFETY: signalling the mpirun this test started (it forwards
            // the signal to its ranks); no memory is involved.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            panic!("mpirun {scenario} on {n} ranks did not end within 240 s");
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "mpirun {scenario}, {n} ranks: {:?}\n{text}",
        out.status
    );
    text
}

/// The kit on `n` ranks; `fragment`: the MPI links' fragment size.
fn conformance_over(
    n: u32,
    transport: TransportKind,
    (hosts, want_hosts): (&str, u32),
    links: &str,
    fragment: usize,
) {
    let fragment = fragment.to_string();
    let out = mpirun_with(
        "conformance",
        n,
        transport,
        hosts,
        &[("FERROCOLL_TEST_FRAGMENT", &fragment)],
    );
    for rank in 0..n {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("rank {rank} on {want_hosts} hosts passed")))
            .unwrap_or_else(|| panic!("rank {rank}:\n{out}"));
        assert!(line.ends_with(&format!("cases over {links}")), "{line}");
    }
}

/// Messages of up to 4 KiB and a header: fragments of 1000 bytes cut
/// every data message into several, with a short last one.
const SMALL_FRAGMENTS: usize = 1000;

#[test]
fn every_collective_conforms_over_mpi_links_at_two_to_four_ranks() {
    for n in 2..=4 {
        conformance_over(n, TransportKind::Mpi, ("", 1), "mpi", SMALL_FRAGMENTS);
    }
}

#[test]
fn whole_messages_over_mpi_links_conform() {
    conformance_over(3, TransportKind::Mpi, ("", 1), "mpi", 0);
}

#[test]
fn shared_memory_inside_hosts_and_mpi_across_conform() {
    conformance_over(
        4,
        TransportKind::Auto,
        ("a,a,b,b", 2),
        "shm inside each of 2 hosts, mpi across",
        SMALL_FRAGMENTS,
    );
}

#[test]
fn an_mpi_group_splits_into_groups_that_work() {
    let out = mpirun("split", 4, TransportKind::Mpi, "");
    for rank in 0..4 {
        assert!(
            out.contains(&format!("rank {rank} split into 2 ranks")),
            "{out}"
        );
    }
}

#[test]
fn a_mismatched_call_fails_every_rank_with_a_typed_error() {
    let out = mpirun("fail", 3, TransportKind::Mpi, "");
    for rank in 0..3 {
        assert!(
            out.contains(&format!("rank {rank} failed as it should")),
            "{out}"
        );
    }
}
