//! Tree packings against the throughput bound.

use super::*;
use crate::bound::{Fabric, Relays, throughput_bounds};
use crate::presets;
use ferrocoll_core::comm::Planning;

fn dgx1(keep: &[usize]) -> Topology {
    presets::by_name("dgx1-v100", 0)
        .unwrap()
        .with_devices(keep)
        .unwrap()
}

/// The members' all-reduce bound on NVLink alone (the yardstick:
/// what NCCL's NVLink rings and trees could use at best).
fn nvlink_bound(t: &Topology) -> f64 {
    let cost = CostModel::default().links_only();
    throughput_bounds(t, &t.devices(), &cost, Fabric::Nvlink, Relays::MembersOnly)
        .unwrap()
        .all_reduce
}

/// The fastest of the load model's first `take` packings, simulated.
fn best_simulated(t: &Topology, collective: ferrocoll_core::Collective, take: usize) -> f64 {
    let n = t.devices().len() as u32;
    tree_packings(
        t,
        &t.devices(),
        &CostModel::default().links_only(),
        collective.kind(),
    )
    .unwrap()
    .into_iter()
    .take(take)
    .map(|p| {
        let s = ferrocoll_core::algorithms::forest::schedule(collective, n, &p.forest);
        simulated(t, s.unwrap())
    })
    .fold(0.0, f64::max)
}

/// Partial DGX-1V allocations without an NVLink Hamiltonian ring (0-4),
/// the example (0-5), and the two six-GPU sets where the load
/// model's first packing falls short in simulation.
#[test]
fn trees_reach_nine_tenths_of_the_bound_on_partial_dgx1_allocations() {
    for keep in [
        &[0usize, 1, 2, 3, 4, 5][..],
        &[0, 1, 2, 3, 4],
        &[0, 1, 2, 4, 5, 6],
        &[0, 1, 3, 4, 5, 7],
    ] {
        let t = dgx1(keep);
        let bound = nvlink_bound(&t);
        let got = best_simulated(&t, ferrocoll_core::Collective::AllReduce, 6);
        assert!(got >= 0.9 * bound, "{keep:?}: {got:.1} of {bound:.1}");
    }
}

/// What `synth` writes for trees is proven and computes the collective on
/// the CPU executor (threads as ranks), for every collective trees run,
/// on lopsided subsets and a two-node cluster.
#[test]
fn synthesized_trees_are_proven_and_run_on_the_cpu_executor_with_nothing_wrong() {
    use ferrocoll_core::conformance::{Case, check_case};
    use ferrocoll_core::{Collective, DataType, ReduceOp};
    let graphs = [
        dgx1(&[0, 1, 2]),
        dgx1(&[0, 1, 2, 3, 4]),
        dgx1(&[0, 1, 2, 4, 5, 6]),
        presets::by_name("dgx-a100x2", 0).unwrap(),
    ];
    for t in &graphs {
        let n = t.devices().len() as u32;
        for collective in [
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllReduce,
        ] {
            let p = trees(
                t,
                &t.devices(),
                &CostModel::default().links_only(),
                collective.kind(),
            )
            .unwrap()
            .unwrap();
            let s = ferrocoll_core::algorithms::forest::schedule(collective, n, &p.forest).unwrap();
            let verified = ferrocoll_core::verify(s, &Default::default())
                .unwrap_or_else(|e| panic!("{} {collective}: {e}", t.name));
            let harness = ferrocoll_core::conformance::CpuThreads {
                config: ferrocoll_core::cpu::CpuConfig {
                    planning: Planning {
                        schedule: Some(std::sync::Arc::new(verified)),
                        max_chunk_bytes: Some(256),
                        ..ferrocoll_core::cpu::CpuConfig::default().planning
                    },
                    ..Default::default()
                },
            };
            for (dtype, op, count, in_place) in [
                (DataType::F32, ReduceOp::Sum, 1000, false),
                (DataType::I64, ReduceOp::Max, 37, true),
                (DataType::Bf16, ReduceOp::Avg, 0, false),
            ] {
                let case = Case {
                    collective,
                    algorithm: None,
                    world_size: n,
                    count,
                    dtype,
                    op,
                    in_place,
                    seed: 5,
                };
                check_case(&harness, &case).unwrap_or_else(|e| panic!("{} {case:?}: {e}", t.name));
            }
        }
    }
}

/// NCCL's flat rings on two rail-optimized nodes: ring c crosses from
/// node 0 to node 1 on rail c and back on rail c − 1, and visits each
/// node's GPUs in between (their order is free under an NVSwitch).
fn rail_rings(per_node: u32) -> Vec<Vec<Rank>> {
    (0..per_node)
        .map(|c| {
            let back = (c + per_node - 1) % per_node;
            let mut order = vec![back];
            order.extend((1..per_node - 1).map(|i| (c + i) % per_node));
            order.push(c);
            order.extend((0..per_node).map(|i| per_node + (c + i) % per_node));
            order
        })
        .collect()
}

/// Simulated busbw of `schedule` on `t` at 1 GiB.
fn simulated(t: &Topology, schedule: ferrocoll_core::Schedule) -> f64 {
    let verified = ferrocoll_core::verify(schedule, &Default::default()).unwrap();
    let compiler = ferrocoll_core::plan::Compiler::new(std::sync::Arc::new(verified));
    let links = crate::sim::SimOptions {
        cost: CostModel::default().links_only(),
        ..Default::default()
    };
    crate::sim::simulate(&compiler, t, 1 << 30, &links)
        .unwrap()
        .busbw
}

#[test]
fn trees_beat_rail_rings_across_two_dgx_a100_by_a_third() {
    use ferrocoll_core::{Algorithm, AlgorithmParams, Collective, generate};
    let t = presets::by_name("dgx-a100x2", 0).unwrap();
    let devices = t.devices();
    let cost = CostModel::default().links_only();
    for collective in [Collective::AllGather, Collective::AllReduce] {
        let orders = rail_rings(8);
        let params = AlgorithmParams {
            channels: orders.len() as u32,
            ring_orders: orders,
            ..AlgorithmParams::default()
        };
        let rings = simulated(
            &t,
            generate(Algorithm::Ring, collective, 16, &params).unwrap(),
        );
        let best = tree_packings(&t, &devices, &cost, collective.kind())
            .unwrap()
            .into_iter()
            .take(3)
            .map(|p| {
                let s = ferrocoll_core::algorithms::forest::schedule(collective, 16, &p.forest);
                simulated(&t, s.unwrap())
            })
            .fold(0.0, f64::max);
        eprintln!("{collective}: rail rings {rings:.1}, trees {best:.1}");
        assert!(
            best >= 1.3 * rings,
            "{collective}: rail rings {rings:.1}, trees {best:.1}"
        );
    }
}
