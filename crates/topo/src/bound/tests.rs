use super::*;
use crate::presets;

fn gpus(t: &Topology, list: &[usize]) -> Vec<NodeId> {
    let d = t.devices();
    list.iter().map(|&i| d[i]).collect()
}

fn bounds(t: &Topology, list: &[usize], fabric: Fabric, relays: Relays) -> Bounds {
    throughput_bounds(t, &gpus(t, list), &CostModel::default(), fabric, relays).unwrap()
}

/// The all-gather bound.
fn bound(t: &Topology, list: &[usize], fabric: Fabric, relays: Relays) -> Bound {
    bounds(t, list, fabric, relays).all_gather
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6 * b.max(1.0)
}

/// Six NVLink2 bricks per V100 at the simulator's 20 GB/s: 120 GB/s, set
/// by a single GPU's incoming links.
#[test]
fn dgx1_v100_over_nvlink_is_bound_by_one_gpus_six_links() {
    let t = presets::by_name("dgx1-v100", 0).unwrap();
    let all: Vec<usize> = (0..8).collect();
    let b = bound(&t, &all, Fabric::Nvlink, Relays::Any);
    assert!(close(b.busbw, 120.0), "{b:?}");
    assert_eq!(b.outside, 7, "{b:?}");
    // PCIe and the CPUs add capacity: never less over every link.
    let every = bound(&t, &all, Fabric::Every, Relays::Any);
    assert!(every.busbw >= b.busbw - 1e-9, "{every:?}");
}

/// GPUs 0-5 of a DGX-1V: the bound of the NVLink links among them is
/// 60 GB/s (the best ring packing reaches 40).
#[test]
fn dgx1_v100_gpus_0_to_5_without_relays() {
    let t = presets::by_name("dgx1-v100", 0).unwrap();
    let b = bound(&t, &[0, 1, 2, 3, 4, 5], Fabric::Nvlink, Relays::MembersOnly);
    assert!(close(b.busbw, 60.0), "{b:?}");
    // GPUs 6 and 7 relaying can only help.
    let relayed = bound(&t, &[0, 1, 2, 3, 4, 5], Fabric::Nvlink, Relays::Any);
    assert!(relayed.busbw >= b.busbw - 1e-9, "{relayed:?}");
}

/// On a switch every cut is one GPU's links: the bound is its rate, and a
/// subset has the same.
#[test]
fn a_switch_bounds_at_one_gpus_link() {
    let t = presets::by_name("dgx-h100", 0).unwrap();
    let full = bound(&t, &(0..8).collect::<Vec<_>>(), Fabric::Nvlink, Relays::Any);
    let cost = CostModel::default();
    let g0 = t.devices()[0];
    let one: f64 = t
        .links
        .iter()
        .filter(|l| l.to == g0 && l.kind.is_nvlink())
        .map(|l| cost.effective_bandwidth(&l.kind, l.bandwidth))
        .sum();
    assert!(close(full.busbw, one), "{full:?} vs {one}");
    let pair = bound(&t, &[2, 5], Fabric::Nvlink, Relays::MembersOnly);
    assert!(close(pair.busbw, one), "{pair:?}");
}

#[test]
fn trivial_and_bad_member_sets() {
    let t = presets::by_name("dgx1-v100", 0).unwrap();
    let one = bound(&t, &[3], Fabric::Every, Relays::Any);
    assert!(one.busbw.is_infinite());
    let cost = CostModel::default();
    let cpu = (0..t.nodes.len())
        .find(|&v| !t.nodes[v].kind.is_device())
        .unwrap();
    let d = t.devices();
    for bad in [vec![d[0], d[0]], vec![d[0], cpu], vec![d[0], 999]] {
        assert!(
            throughput_bounds(&t, &bad, &cost, Fabric::Every, Relays::Any).is_err(),
            "{bad:?}"
        );
    }
    // A PCIe-only machine has no NVLink fabric: its members cannot meet.
    let p = presets::by_name("pcie4-4gpu", 0).unwrap();
    let none = bound(&p, &[0, 1, 2, 3], Fabric::Nvlink, Relays::Any);
    assert_eq!(none.busbw, 0.0);
    assert!(bound(&p, &[0, 1, 2, 3], Fabric::Every, Relays::Any).busbw > 0.0);
}

/// The bound against brute force: on small graphs, every node subset is
/// a candidate cut, and the flow method must find the same minimum.
#[test]
fn the_flow_method_matches_every_cut_listed() {
    for name in [
        "dgx1-v100",
        "pcie4-4gpu",
        "pcie3-8gpu-2numa",
        "seed-8gpu-mesh",
    ] {
        let t = presets::by_name(name, 0).unwrap();
        let n = t.devices().len();
        for members in [
            (0..n).collect::<Vec<_>>(),
            vec![0, 1, 2],
            vec![1, n / 2, n - 1],
        ] {
            let ids = gpus(&t, &members);
            for fabric in [Fabric::Every, Fabric::Nvlink] {
                let fast = bound(&t, &members, fabric, Relays::Any).busbw;
                let slow = brute_force(&t, &ids, fabric);
                assert!(
                    close(fast, slow) || (fast == 0.0 && slow == 0.0),
                    "{name} {members:?} {fabric:?}: flows {fast}, cuts {slow}"
                );
            }
        }
    }
}

