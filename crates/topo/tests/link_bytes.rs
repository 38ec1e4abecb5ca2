//! Bytes on every link, three ways, for every built-in algorithm ×
//! collective × world size 1..=16: counted by the CPU executor where the
//! data moves (its writes into slots and posted destinations, its reads of
//! peers' memory), moved by the simulator running the same plan, and the
//! algorithm's cost line ([`traffic_blocks`]). A plan with a message more,
//! or the plan of another call, must make the comparison fail.

mod common;

use std::collections::BTreeMap;

use ferrocoll_core::algorithms::{applicable, traffic_blocks};
use ferrocoll_core::comm::{Call, Communicator, Planner, Planning};
use ferrocoll_core::cpu::{self, CpuConfig};
use ferrocoll_core::plan::{ExecutionPlan, LinkLoad};
use ferrocoll_core::types::{CallShape, Link};
use ferrocoll_core::{Algorithm, Collective, CollectiveKind, DataType, ReduceOp};
use ferrocoll_topo::sim::{SimOptions, simulate_plan};

const COUNT: usize = 1001;

fn config(algorithm: Algorithm) -> CpuConfig {
    CpuConfig {
        planning: Planning {
            algorithm: Some(algorithm),
            // Several segments, every slot reused.
            max_chunk_bytes: Some(256),
            ..CpuConfig::default().planning
        },
        ..CpuConfig::default()
    }
}

fn shape(collective: Collective) -> CallShape {
    CallShape {
        collective,
        count: COUNT,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        in_place: false,
        purpose: Default::default(),
    }
}

/// The plan the CPU executor compiles for the call (same settings, same plan).
fn plan_of(n: u32, algorithm: Algorithm, collective: Collective) -> ExecutionPlan {
    let planned = Planner::new(n, config(algorithm).planner_settings())
        .plan(&shape(collective))
        .unwrap();
    (*planned.plan).clone()
}

/// Run the call on `n` threads; rank 0 reports what every link carried.
fn counted(n: u32, algorithm: Algorithm, collective: Collective) -> Vec<LinkLoad> {
    let results = cpu::run(n, &config(algorithm), |comm| {
        let c = collective;
        let input = vec![1.0f32; c.input_blocks(n) as usize * COUNT];
        let mut output = vec![0.0f32; c.output_blocks(n) as usize * COUNT];
        comm.execute(Call::collective(
            c,
            ReduceOp::Sum,
            Some(input.as_slice().into()),
            output.as_mut_slice().into(),
        ))?;
        comm.barrier()?;
        Ok(if comm.rank() == 0 {
            comm.link_traffic()
        } else {
            Vec::new()
        })
    });
    results.into_iter().next().unwrap().unwrap()
}

fn by_link(loads: &[LinkLoad]) -> BTreeMap<Link, (u64, u64)> {
    loads
        .iter()
        .map(|l| (l.link, (l.messages, l.bytes)))
        .collect()
}

/// The three accounts agree link by link, and their total is the cost line.
fn compare(
    what: &str,
    executor: &[LinkLoad],
    simulator: &[LinkLoad],
    plan: &[LinkLoad],
    cost_bytes: u64,
) -> Result<(), String> {
    let (e, s, p) = (by_link(executor), by_link(simulator), by_link(plan));
    if e != p {
        return Err(format!(
            "{what}: executor counted {e:?}, the plan says {p:?}"
        ));
    }
    if s != p {
        return Err(format!(
            "{what}: simulator moved {s:?}, the plan says {p:?}"
        ));
    }
    let total: u64 = p.values().map(|v| v.1).sum();
    if total != cost_bytes {
        return Err(format!(
            "{what}: {total} bytes over all links, the cost line says {cost_bytes}"
        ));
    }
    Ok(())
}

