//! The kernel watch across processes, over shared memory and TCP: the
//! parent hands its calibration on as `ferrocoll launch` does (variants
//! with the rates they were timed at), each rank makes that past-cache
//! variant slow by injection, and every rank switches to the same one at
//! the same checkpoint, with exact results before and after.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ferrocoll_core::ReduceOp;
use ferrocoll_core::comm::{Communicator, CommunicatorExt, Planning};
use ferrocoll_core::kernels::{
    KernelChoice, SharedProbe, SlowedProbe, Stores, WATCH_MIN_BYTES, WatchSettings, Width,
    calibration,
};
use ferrocoll_process::{ProcessConfig, TransportKind};

fn key(c: &KernelChoice) -> (Width, Stores) {
    (c.width(), c.stores())
}

#[test]
#[ignore = "one rank of the multi-process tests in this file: they start copies of this binary running it with FERROCOLL_TEST_RANK set; alone it does nothing"]
fn child() {
    let Some(env) = common::child_env() else {
        return;
    };
    let past = &calibration().past_cache;
    assert!(past.rate.is_some(), "the parent handed its rates on");
    let slow = key(&past.choice);
    let fast = KernelChoice::available()
        .iter()
        .map(key)
        .find(|&k| k != slow)
        .expect("the parent checked for two variants");
    let mut comm = common::connect(
        &env,
        ProcessConfig {
            planning: Planning {
                timeout: Duration::from_secs(30),
                kernel_watch: WatchSettings {
                    enabled: true,
                    probe: Some(SharedProbe(Arc::new(SlowedProbe { slow, fast }))),
                },
                ..ProcessConfig::default().planning
            },
            ..ProcessConfig::default()
        },
    );
    // Watched (8 MiB or more of input and output per rank), and past
    // this host's cache (both ranks' buffers over the threshold).
    let past = calibration().rule.threshold() / (2 * 2 * 4);
    let len = (WATCH_MIN_BYTES / 4 / 2).max(past) as usize + 13;
    for call in 0..6u32 {
        let input: Vec<f32> = (0..len)
            .map(|i| (i % 89) as f32 + (comm.rank() * 1000 + call) as f32)
            .collect();
        let mut output = vec![0.0f32; len];
        comm.all_reduce(&input, &mut output, ReduceOp::Sum).unwrap();
        let wrong = output
            .iter()
            .enumerate()
            .filter(|&(i, &x)| x != 2.0 * (i % 89) as f32 + (1000 + 2 * call) as f32)
            .count();
        assert_eq!(wrong, 0, "call {call}");
        if let [switch] = comm.kernel_switches()
            && call == 3
        {
            println!("switched after call {call} to {}", switch.to);
        }
    }
    assert_eq!(comm.kernel_switches().len(), 1);
    println!("rank {} passed", env.rank);
}

fn switches_alike(transport: TransportKind) {
    let c = calibration();
    if c.past_cache.rate.is_none() || KernelChoice::available().len() < 2 {
        eprintln!("skipped: one kernel variant here, or FERROCOLL_KERNELS forced it");
        return;
    }
    let spec = c.spec();
    let ranks = common::spawn_some(
        "child",
        "watch",
        &[0, 1],
        2,
        transport,
        &[("FERROCOLL_KERNELS", &spec)],
    );
    let finished = ranks.finish(Duration::from_secs(120), Vec::new());
    common::assert_all_ok(&finished);
    let line = |f: &common::Finished| {
        f.output
            .lines()
            .find_map(|l| l.split_once("switched after call 3"))
            .map(|(_, to)| to.to_owned())
    };
    let first = line(&finished[0]);
    assert!(first.is_some(), "{}", common::show(&finished));
    assert!(
        finished.iter().all(|f| line(f) == first),
        "{}",
        common::show(&finished)
    );
}

#[test]
fn every_rank_switches_alike_over_shm() {
    switches_alike(TransportKind::Shm);
}

#[test]
fn every_rank_switches_alike_over_tcp() {
    switches_alike(TransportKind::Tcp);
}
