use super::*;
use crate::presets;
use ferrocoll_core::Collective;

fn selector(name: &str, n: u32) -> TopologySelector {
    TopologySelector::new(
        presets::by_name(name, n).unwrap(),
        n,
        SelectOptions::default(),
    )
    .unwrap()
}

/// Steps on the critical path of an all-reduce, per algorithm, at `n`.
fn is_latency_optimal(a: Algorithm) -> bool {
    matches!(
        a,
        Algorithm::Direct | Algorithm::Tree | Algorithm::HalvingDoubling
    )
}

#[test]
fn small_messages_pick_few_steps_and_large_ones_saturate_the_links() {
    for (name, n, bound) in [
        // Effective per-GPU rates: NVLink 4 x18 at 80 %, PCIe 4 x16 at 24/31.5.
        ("dgx-h100", 8u32, 450.0 * 20.6 / 25.0),
        ("pcie4-8gpu-2numa", 8, 24.0),
    ] {
        let s = selector(name, n);
        let small = s.verdict(Collective::AllReduce, 4 << 10).unwrap();
        assert!(
            is_latency_optimal(small.candidate.algorithm),
            "{name} 4K: {}",
            small.explain()
        );
        let large = s.verdict(Collective::AllReduce, 1 << 30).unwrap();
        assert!(
            large.prediction.busbw > 0.85 * bound,
            "{name} 1G: busbw {} of {bound}: {}",
            large.prediction.busbw,
            large.explain()
        );
    }
}

#[test]
fn on_pcie_large_all_reduce_is_a_ring_and_it_beats_direct() {
    let s = selector("pcie4-8gpu-2numa", 8);
    let plan = s.verdict(Collective::AllReduce, 256 << 20).unwrap();
    assert_eq!(
        plan.candidate.algorithm,
        Algorithm::Ring,
        "{}",
        plan.explain()
    );
    let direct = s
        .evaluate(Collective::AllReduce, 256 << 20)
        .unwrap()
        .into_iter()
        .filter(|(c, _)| c.algorithm == Algorithm::Direct)
        .map(|(_, p)| p.time_us)
        .fold(f64::INFINITY, f64::min);
    assert!(direct > 1.5 * plan.prediction.time_us, "direct {direct}");
}

#[test]
fn on_the_cpu_host_the_choice_reaches_the_memory_ceiling() {
    let s = selector("host", 4);
    let small = s.verdict(Collective::AllReduce, 4 << 10).unwrap();
    assert!(
        is_latency_optimal(small.candidate.algorithm),
        "{}",
        small.explain()
    );
    let large = s.verdict(Collective::AllReduce, 64 << 20).unwrap();
    let m = crate::probe::host::measured();
    // An in-process all-reduce reads every input and writes every output
    // once: busbw ≤ BW·(n−1)/n².
    let ceiling = m.memory_gbps * 3.0 / 16.0;
    assert!(
        large.prediction.busbw > 0.5 * ceiling && large.prediction.busbw < 1.01 * ceiling,
        "busbw {} vs ceiling {ceiling}: {}",
        large.prediction.busbw,
        large.explain()
    );
}

#[test]
fn choices_are_deterministic_cached_and_explained() {
    let a = selector("dgx1-v100", 8);
    let b = selector("dgx1-v100", 8);
    for size in [4 << 10, 1 << 20, 64 << 20] {
        let pa = a.verdict(Collective::AllReduce, size).unwrap();
        let pb = b.verdict(Collective::AllReduce, size).unwrap();
        assert_eq!(pa.candidate, pb.candidate);
        assert!(Arc::ptr_eq(
            &pa,
            &a.verdict(Collective::AllReduce, size).unwrap()
        ));
        let line = pa.explain();
        assert!(
            line.contains("predicted") && line.contains("runner-up"),
            "{line}"
        );
    }
    // Rooted and block collectives get plans too.
    for c in [
        Collective::Broadcast { root: 3 },
        Collective::Reduce { root: 1 },
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
    ] {
        a.verdict(c, 1 << 20).unwrap();
    }
}

#[test]
fn the_selector_seam_answers_only_its_world_size() {
    let s = selector("dgx-a100", 4);
    let c: &dyn Selector = &s;
    assert!(c.select(Collective::AllReduce, 8, 1 << 20).is_none());
    let selection = c.select(Collective::AllReduce, 4, 1 << 20).unwrap();
    assert!(selection.why.contains("dgx-a100"), "{}", selection.why);
    assert!(matches!(
        TopologySelector::new(
            presets::by_name("dgx-a100", 1).unwrap(),
            9,
            SelectOptions::default()
        ),
        Err(TopologyError::TooFewDevices { .. })
    ));
}
