//! The ring search's work is bounded: exact up to
//! `EXHAUSTIVE_MAX_RANKS`, a heuristic of at most `HEURISTIC_BUDGET`
//! candidates per ring above, and the heuristic still finds the rings a
//! full mesh offers.

mod common;

use ferrocoll_topo::search::{self, HEURISTIC_BUDGET, MAX_RINGS, RingSet};
use ferrocoll_topo::sim::CostModel;
use ferrocoll_topo::{LinkKind, Node, NodeKind, Topology};

/// What one set may cost at most, whatever the graph.
const SET_BUDGET: u64 = MAX_RINGS as u64 * HEURISTIC_BUDGET;

fn search(t: &Topology) -> RingSet {
    search::rings(t, &t.devices(), &CostModel::default(), MAX_RINGS).unwrap()
}

/// Every ring edge of the set is one direct link of `t`.
fn rings_stay_on_direct_links(t: &Topology, s: &RingSet) -> bool {
    let devices = t.devices();
    s.orders.iter().all(|o| {
        (0..o.len()).all(|i| {
            let (a, b) = (
                devices[o[i] as usize],
                devices[o[(i + 1) % o.len()] as usize],
            );
            t.route(a, b).unwrap().links.len() == 1
        })
    })
}

#[test]
fn a_full_nvlink_mesh_of_128_gpus_gets_full_bandwidth_rings_within_budget() {
    for n in [64, 128] {
        let t = common::mesh(n);
        let s = search(&t);
        assert!(
            s.candidates <= SET_BUDGET,
            "{n}: {} candidates",
            s.candidates
        );
        // Each ring on disjoint direct links: the set is MAX_RINGS links wide.
        let one = search::rings(&t, &t.devices(), &CostModel::default(), 1).unwrap();
        assert_eq!(s.orders.len(), MAX_RINGS, "{n}");
        assert!(
            (s.bandwidth - MAX_RINGS as f64 * one.bandwidth).abs() < 1e-6 * s.bandwidth,
            "{n}: {} vs {} per ring",
            s.bandwidth,
            one.bandwidth
        );
        assert!(rings_stay_on_direct_links(&t, &s), "{n}");
    }
}

#[test]
fn an_all_nvlink_smi_matrix_of_128_gpus_is_searched_within_budget() {
    for n in [16, 64, 128] {
        let t = common::all_nvlink_smi(n);
        let s = search(&t);
        assert!(
            s.candidates <= SET_BUDGET,
            "{n}: {} candidates",
            s.candidates
        );
        // Behind one NVSwitch every ring is as fast: one ring at the
        // GPU's full 18 links of 20 GB/s payload, and no second ring adds
        // anything.
        assert_eq!(s.orders.len(), 1, "{n}");
        assert!((s.bandwidth - 18.0 * 20.0).abs() < 1e-6, "{n}: {s:?}");
    }
}

/// `n` GPUs on one CPU's PCIe, with NVLinks along a ring in a shuffled
/// order and a few random chords: a sparse, irregular graph whose only
/// fast rings are hidden from the rank order.
fn sparse(n: usize, seed: u64) -> Topology {
    let mut t = Topology::new("sparse", "random NVLink chords over PCIe");
    let gpus: Vec<usize> = (0..n)
        .map(|i| t.add_node(Node::new(format!("GPU{i}"), NodeKind::Gpu)))
        .collect();
    let cpu = t.add_node(Node::new("CPU0", NodeKind::Cpu).memory_bandwidth(200.0));
    for &g in &gpus {
        t.connect(
            g,
            cpu,
            LinkKind::Pcie {
                generation: 4,
                width: 16,
            },
        );
    }
    let mut state = seed;
    let mut next = move |m: usize| {
        // SplitMix64.
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % m as u64) as usize
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, next(i + 1));
    }
    let nv = LinkKind::Nvlink {
        generation: 3,
        count: 2,
    };
    let mut linked = std::collections::HashSet::new();
    for i in 0..n {
        let (a, b) = (order[i], order[(i + 1) % n]);
        linked.insert((a.min(b), a.max(b)));
        t.connect(gpus[a], gpus[b], nv.clone());
    }
    for _ in 0..n {
        let (a, b) = (next(n), next(n));
        if a != b && linked.insert((a.min(b), a.max(b))) {
            t.connect(gpus[a], gpus[b], nv.clone());
        }
    }
    t.validate().unwrap();
    t
}

#[test]
fn an_irregular_sparse_graph_of_96_gpus_is_searched_within_budget() {
    let t = sparse(96, 7);
    let s = search(&t);
    assert!(s.candidates <= SET_BUDGET, "{} candidates", s.candidates);
    // Every ring is a permutation of the ranks, and the set is at least
    // as fast as its first ring.
    let one = search::rings(&t, &t.devices(), &CostModel::default(), 1).unwrap();
    for o in &s.orders {
        let mut sorted = o.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..96).collect::<Vec<u32>>());
    }
    assert!(s.bandwidth >= one.bandwidth, "{s:?}");
}
