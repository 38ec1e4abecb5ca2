use super::*;
use crate::presets;
use ferrocoll_core::Collective;
use ferrocoll_core::comm::Planning;

fn selector(name: &str, n: u32) -> TopologySelector {
    TopologySelector::new(
        presets::by_name(name, n).unwrap(),
        n,
        SelectOptions::default(),
    )
    .unwrap()
}

/// Steps on the critical path of an all-reduce, per algorithm, at `n`.
fn is_latency_optimal(a: Option<Algorithm>) -> bool {
    matches!(
        a,
        Some(Algorithm::Direct | Algorithm::Tree | Algorithm::HalvingDoubling)
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
        // Few steps: direct, a tree, halving-doubling, or a packing of
        // trees synthesized for the topology.
        assert!(
            is_latency_optimal(small.candidate.algorithm()) || small.candidate.family() == "trees",
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
        plan.candidate.algorithm(),
        Some(Algorithm::Ring),
        "{}",
        plan.explain()
    );
    let direct = s
        .evaluate(Collective::AllReduce, 256 << 20)
        .unwrap()
        .into_iter()
        .filter(|(c, _)| c.algorithm() == Some(Algorithm::Direct))
        .map(|(_, p)| p.time_us)
        .fold(f64::INFINITY, f64::min);
    assert!(direct > 1.5 * plan.prediction.time_us, "direct {direct}");
}

#[test]
fn on_the_cpu_host_the_choice_reaches_the_memory_ceiling() {
    let s = selector("host", 4);
    let small = s.verdict(Collective::AllReduce, 4 << 10).unwrap();
    assert!(
        is_latency_optimal(small.candidate.algorithm()),
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

/// `evaluate` simulates a plan once for every chunk size that cuts the
/// call alike; each answer must be the one simulating that candidate on
/// its own gives, at sizes where chunks cut alike and where they do not.
#[test]
fn candidates_that_share_a_plan_get_what_each_alone_would_get() {
    let s = selector("dgx-h100", 8);
    let c = Collective::AllReduce;
    for size in [4 << 10, 1 << 20, 256 << 20] {
        let evaluated = s.evaluate(c, size).unwrap();
        let fidelity = s.fidelity_at(&s.candidates_at(c, size), c, size).unwrap();
        let mut shared = 0;
        for (i, (candidate, p)) in evaluated.iter().enumerate() {
            let alone = s.predict_with(candidate, c, size, fidelity).unwrap();
            assert_eq!(*p, alone, "{candidate} at {size} B");
            shared += evaluated[..i]
                .iter()
                .filter(|(o, q)| o.choice == candidate.choice && q == p)
                .count()
                .min(1);
        }
        // A call smaller than every chunk cuts alike at every chunk.
        if size == 4 << 10 {
            assert!(
                shared * 2 >= evaluated.len(),
                "{shared} of {}",
                evaluated.len()
            );
        }
    }
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

/// The best prediction of each family (`ring`, `trees`, ...) at `size`.
fn best_of(s: &TopologySelector, c: Collective, size: usize, family: &str) -> Option<f64> {
    s.evaluate(c, size)
        .unwrap()
        .into_iter()
        .filter(|(cand, _)| cand.family() == family)
        .map(|(_, p)| p.busbw)
        .reduce(f64::max)
}

#[test]
fn auto_runs_a_tree_packing_where_no_nvlink_ring_exists() {
    use ferrocoll_core::comm::{Communicator, CommunicatorExt};
    use ferrocoll_core::select::SharedSelector;
    use std::collections::BTreeMap;
    // DGX-1V GPUs 0-4: every ring crosses PCIe; trees keep to NVLink.
    let t = presets::by_name("dgx1-v100", 0)
        .unwrap()
        .with_devices(&[0, 1, 2, 3, 4])
        .unwrap();
    let options = SelectOptions {
        channel_multipliers: vec![1, 4],
        chunk_sizes: vec![512 << 10],
        ..SelectOptions::default()
    };
    let s = TopologySelector::new(t, 5, options).unwrap();
    let large = s.verdict(Collective::AllReduce, 256 << 20).unwrap();
    assert_eq!(large.candidate.family(), "trees", "{}", large.explain());
    let ring = best_of(&s, Collective::AllReduce, 256 << 20, "ring").unwrap();
    assert!(
        large.prediction.busbw > 1.5 * ring,
        "{} vs ring {ring}",
        large.explain()
    );
    // Small enough to run here, large enough for trees to win.
    let size = 8 << 20;
    let v = s.verdict(Collective::AllReduce, size).unwrap();
    assert_eq!(v.candidate.family(), "trees", "{}", v.explain());
    for c in [Collective::AllGather, Collective::ReduceScatter] {
        assert!(best_of(&s, c, size, "trees").is_some(), "{c}");
    }
    // The seam hands out the proven schedule itself, the same one each time.
    let selection = s.select(Collective::AllReduce, 5, size).unwrap();
    let Choice::Synthesized(trees) = &selection.choice else {
        panic!("{selection:?}")
    };
    let again = s.select(Collective::AllReduce, 5, size).unwrap();
    assert!(matches!(&again.choice, Choice::Synthesized(t) if Arc::ptr_eq(t, trees)));
    // The CPU executor runs it (the link traffic is the trees' plan) and
    // gets the serial answer.
    let count = size / 4;
    let plan = Compiler::new(trees.clone())
        .compile(
            &ferrocoll_core::types::CallShape {
                collective: Collective::AllReduce,
                count,
                dtype: DataType::F32,
                op: ferrocoll_core::ReduceOp::Sum,
                in_place: false,
                purpose: Default::default(),
            },
            ferrocoll_core::plan::Chunking::MaxBytes(512 << 10),
            ferrocoll_core::verify::DEFAULT_SLOTS_PER_LINK,
        )
        .unwrap();
    let config = ferrocoll_core::cpu::CpuConfig {
        planning: Planning {
            selector: Some(SharedSelector(Arc::new(s))),
            ..ferrocoll_core::cpu::CpuConfig::default().planning
        },
        ..Default::default()
    };
    let out = ferrocoll_core::cpu::run(5, &config, |comm| {
        let input: Vec<f32> = (0..count)
            .map(|i| (i % 7) as f32 + comm.rank() as f32)
            .collect();
        let mut output = vec![0.0f32; count];
        comm.all_reduce(&input, &mut output, ferrocoll_core::ReduceOp::Sum)?;
        let wrong = (0..count)
            .filter(|&i| output[i] != (5 * (i % 7) + 10) as f32)
            .count();
        let traffic: BTreeMap<_, u64> = comm
            .link_traffic()
            .into_iter()
            .map(|l| ((l.link.from, l.link.to, l.link.channel), l.bytes))
            .collect();
        Ok((wrong, traffic))
    });
    let mut moved: BTreeMap<_, u64> = BTreeMap::new();
    for r in out {
        let (wrong, traffic) = r.unwrap();
        assert_eq!(wrong, 0);
        for (k, b) in traffic {
            *moved.entry(k).or_default() += b;
        }
    }
    let planned: BTreeMap<_, u64> = plan
        .links
        .iter()
        .map(|l| ((l.link.from, l.link.to, l.link.channel), l.bytes))
        .collect();
    assert_eq!(moved.len(), planned.len());
    for (k, b) in planned {
        assert!(moved.get(&k).is_some_and(|m| *m >= b), "link {k:?}");
    }
}

#[test]
fn across_machines_the_hierarchical_all_reduce_beats_the_flat_ring() {
    // Two GPUs in each of two DGX A100s.
    let t = presets::by_name("dgx-a100x2", 0)
        .unwrap()
        .with_devices(&[0, 1, 8, 9])
        .unwrap();
    let options = SelectOptions {
        channel_multipliers: vec![1, 4],
        chunk_sizes: vec![2 << 20],
        ..SelectOptions::default()
    };
    let s = TopologySelector::new(t, 4, options).unwrap();
    let size = 256 << 20;
    let ring = best_of(&s, Collective::AllReduce, size, "ring").unwrap();
    let hier = best_of(&s, Collective::AllReduce, size, "hierarchical").unwrap();
    assert!(hier > 1.3 * ring, "hierarchical {hier} vs ring {ring}");
    let v = s.verdict(Collective::AllReduce, size).unwrap();
    assert!(v.candidate.algorithm().is_none(), "{}", v.explain());
    // Not for other collectives, nor within one machine.
    assert!(best_of(&s, Collective::AllGather, size, "hierarchical").is_none());
    let one = selector("dgx-a100", 8);
    assert!(
        one.synthesized(Collective::AllReduce)
            .iter()
            .all(|(v, _)| v.schedule().name != "hierarchical")
    );
}

#[test]
fn synthesis_is_left_out_on_threads_and_when_algorithms_are_listed() {
    let host = selector("host", 4);
    assert!(host.synthesized(Collective::AllReduce).is_empty());
    let listed = TopologySelector::new(
        presets::by_name("dgx-a100x2", 0).unwrap(),
        16,
        SelectOptions {
            algorithms: vec![Algorithm::Ring],
            ..SelectOptions::default()
        },
    )
    .unwrap();
    assert!(listed.synthesized(Collective::AllReduce).is_empty());
    assert!(
        listed
            .candidates(Collective::AllReduce)
            .iter()
            .all(|c| c.algorithm() == Some(Algorithm::Ring))
    );
}

#[test]
fn small_calls_on_gpus_take_the_low_latency_protocol_and_large_ones_the_bulk() {
    let s = selector("dgx-h100", 8);
    let small = s.verdict(Collective::AllReduce, 8 << 10).unwrap();
    assert_eq!(
        small.candidate.protocol,
        Some(Protocol::LowLatency),
        "{}",
        small.explain()
    );
    assert!(small.explain().contains(" LL"), "{}", small.explain());
    // LL's share of the links loses once bandwidth matters.
    for size in [1 << 20, 256 << 20] {
        let large = s.verdict(Collective::AllReduce, size).unwrap();
        assert_eq!(
            large.candidate.protocol,
            Some(Protocol::Simple),
            "{size}: {}",
            large.explain()
        );
    }
    let picked = s.select(Collective::AllReduce, 8, 8 << 10).unwrap();
    assert_eq!(picked.protocol, Some(Protocol::LowLatency));
    // At the same schedule and size, LL is predicted faster exactly when
    // the call is latency-bound: its fixed costs are lower, its rate less.
    let model = CostModel::default();
    let ll = model.low_latency(true);
    assert!(ll.gpu_call_us < model.gpu_call_us && ll.gpu_step_us <= model.gpu_step_us);
    assert!(ll.nvlink_efficiency[3] < model.nvlink_efficiency[3]);
    // CPU threads have one way to move messages: no protocol to choose.
    let threads = s_threads();
    let v = threads.verdict(Collective::AllReduce, 8 << 10).unwrap();
    assert_eq!(v.candidate.protocol, None);
}

/// What the selector simulates with LL is what the device interpreter
/// can run with LL: every LL candidate's widest message fits one LL
/// message, at the options' capacity, whatever the schedule's widest step.
#[test]
fn ll_candidates_cut_their_chunk_so_the_widest_message_fits_an_ll_slot() {
    for (ll_message_bytes, collective) in [
        (LL_MESSAGE_BYTES, Collective::AllReduce),
        (LL_MESSAGE_BYTES, Collective::AllGather),
        (4 << 10, Collective::AllReduce),
        (4 << 10, Collective::ReduceScatter),
    ] {
        let s = TopologySelector::new(
            presets::by_name("dgx-h100", 8).unwrap(),
            8,
            SelectOptions {
                ll_message_bytes,
                ..SelectOptions::default()
            },
        )
        .unwrap();
        let ll: Vec<Candidate> = s
            .candidates_at(collective, 8 << 10)
            .into_iter()
            .filter(|c| c.protocol == Some(Protocol::LowLatency))
            .collect();
        assert!(!ll.is_empty());
        let mut cut = false;
        for c in &ll {
            let widest = s
                .compiler(c, collective)
                .unwrap()
                .verified()
                .schedule()
                .widest_step() as usize;
            assert!(
                c.max_chunk_bytes * widest <= ll_message_bytes,
                "{c}: {} x {widest} > {ll_message_bytes}",
                c.max_chunk_bytes
            );
            assert_eq!(c.max_chunk_bytes % 4, 0, "{c}: whole f32 elements");
            cut |= widest > 1 && c.max_chunk_bytes < ll_message_bytes;
        }
        // Some schedule sends several chunks in one step, or the test
        // checks nothing the old fixed grain got wrong.
        assert!(cut, "{collective}: no LL candidate with a wide step");
    }
}

fn s_threads() -> TopologySelector {
    TopologySelector::new(threads(4), 4, SelectOptions::default()).unwrap()
}

fn threads(n: u32) -> Topology {
    presets::host(n, &crate::probe::HostMeasurement::example())
}

/// Ring and direct schedules past what a plan may hold are never built
/// (at 1,000 ranks, building and proving them once asked for a 2.17 GB
/// block and aborted under an address-space limit); past the built-in
/// schedules' world size a selector is refused by name.
#[test]
fn schedules_that_no_plan_could_hold_are_not_candidates_and_huge_worlds_are_refused() {
    let n = 400;
    let options = SelectOptions {
        channel_multipliers: vec![1, 16],
        algorithms: vec![Algorithm::Ring],
        ..SelectOptions::default()
    };
    let s = TopologySelector::new(threads(n), n, options).unwrap();
    let channels: Vec<u32> = s
        .candidates(Collective::AllReduce)
        .iter()
        .map(|c| c.choice.channels())
        .collect();
    // x16 has 400 × 16 × 799 = 5.1 M steps, past the 4.19 M a plan holds.
    assert!(
        channels.contains(&1) && !channels.contains(&16),
        "{channels:?}"
    );
    assert_eq!(
        linear_steps(Algorithm::Ring, Collective::AllReduce, n, 16),
        Some(5_113_600)
    );
    assert!(check_plan_steps(5_113_600, Algorithm::Ring, 16, n).is_err());
    let err = TopologySelector::new(threads(1100), 1100, SelectOptions::default()).unwrap_err();
    assert!(
        matches!(err, TopologyError::TooManyRanks { ranks: 1100, .. }),
        "{err}"
    );
}
