//! The kernel watch on a live group of threads: with the calibrated
//! past-the-cache variant made slow by injection, every rank reaches the
//! checkpoint after the same call, re-measures, and switches to the same
//! variant; results are exact before and after, and the flight recorder
//! shows the checkpoint's calls.

use std::sync::Arc;

use ferrocoll_core::ReduceOp;
use ferrocoll_core::comm::{Communicator, CommunicatorExt};
use ferrocoll_core::cpu::{self, CpuConfig};
use ferrocoll_core::kernels::{
    KernelChoice, SharedProbe, SlowedProbe, Stores, WATCH_MIN_BYTES, WatchSettings, Width,
    calibration,
};

fn key(c: &KernelChoice) -> (Width, Stores) {
    (c.width(), c.stores())
}

#[test]
fn a_group_of_threads_switches_every_rank_to_the_same_variant_and_stays_exact() {
    let past = &calibration().past_cache;
    if past.rate.is_none() {
        eprintln!("skipped: one kernel variant here, or FERROCOLL_KERNELS forced it");
        return;
    }
    let slow = key(&past.choice);
    let Some(fast) = KernelChoice::available()
        .iter()
        .map(key)
        .find(|&k| k != slow)
    else {
        return;
    };
    let mut config = CpuConfig::default();
    config.planning.kernel_watch = WatchSettings {
        enabled: true,
        probe: Some(SharedProbe(Arc::new(SlowedProbe { slow, fast }))),
    };
    // Watched (8 MiB or more of input and output per rank), and past
    // this host's cache (both ranks' buffers over the threshold).
    let past = calibration().rule.threshold() / (2 * 2 * 4);
    let len = (WATCH_MIN_BYTES / 4 / 2).max(past) as usize + 13;
    let results = cpu::run(2, &config, |comm| {
        let mut switched_after = None;
        for call in 0..6u32 {
            let input: Vec<f32> = (0..len)
                .map(|i| (i % 97) as f32 + (comm.rank() * 1000 + call) as f32)
                .collect();
            let mut output = vec![0.0f32; len];
            comm.all_reduce(&input, &mut output, ReduceOp::Sum)?;
            for (i, x) in output.iter().enumerate() {
                let want = 2.0 * (i % 97) as f32 + (1000 + 2 * call) as f32;
                assert_eq!(*x, want, "call {call}, element {i}");
            }
            if switched_after.is_none() && !comm.kernel_switches().is_empty() {
                switched_after = Some(call);
            }
        }
        let described: Vec<String> = comm
            .recorder()
            .calls()
            .iter()
            .map(|r| format!("{} {} x{}", r.collective, r.dtype, r.count))
            .collect();
        Ok((switched_after, comm.kernel_switches().to_vec(), described))
    });
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    for (switched_after, switches, _) in &results {
        // The fourth watched call is the first checkpoint.
        assert_eq!(*switched_after, Some(3));
        assert_eq!(switches.len(), 1, "{switches:?}");
        assert_eq!(key(&switches[0].from), slow);
        assert_eq!(key(&switches[0].to), fast);
    }
    assert_eq!(results[0].1, results[1].1, "every rank switched alike");
    // Six calls, and the checkpoint's three all-reduces after the fourth:
    // the vote (one value), the rates (one per variant any CPU runs) and
    // whether any rank switched (one value).
    let calls = &results[0].2;
    assert_eq!(calls.len(), 9, "{calls:?}");
    assert!(
        calls[4].ends_with("x1") && calls[5].ends_with("x6") && calls[6].ends_with("x1"),
        "{calls:?}"
    );
}
