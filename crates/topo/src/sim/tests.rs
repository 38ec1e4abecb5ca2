mod cross_check;

use std::sync::Arc;

use ferrocoll_core::plan::Compiler;
use ferrocoll_core::{Algorithm, AlgorithmParams, Collective, VerifyOptions, generate, verify};

use super::*;
use crate::graph::{LinkKind, Node, NodeKind};
use crate::presets;

const NV: LinkKind = LinkKind::Nvlink {
    generation: 3,
    count: 1,
};

/// A cost model with no overheads and full efficiency, GPU channels
/// unbounded, so results can be compared with closed forms of the links.
fn ideal(step_us: f64) -> CostModel {
    CostModel {
        nvlink_efficiency: [1.0; 5],
        gpu_call_us: 0.0,
        gpu_step_us: step_us,
        ..CostModel::default().links_only()
    }
}

fn gpus(n: usize) -> Topology {
    let mut t = Topology::new("test", "");
    for i in 0..n {
        t.add_node(Node::new(format!("GPU{i}"), NodeKind::Gpu));
    }
    t
}

/// `n` GPUs in a ring of links of `bw` GB/s and `lat` µs.
fn ring_topology(n: usize, bw: f64, lat: f64) -> Topology {
    let mut t = gpus(n);
    for i in 0..n {
        t.connect_with(i, (i + 1) % n, NV, bw, lat);
    }
    t
}

fn full_mesh(n: usize, bw: f64, lat: f64) -> Topology {
    let mut t = gpus(n);
    for i in 0..n {
        for j in i + 1..n {
            t.connect_with(i, j, NV, bw, lat);
        }
    }
    t
}

fn compiler(algo: Algorithm, c: Collective, n: u32, params: &AlgorithmParams) -> Compiler {
    let s = generate(algo, c, n, params).unwrap();
    Compiler::new(Arc::new(verify(s, &VerifyOptions::default()).unwrap()))
}

fn sim(
    algo: Algorithm,
    c: Collective,
    topo: &Topology,
    n: u32,
    size: usize,
    options: &SimOptions,
) -> Prediction {
    let c = compiler(algo, c, n, &AlgorithmParams::default());
    simulate(&c, topo, size, options).unwrap()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-12)
}

#[test]
fn ring_all_reduce_matches_the_closed_form_on_a_uniform_ring() {
    // One segment, no overhead: 2(n-1) hops of S/n bytes, each at B plus
    // the hop latency.
    for n in [2u32, 3, 4, 8] {
        let (bw, lat) = (100.0, 1.5);
        let size = 64 << 20;
        let o = SimOptions {
            max_chunk_bytes: Some(usize::MAX),
            cost: ideal(0.0),
            ..SimOptions::default()
        };
        let p = sim(
            Algorithm::Ring,
            Collective::AllReduce,
            &ring_topology(n as usize, bw, lat),
            n,
            size,
            &o,
        );
        let m = size as f64 / f64::from(n);
        let want = 2.0 * f64::from(n - 1) * (lat + m / (bw * 1e3));
        assert!(
            close(p.time_us, want, 1e-6),
            "n={n}: {} vs {want}",
            p.time_us
        );
    }
}

#[test]
fn pipelined_ring_all_reduce_approaches_the_bandwidth_bound() {
    let (n, bw) = (8u32, 100.0);
    let size = 1 << 30;
    let o = SimOptions {
        max_chunk_bytes: Some(1 << 20),
        cost: ideal(0.0),
        ..SimOptions::default()
    };
    let p = sim(
        Algorithm::Ring,
        Collective::AllReduce,
        &ring_topology(8, bw, 0.0),
        n,
        size,
        &o,
    );
    // 2(n-1)/n · S / B, plus the pipeline's fill of 2(n-1) chunks.
    let bound = 2.0 * 7.0 / 8.0 * size as f64 / (bw * 1e3);
    let fill = 2.0 * 7.0 * (1 << 20) as f64 / (bw * 1e3);
    assert!(p.time_us >= bound * (1.0 - 1e-9), "{} < {bound}", p.time_us);
    assert!(
        p.time_us <= bound + fill,
        "{} > {}",
        p.time_us,
        bound + fill
    );
    assert!(
        p.busbw <= bw * (1.0 + 1e-9) && p.busbw > 0.85 * bw,
        "busbw {}",
        p.busbw
    );
    // Above 64 segments the run is extrapolated; it must agree with the
    // formula as well.
    assert!(p.segments > MAX_SIMULATED_SEGMENTS);
}