fn check(algorithm: Algorithm, kind: CollectiveKind, n: u32) -> Result<(), String> {
    let collective = kind.with_root(n / 2);
    let what = format!("{algorithm} {collective} n={n}");
    let plan = plan_of(n, algorithm, collective);
    let executor = counted(n, algorithm, collective);
    let sim = simulate_plan(&plan, &common::mesh(n), &SimOptions::default())
        .map_err(|e| e.to_string())?;
    let cost = traffic_blocks(algorithm, kind, n).unwrap() * (COUNT * 4) as u64;
    compare(&what, &executor, &sim.links, &plan.links, cost)
}

#[test]
fn executor_simulator_and_cost_line_agree_on_every_link() {
    for (algorithm, kind) in applicable() {
        for n in 1..=16 {
            check(algorithm, kind, n).unwrap();
        }
    }
}

/// The plan with one message more: the last instruction of some rank
/// also sends its value to a rank it never talks to, whose last
/// instruction (of the same length) takes it in. Still well formed — and
/// one message heavier than what the executor ran.
fn one_message_more(plan: &ExecutionPlan) -> Option<ExecutionPlan> {
    let mut p = plan.clone();
    let n = p.world_size;
    let used = |l: &Link| p.links.iter().any(|x| x.link == *l);
    let pick = (0..n)
        .flat_map(|a| (0..n).map(move |b| (a, b)))
        .find(|&(a, b)| {
            let link = Link {
                from: a,
                to: b,
                channel: 0,
            };
            let (sa, sb) = (
                p.ranks[a as usize].channels[0].last(),
                p.ranks[b as usize].channels[0].last(),
            );
            a != b
                && !used(&link)
                && sa
                    .zip(sb)
                    .is_some_and(|(x, y)| x.bytes == y.bytes && x.bytes > 0)
        })?;
    let (a, b) = pick;
    let message = |peer| ferrocoll_core::plan::Message {
        peer,
        index: 0,
        slot: 0,
    };
    let bytes = {
        let s = p.ranks[a as usize].channels[0].last_mut()?;
        s.send.push(message(b));
        s.bytes
    };
    p.ranks[b as usize].channels[0]
        .last_mut()?
        .recv
        .push(message(a));
    let link = Link {
        from: a,
        to: b,
        channel: 0,
    };
    p.links.push(LinkLoad {
        link,
        messages: 1,
        bytes,
        largest: bytes,
    });
    p.links.sort_by_key(|l| l.link);
    p.hash = p.compute_hash();
    Some(p)
}

#[test]
fn a_mutated_plan_fails_the_comparison() {
    let (algorithm, collective, n) = (Algorithm::Ring, Collective::AllReduce, 4);
    let plan = plan_of(n, algorithm, collective);
    let executor = counted(n, algorithm, collective);
    let cost =
        traffic_blocks(algorithm, CollectiveKind::AllReduce, n).unwrap() * (COUNT * 4) as u64;
    let sim = |p: &ExecutionPlan| {
        simulate_plan(p, &common::mesh(n), &SimOptions::default())
            .unwrap()
            .links
    };
    compare("as compiled", &executor, &sim(&plan), &plan.links, cost).unwrap();

    // One message more, on a link the call never uses.
    let heavier = one_message_more(&plan).expect("two last instructions of equal length");
    heavier.check().unwrap();
    assert!(
        compare(
            "one message more",
            &executor,
            &sim(&heavier),
            &plan.links,
            cost
        )
        .is_err()
    );
    assert!(
        compare(
            "one message more",
            &executor,
            &sim(&plan),
            &heavier.links,
            cost
        )
        .is_err()
    );

    // The plan of another call: every link carries a little more.
    let mut other = config(algorithm);
    other.planning.max_chunk_bytes = Some(256);
    let longer = Planner::new(n, other.planner_settings())
        .plan(&CallShape {
            count: COUNT + 1,
            ..shape(collective)
        })
        .unwrap();
    assert!(
        compare(
            "another call's plan",
            &executor,
            &sim(&longer.plan),
            &plan.links,
            cost
        )
        .is_err()
    );
}
