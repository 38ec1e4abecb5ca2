//! Deaths and absurd sizes while a shared-memory group forms: survivors
//! notice within about a second (not the 60 s store timeout) and no
//! segment is left in tmpfs; an absurd world size is refused before any
//! file exists (it once left a sparse multi-petabyte file behind), and
//! over TCP before any connection is attempted.

mod common;

use ferrocoll_core::comm::Planning;
use std::time::{Duration, Instant};

use ferrocoll_process::{ProcessCommunicator, ProcessConfig, SetupError, TransportKind};
use ferrocoll_rendezvous::{Server, Store};

const SETUP_FAILED: i32 = 3;

#[test]
#[ignore = "one rank of the multi-process tests in this file: they start copies of this binary running it with FERROCOLL_TEST_RANK set; alone it does nothing"]
fn child() {
    let Some(env) = common::child_env() else {
        return;
    };
    let store = Store::join(&env.store, 1, Duration::from_secs(30)).expect("join the store");
    let config = ProcessConfig {
        transport: env.transport,
        planning: Planning {
            timeout: Duration::from_secs(60),
            ..ProcessConfig::default().planning
        },
        // The environment's settings: the job id names the segments.
        ..ProcessConfig::default()
    };
    match ProcessCommunicator::connect(store, env.rank, env.world_size, &config) {
        Ok(_) => println!("rank {} formed the group", env.rank),
        Err(e) => {
            println!("rank {} setup error: {e}", env.rank);
            std::process::exit(SETUP_FAILED);
        }
    }
}

/// A job id no other test uses, so only this test's segments are counted.
fn job_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("t{}x{nanos}", std::process::id())
}

fn segments_of(job: &str) -> Vec<String> {
    let prefix = format!("ferrocoll-{job}.");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Every survivor fails its setup naming rank 2, within 2 s of the kill.
fn survivors_name_rank_2_at_once(finished: Vec<common::Finished>, killed_at: Duration) {
    for f in finished.iter().filter(|f| f.rank != 2) {
        assert_eq!(f.code, Some(SETUP_FAILED), "rank {}: {}", f.rank, f.output);
        assert!(
            f.output.contains("rank 2") && f.output.contains("exited while the group was forming"),
            "{}",
            f.output
        );
        let took = f.at.saturating_sub(killed_at);
        assert!(
            took < Duration::from_secs(2),
            "rank {} took {took:?}",
            f.rank
        );
        println!("rank {} noticed the death in {took:?}", f.rank);
    }
}

#[test]
fn a_rank_killed_during_shm_setup_is_noticed_at_once_and_leaves_no_segment() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        return;
    }
    let job = job_id();
    // Rank 3 never starts, so ranks 0-2 write their files and wait for
    // its; then rank 2 dies before anyone could unlink anything.
    let mut ranks = common::spawn_some(
        "child",
        "setup",
        &[0, 1, 2],
        4,
        TransportKind::Shm,
        &[("FERROCOLL_JOB_ID", &job)],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    // Since host discovery, the files are the ranks' host probes (the
    // segments come after every rank's card, and rank 3's never comes).
    while segments_of(&job).len() < 3 {
        assert!(Instant::now() < deadline, "segments never appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
    ranks.children[2].kill().unwrap();
    let killed_at = ranks.started.elapsed();
    survivors_name_rank_2_at_once(ranks.finish(Duration::from_secs(90), Vec::new()), killed_at);
    assert_eq!(segments_of(&job), Vec::<String>::new(), "leaked segments");
}

#[test]
fn a_rank_killed_during_tcp_setup_is_noticed_at_once() {
    // As above over TCP: ranks 0-2 connect and wait for rank 3, which
    // never starts; then rank 2 dies. Survivors once waited out the whole
    // timeout for its connection or for the store's last barrier.
    let mut ranks = common::spawn_some("child", "setup", &[0, 1, 2], 4, TransportKind::Tcp, &[]);
    std::thread::sleep(Duration::from_millis(1500));
    ranks.children[2].kill().unwrap();
    let killed_at = ranks.started.elapsed();
    survivors_name_rank_2_at_once(ranks.finish(Duration::from_secs(90), Vec::new()), killed_at);
}

#[test]
fn an_absurd_world_size_is_refused_before_any_segment_exists() {
    for world_size in [1_000_000u32, u32::MAX] {
        let server = Server::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let store = Store::join(&server.addr().to_string(), 1, Duration::from_secs(5)).unwrap();
        let config = ProcessConfig {
            planning: Planning {
                timeout: Duration::from_secs(2),
                ..ProcessConfig::builtin().planning
            },
            ..ProcessConfig::builtin()
        };
        let started = Instant::now();
        let err = ProcessCommunicator::connect(store, 0, world_size, &config).unwrap_err();
        assert!(matches!(err, SetupError::ShmSpace { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(1), "{err}");
        assert!(err.to_string().contains("--transport tcp"), "{err}");
        // Over TCP it would need a connection per peer: refused as fast.
        let store = Store::join(&server.addr().to_string(), 1, Duration::from_secs(5)).unwrap();
        let tcp = ProcessConfig {
            transport: TransportKind::Tcp,
            ..config
        };
        let started = Instant::now();
        let err = ProcessCommunicator::connect(store, 0, world_size, &tcp).unwrap_err();
        assert!(
            matches!(err, SetupError::TooManyConnections { .. }),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(1), "{err}");
    }
}