#[test]
fn step_overhead_adds_per_step_and_latency_terms_dominate_small_messages() {
    let o = |a| SimOptions {
        cost: ideal(a),
        ..SimOptions::default()
    };
    let t = ring_topology(4, 100.0, 0.0);
    let without = sim(Algorithm::Ring, Collective::AllReduce, &t, 4, 4096, &o(0.0));
    let with = sim(Algorithm::Ring, Collective::AllReduce, &t, 4, 4096, &o(2.0));
    // A GPU step's overhead delays its messages: a ring all-reduce's chain
    // of dependent messages is 2(n-1) long.
    let extra = with.time_us - without.time_us;
    assert!(close(extra, 2.0 * 6.0, 1e-6), "{extra}");
}

#[test]
fn tree_latency_grows_with_log_n_and_ring_with_n() {
    let o = SimOptions {
        cost: ideal(1.0),
        ..SimOptions::default()
    };
    let time = |algo, n: u32| {
        sim(
            algo,
            Collective::AllReduce,
            &full_mesh(n as usize, 100.0, 0.5),
            n,
            1024,
            &o,
        )
        .time_us
    };
    let (tree8, tree64) = (time(Algorithm::Tree, 8), time(Algorithm::Tree, 64));
    let (ring8, ring64) = (time(Algorithm::Ring, 8), time(Algorithm::Ring, 64));
    assert!(tree64 / tree8 < 2.5, "tree {tree8} -> {tree64}");
    assert!(ring64 / ring8 > 6.0, "ring {ring8} -> {ring64}");
    assert!(tree64 < ring64);
}

#[test]
fn direct_on_a_full_mesh_uses_every_link_at_once() {
    let (n, bw) = (4u32, 50.0);
    let size = 16 << 20;
    let o = SimOptions {
        max_chunk_bytes: Some(usize::MAX),
        cost: ideal(0.0),
        ..SimOptions::default()
    };
    let p = sim(
        Algorithm::Direct,
        Collective::AllReduce,
        &full_mesh(4, bw, 0.0),
        n,
        size,
        &o,
    );
    // Reduce-scatter then all-gather, each one block of S/n per link.
    let want = 2.0 * (size as f64 / 4.0) / (bw * 1e3);
    assert!(close(p.time_us, want, 1e-6), "{} vs {want}", p.time_us);
    let a2a = sim(
        Algorithm::Direct,
        Collective::AllToAll,
        &full_mesh(4, bw, 0.0),
        n,
        size,
        &o,
    );
    assert!(
        close(a2a.time_us, size as f64 / 4.0 / (bw * 1e3), 1e-6),
        "{}",
        a2a.time_us
    );
}

#[test]
fn the_bottleneck_is_the_narrow_link() {
    // A ring with one slow link: that link is the bottleneck.
    let mut t = ring_topology(4, 100.0, 0.0);
    for l in &mut t.links {
        if (l.from, l.to) == (2, 3) {
            l.bandwidth = 10.0;
        }
    }
    let o = SimOptions {
        cost: ideal(0.0),
        ..SimOptions::default()
    };
    let p = sim(Algorithm::Ring, Collective::AllReduce, &t, 4, 64 << 20, &o);
    let b = p.bottleneck().unwrap();
    assert_eq!(b.resource, "GPU2 -> GPU3 (NVLink3 x1)");
    assert!(b.utilisation > 0.9, "{b:?}");
    assert!(p.busbw < 11.0, "{}", p.busbw);
}

