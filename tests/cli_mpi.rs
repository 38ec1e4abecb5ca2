//! `ferrocoll bench` as ranks of a job `mpirun` started (feature `mpi`):
//! every row checked over MPI links, and a rank killed mid-run — every
//! other rank ends with a typed error, mpirun exits non-zero, nothing is
//! left. Without the feature, asking for MPI links is a typed error.

use std::process::Command;
#[cfg(feature = "mpi")]
use std::process::Stdio;
#[cfg(feature = "mpi")]
use std::time::Duration;

mod common;

/// OpenMPI's mpirun on one host: shared memory between ranks, whatever
/// the library would prefer (Debian's build tries UCX first).
#[cfg(feature = "mpi")]
fn mpirun(n: u32) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
    ])
    .args(["--mca", "pml", "ob1", "--mca", "btl", "self,vader"])
    .args(["-n", &n.to_string()])
    .arg(env!("CARGO_BIN_EXE_ferrocoll"))
    .env_remove("RANK")
    .env_remove("MASTER_ADDR");
    cmd
}

/// The job's standard output, once it is known to have succeeded (its
/// standard error shown where it did not).
#[cfg(feature = "mpi")]
fn succeeded(out: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[cfg(feature = "mpi")]
#[test]
fn bench_under_mpirun_checks_every_row_over_mpi_links() {
    for transport in ["mpi", "auto"] {
        let out = mpirun(3)
            .args(["bench", "--backend", "cpu", "--transport", transport])
            .args([
                "--op", "all", "-b", "1", "-e", "1M", "-f", "64", "-n", "2", "-w", "1",
            ])
            .output()
            .expect("mpirun runs");
        let text = succeeded(&out);
        assert!(text.contains("# formed over MPI: "), "{text}");
        let links = if transport == "mpi" {
            "over mpi"
        } else {
            "over shm"
        };
        assert!(text.contains(&format!("3 processes {links}")), "{text}");
        assert!(text.contains("Out of bounds values : 0 OK"), "{text}");
    }
    // A schedule from a file runs over MPI links as any other.
    let schedule = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/schedules/star_all_reduce_3.json"
    );
    let out = mpirun(3)
        .args([
            "bench",
            "--backend",
            "cpu",
            "--transport",
            "mpi",
            "--algo",
            schedule,
        ])
        .args(["-b", "1K", "-e", "1M", "-f", "32", "-n", "2", "-w", "1"])
        .output()
        .expect("mpirun runs");
    let text = succeeded(&out);
    assert!(text.contains("from the schedule file "), "{text}");
    assert!(text.contains("Out of bounds values : 0 OK"), "{text}");
}

#[cfg(feature = "mpi")]
#[test]
fn a_rank_killed_under_mpirun_ends_every_other_rank_with_a_typed_error() {
    let secret = common::unique_secret();
    let mut job = mpirun(3)
        .args(["bench", "--backend", "cpu", "--transport", "mpi"])
        .args([
            "-b", "16M", "-e", "16M", "-n", "1000000", "-w", "0", "-c", "0",
        ])
        .env("FERROCOLL_JOB_SECRET", &secret)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun runs");
    // Every rank started and formed the group (the bench times only after
    // that); then kill rank 1, whichever process it is.
    let rank_of = |pid: u32| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .ok()
            .and_then(|env| {
                env.split(|&b| b == 0)
                    .find_map(|v| v.strip_prefix(b"OMPI_COMM_WORLD_RANK="))
                    .and_then(|r| std::str::from_utf8(r).ok()?.parse::<u32>().ok())
            })
    };
    let mut victim = None;
    for _ in 0..300 {
        std::thread::sleep(Duration::from_millis(100));
        let ranks: Vec<(u32, u32)> = common::processes_with(&secret)
            .into_iter()
            .filter_map(|pid| Some((rank_of(pid)?, pid)))
            .collect();
        if ranks.len() == 3 {
            victim = ranks.iter().find(|(r, _)| *r == 1).map(|&(_, p)| p);
            break;
        }
    }
    let victim = victim.expect("three ranks within 30 s");
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: signalling a rank of the job this test started; no memory
    // is involved.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let status = common::wait_within(&mut job, Duration::from_secs(30)).expect("mpirun ends");
    let mut stderr = String::new();
    std::io::Read::read_to_string(job.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    for survivor in [0, 2] {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("error: rank {survivor}:")))
            .unwrap_or_else(|| panic!("rank {survivor} said nothing:\n{stderr}"));
        assert!(line.contains("SIGTERM from the launcher"), "{line}");
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        common::processes_with(&secret).is_empty(),
        "left behind: {:?}",
        common::processes_with(&secret)
    );
}

#[cfg(not(feature = "mpi"))]
#[test]
fn mpi_links_in_a_build_without_mpi_are_a_typed_error() {
    let bin = env!("CARGO_BIN_EXE_ferrocoll");
    let out = Command::new(bin)
        .args([
            "launch",
            "-n",
            "2",
            "--",
            bin,
            "bench",
            "--transport",
            "mpi",
        ])
        .args(["-b", "4K", "-e", "4K", "-n", "1", "-w", "0"])
        .env_remove("RANK")
        .output()
        .expect("the binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(
            "MPI links: this build of ferrocoll has no MPI (build it with the `mpi` feature)"
        ),
        "{text}"
    );
}