fn brute_force(t: &Topology, members: &[NodeId], fabric: Fabric) -> f64 {
    let cost = CostModel::default();
    let v = t.nodes.len();
    assert!(v <= 22, "brute force is for small graphs");
    let mut best = f64::INFINITY;
    for mask in 1u32..(1 << v) - 1 {
        let inside = |x: NodeId| mask & (1 << x) != 0;
        let held = members.iter().filter(|&&m| inside(m)).count();
        if held == 0 || held == members.len() {
            continue;
        }
        let b_in: f64 = t
            .links
            .iter()
            .filter(|l| fabric == Fabric::Every || l.kind.is_nvlink())
            .filter(|l| inside(l.to) && !inside(l.from))
            .map(|l| cost.effective_bandwidth(&l.kind, l.bandwidth))
            .sum();
        best = best.min(b_in / (members.len() - held) as f64);
    }
    (members.len() - 1) as f64 * best
}

/// The bounds are bounds: no algorithm the selector simulates, in any of
/// its variants, beats them — all-gather and reduce-scatter their cut
/// bounds, every all-reduce the any-all-reduce bound, and rings (a
/// reduce-scatter then an all-gather) the all-reduce cut bound — on whole
/// machines and on lopsided subsets.
#[test]
fn no_simulated_schedule_beats_the_bound() {
    use crate::select::{SelectOptions, TopologySelector};
    use ferrocoll_core::{Algorithm, Collective};
    let cases: [(&str, &[usize]); 6] = [
        ("dgx1-v100", &[0, 1, 2, 3, 4, 5, 6, 7]),
        ("dgx1-v100", &[0, 1, 2, 4, 5]),
        ("dgx-a100", &[0, 1, 2, 3, 4, 5, 6, 7]),
        ("pcie4-8gpu-2numa", &[0, 1, 2, 3, 4, 5, 6, 7]),
        ("pcie4-8gpu-2numa", &[0, 1, 5]),
        ("consumer-4gpu-pcie4", &[0, 1, 2, 3]),
    ];
    for (name, keep) in cases {
        let full = presets::by_name(name, 0).unwrap();
        let b = bounds(&full, keep, Fabric::Every, Relays::MembersOnly);
        let t = full.with_devices(keep).unwrap();
        let options = SelectOptions {
            channel_multipliers: vec![1, 2],
            chunk_sizes: vec![1 << 20, 4 << 20],
            ..SelectOptions::default()
        };
        let s = TopologySelector::new(t, keep.len() as u32, options).unwrap();
        for c in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
        ] {
            for (candidate, p) in s.evaluate(c, 256 << 20).unwrap() {
                let limit = match c {
                    Collective::AllGather => b.all_gather.busbw,
                    Collective::ReduceScatter => b.reduce_scatter.busbw,
                    _ if candidate.algorithm() == Some(Algorithm::Ring) => b.all_reduce,
                    _ => b.all_reduce_any,
                };
                assert!(
                    p.busbw <= limit * (1.0 + 1e-6),
                    "{name} {keep:?} {c:?} {candidate}: {} GB/s over the bound {limit}",
                    p.busbw
                );
            }
        }
        assert!(
            b.all_reduce_any >= b.all_reduce * (1.0 - 1e-9),
            "{name}: {b:?}"
        );
    }
}

/// On a lopsided graph reduce-scatter (links leaving a cut) and all-gather
/// (links entering it) differ, and all-reduce as the two is their
/// harmonic mean.
#[test]
fn one_way_links_split_all_gather_from_reduce_scatter() {
    use crate::graph::{LinkKind, Node, NodeKind, PhysicalLink};
    let mut t = Topology::new("lopsided", "three GPUs, one slow link out of GPU2");
    let g: Vec<NodeId> = (0..3)
        .map(|i| t.add_node(Node::new(format!("GPU{i}"), NodeKind::Gpu)))
        .collect();
    let mut link = |from, to, bandwidth| {
        t.links.push(PhysicalLink {
            from,
            to,
            kind: LinkKind::Network,
            bandwidth,
            latency_us: 1.0,
        })
    };
    link(g[0], g[1], 10.0);
    link(g[1], g[0], 10.0);
    link(g[0], g[2], 10.0);
    link(g[2], g[0], 2.0);
    let cost = CostModel {
        network_efficiency: 1.0,
        ..CostModel::default()
    };
    let b = throughput_bounds(&t, &g, &cost, Fabric::Every, Relays::Any).unwrap();
    // All-gather: GPU2 takes in 10 for two blocks (5 each); GPU0+GPU1 take
    // in 2 for GPU2's one block. Reduce-scatter: GPU2 sends out 2 for two.
    assert!(close(b.all_gather.busbw, 2.0 * 2.0), "{b:?}");
    assert!(close(b.reduce_scatter.busbw, 2.0 * 1.0), "{b:?}");
    assert!(close(b.all_reduce, 2.0 / (1.0 / 4.0 + 1.0 / 2.0)), "{b:?}");
    assert!(close(b.all_reduce_any, 2.0 * 2.0 / 3.0 * 2.0), "{b:?}");
}