#[test]
fn staging_without_p2p_costs_host_memory_twice() {
    let on = presets::by_name("pcie4-4gpu", 1).unwrap();
    let off = presets::by_name("pcie4-4gpu-nop2p", 1).unwrap();
    let o = SimOptions::default();
    let a = sim(Algorithm::Ring, Collective::AllReduce, &on, 4, 64 << 20, &o);
    let b = sim(
        Algorithm::Ring,
        Collective::AllReduce,
        &off,
        4,
        64 << 20,
        &o,
    );
    assert!(b.time_us >= a.time_us, "{} vs {}", b.time_us, a.time_us);
    assert!(b.loads.iter().any(|l| l.resource == "CPU0 memory"));
}

#[test]
fn a_schedule_needing_more_devices_is_an_error() {
    let s = compiler(
        Algorithm::Ring,
        Collective::AllReduce,
        8,
        &AlgorithmParams::default(),
    );
    let err = simulate(&s, &gpus(4), 1024, &SimOptions::default()).unwrap_err();
    assert!(matches!(
        err,
        TopologyError::TooFewDevices {
            ranks: 8,
            devices: 4,
            ..
        }
    ));
}

#[test]
fn every_builtin_schedule_runs_to_the_end_on_every_preset_shape() {
    let t = presets::by_name("dgx1-v100", 1).unwrap();
    for (algo, kind) in ferrocoll_core::algorithms::applicable() {
        for n in [1u32, 2, 3, 5, 8] {
            let c = kind.with_root(n - 1);
            let channels = if algo == Algorithm::HalvingDoubling {
                1
            } else {
                2
            };
            let s = compiler(
                algo,
                c,
                n,
                &AlgorithmParams {
                    channels,
                    ..AlgorithmParams::default()
                },
            );
            for size in [0usize, 1000, 3 << 20] {
                let p = simulate(&s, &t, size, &SimOptions::default()).unwrap();
                assert!(
                    p.time_us.is_finite() && p.time_us >= 0.0,
                    "{algo} {kind} n={n}"
                );
            }
        }
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let t = presets::by_name("pcie4-4gpu", 1).unwrap();
    let s = compiler(
        Algorithm::Direct,
        Collective::AllToAll,
        2,
        &AlgorithmParams::default(),
    );
    let o = |placement: Option<Vec<usize>>, cost: CostModel| SimOptions {
        placement,
        cost,
        ..SimOptions::default()
    };
    assert!(simulate(&s, &t, 1024, &o(Some(vec![]), CostModel::default())).is_err());
    assert!(simulate(&s, &t, 1024, &o(Some(vec![0, 0]), CostModel::default())).is_err());
    let zero = CostModel {
        pcie_efficiency: 0.0,
        ..CostModel::default()
    };
    assert!(simulate(&s, &t, 1024, &o(None, zero)).is_err());
    // A plan edited by hand: checked, refused, never a panic.
    let shape = ferrocoll_core::types::CallShape {
        collective: Collective::AllToAll,
        count: 8,
        dtype: ferrocoll_core::DataType::F32,
        op: ferrocoll_core::ReduceOp::Sum,
        in_place: false,
        purpose: Default::default(),
    };
    let plan = s
        .compile(&shape, ferrocoll_core::plan::Chunking::Segments(1), 2)
        .unwrap();
    simulate_plan(&plan, &t, &SimOptions::default()).unwrap();
    let mut broken = plan.clone();
    let sending = broken.ranks[0].channels[0]
        .iter_mut()
        .find(|i| !i.send.is_empty())
        .unwrap();
    sending.send[0].peer = 7;
    broken.hash = broken.compute_hash();
    assert!(simulate_plan(&broken, &t, &SimOptions::default()).is_err());
    let mut empty = plan.clone();
    empty.world_size = 0;
    empty.ranks.clear();
    assert!(simulate_plan(&empty, &t, &SimOptions::default()).is_err());
    // A plan that never finishes (its only message dropped at both ends)
    // is an error too.
    let mut stall = plan;
    for rp in &mut stall.ranks {
        for ins in rp.channels.iter_mut().flatten() {
            ins.recv.clear();
        }
    }
    stall.hash = stall.compute_hash();
    assert!(simulate_plan(&stall, &t, &SimOptions::default()).is_err());
    // Size 0 and a size not divisible by anything are fine.
    simulate(&s, &t, 0, &SimOptions::default()).unwrap();
    simulate(&s, &t, 12_345, &SimOptions::default()).unwrap();
}

/// A GPU channel is a thread block: however wide the links, one channel
/// moves no more than its block's loads and stores allow, and that block
/// is named as the bottleneck; more channels lift it; each instruction's
/// cost adds to a call.
#[test]
fn a_channels_block_bounds_what_it_moves() {
    let wide = full_mesh(2, 10_000.0, 0.0);
    let block = |channels: u32, gbps: f64| {
        let s = generate(
            Algorithm::Direct,
            Collective::AllReduce,
            2,
            &AlgorithmParams {
                channels,
                ..AlgorithmParams::default()
            },
        )
        .unwrap();
        let compiler = Compiler::new(std::sync::Arc::new(
            verify(s, &VerifyOptions::default()).unwrap(),
        ));
        let o = SimOptions {
            max_chunk_bytes: Some(1 << 20),
            cost: CostModel {
                gpu_block_gbps: gbps,
                ..ideal(0.0)
            },
            ..SimOptions::default()
        };
        simulate(&compiler, &wide, 256 << 20, &o).unwrap()
    };
    let one = block(1, 50.0);
    assert!(
        one.bottleneck().unwrap().resource.contains("channel 0"),
        "{:?}",
        one.bottleneck()
    );
    let four = block(4, 50.0);
    assert!(
        four.busbw > 3.0 * one.busbw,
        "{} vs {}",
        four.busbw,
        one.busbw
    );
    assert!(block(1, 0.0).busbw > 10.0 * one.busbw);
    // The instruction cost: every instruction of the critical path.
    let costly = CostModel {
        gpu_instruction_us: 5.0,
        ..ideal(0.0)
    };
    let o = |cost| SimOptions {
        cost,
        ..SimOptions::default()
    };
    let s = generate(
        Algorithm::Ring,
        Collective::AllReduce,
        4,
        &AlgorithmParams::default(),
    )
    .unwrap();
    let compiler = Compiler::new(std::sync::Arc::new(
        verify(s, &VerifyOptions::default()).unwrap(),
    ));
    let t = ring_topology(4, 100.0, 0.0);
    let free = simulate(&compiler, &t, 4096, &o(ideal(0.0)))
        .unwrap()
        .time_us;
    let paid = simulate(&compiler, &t, 4096, &o(costly)).unwrap().time_us;
    // A ring all-reduce of 4 ranks runs 6 instructions in a row.
    assert!(paid - free >= 6.0 * 5.0 - 1e-6, "{paid} - {free}");
}

/// Two threads on a host whose memory, not its cores, is the limit.
fn memory_bound_host() -> Topology {
    let host = crate::probe::HostMeasurement {
        cores: 2,
        memory_gbps: 50.0,
        core_gbps: 40.0,
        handoff_us: 0.5,
        oversubscribed_handoff_us: 5.0,
    };
    presets::host(2, &host)
}

#[test]
fn a_value_copied_from_bytes_at_rest_is_read_and_written_on_the_host() {
    // Before: a receiver copying a plain send's bytes paid only the write,
    // so tree all-reduce at 2 ranks (reduce, then a plain send of the
    // result) looked as cheap as direct (the reducer stores the result
    // into both outputs as it computes it): the selector chose tree, which
    // ran 1.3-1.5x slower. Per byte of the buffer, direct moves 2 reads
    // and 2 writes per half; tree 3 + 2.
    let t = memory_bound_host();
    let o = SimOptions::default();
    let bytes = 64 << 20;
    let memory = |a: Algorithm| {
        let p = sim(a, Collective::AllReduce, &t, 2, bytes, &o);
        let load = p
            .loads
            .iter()
            .find(|l| l.resource == "CPU0 memory")
            .unwrap();
        (load.bytes / bytes as f64, p.time_us)
    };
    let (direct, direct_us) = memory(Algorithm::Direct);
    let (tree, tree_us) = memory(Algorithm::Tree);
    assert!(
        (direct - 4.0).abs() < 0.1,
        "direct moves {direct} x the buffer"
    );
    assert!((tree - 5.0).abs() < 0.1, "tree moves {tree} x the buffer");
    assert!(tree_us > 1.2 * direct_us, "{tree_us} vs {direct_us}");
}
