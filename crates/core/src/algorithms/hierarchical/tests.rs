//! Hierarchies of every shape up to 64 ranks verify; random ones run on
//! the CPU executor against the serial reference; their plans move what
//! the cost line says; bad shapes are typed errors.

use super::*;
use crate::conformance::SplitMix64;
use crate::verify::{VerifyOptions, verify};

/// `nodes` nodes of `per_node` ranks, ranks shuffled among them and
/// within each node's ring.
fn random_hierarchy(rng: &mut SplitMix64, per_node: u32, nodes: u32) -> Hierarchy {
    let mut ranks: Vec<Rank> = (0..per_node * nodes).collect();
    for i in (1..ranks.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        ranks.swap(i, j);
    }
    Hierarchy {
        nodes: ranks
            .chunks(per_node as usize)
            .map(<[Rank]>::to_vec)
            .collect(),
    }
}

/// Nodes of consecutive ranks, as a cluster numbers its GPUs.
fn blocks(per_node: u32, nodes: u32) -> Hierarchy {
    Hierarchy {
        nodes: (0..nodes)
            .map(|m| (m * per_node..(m + 1) * per_node).collect())
            .collect(),
    }
}

#[test]
fn every_shape_up_to_64_ranks_verifies_in_place_and_out() {
    let mut rng = SplitMix64(5);
    for n in 1..=64u32 {
        for per_node in (1..=n).filter(|l| n % l == 0) {
            let nodes = n / per_node;
            let channels = 1 + (n % 2);
            let mut shapes = vec![blocks(per_node, nodes)];
            // Shuffled ranks at the sizes a test can afford to prove.
            if n <= 24 {
                shapes.push(random_hierarchy(&mut rng, per_node, nodes));
            }
            for h in shapes {
                let s = schedule(Collective::AllReduce, n, &h, channels).unwrap();
                let v = verify(s, &VerifyOptions::default())
                    .unwrap_or_else(|e| panic!("n={n} L={per_node}: {e}\n{h:?}"));
                assert!(v.supports_in_place(), "n={n} L={per_node}");
            }
        }
    }
}

#[test]
fn random_hierarchies_run_on_the_cpu_executor_with_nothing_wrong() {
    use crate::conformance::check_schedule_on_threads;
    use crate::types::{DataType, ReduceOp};
    let mut rng = SplitMix64(13);
    for (per_node, nodes) in [(1, 1), (1, 3), (3, 1), (2, 2), (3, 2), (2, 4), (4, 3)] {
        let n = per_node * nodes;
        let h = random_hierarchy(&mut rng, per_node, nodes);
        let s = schedule(Collective::AllReduce, n, &h, 2).unwrap();
        let verified = std::sync::Arc::new(verify(s, &VerifyOptions::default()).unwrap());
        let kinds = [
            (DataType::F32, ReduceOp::Sum),
            (DataType::F64, ReduceOp::Avg),
            (DataType::I32, ReduceOp::Prod),
            (DataType::F16, ReduceOp::Max),
            (DataType::U8, ReduceOp::Min),
        ];
        check_schedule_on_threads(verified, &kinds, &mut rng)
            .unwrap_or_else(|e| panic!("{e}\n{h:?}"));
    }
}

#[test]
fn plans_move_the_cost_line_and_cross_nodes_only_on_rails() {
    use crate::plan::{Chunking, Compiler};
    use crate::types::{CallShape, DataType, ReduceOp};
    for (per_node, nodes) in [(1, 4), (4, 1), (2, 3), (8, 2), (4, 4)] {
        let n = per_node * nodes;
        let h = blocks(per_node, nodes);
        let s = schedule(Collective::AllReduce, n, &h, 3).unwrap();
        let compiler = Compiler::new(std::sync::Arc::new(
            verify(s, &VerifyOptions::default()).unwrap(),
        ));
        for count in [1usize, 7, 1001] {
            let shape = CallShape {
                collective: Collective::AllReduce,
                count,
                dtype: DataType::F32,
                op: ReduceOp::Sum,
                in_place: false,
                purpose: Default::default(),
            };
            let plan = compiler
                .compile(&shape, Chunking::MaxBytes(256), 2)
                .unwrap();
            let moved: u64 = plan.links.iter().map(|l| l.bytes).sum();
            let blocks = traffic_blocks(per_node, nodes);
            assert_eq!(moved, blocks * count as u64 * 4, "L={per_node} M={nodes}");
            let node = |r: Rank| r / per_node;
            for l in &plan.links {
                if node(l.link.from) != node(l.link.to) {
                    assert_eq!(
                        l.link.from % per_node,
                        l.link.to % per_node,
                        "off its rail: {l:?}"
                    );
                }
            }
            // Across nodes each rank sends 2(M−1)/(M·L) of the block.
            let network: u64 = plan
                .links
                .iter()
                .filter(|l| node(l.link.from) != node(l.link.to))
                .map(|l| l.bytes)
                .sum();
            assert_eq!(network, 2 * u64::from(nodes - 1) * count as u64 * 4);
        }
    }
}

#[test]
fn bad_shapes_are_typed_errors() {
    let ar = Collective::AllReduce;
    let shape = |nodes: Vec<Vec<Rank>>, n| schedule(ar, n, &Hierarchy { nodes }, 1);
    let is_shape = |r: Result<Schedule, HierarchyError>, what: &str| {
        assert!(
            matches!(&r, Err(HierarchyError::Shape { why, .. }) if why.contains(what)),
            "{what}: {r:?}"
        );
    };
    is_shape(shape(vec![], 2), "no nodes");
    is_shape(shape(vec![vec![]], 0), "no nodes");
    is_shape(shape(vec![vec![0, 1], vec![2]], 3), "equal");
    is_shape(shape(vec![vec![0, 1], vec![1, 2]], 4), "two places");
    is_shape(shape(vec![vec![0, 1], vec![2, 9]], 4), "out of range");
    is_shape(shape(vec![vec![0, 1], vec![2, 3]], 5), "in no node");
    let h = blocks(2, 2);
    assert!(matches!(
        schedule(Collective::AllGather, 4, &h, 1),
        Err(HierarchyError::Collective(_))
    ));
    assert!(matches!(
        schedule(ar, 4, &h, 0),
        Err(HierarchyError::Channels(0))
    ));
    assert!(matches!(
        schedule(ar, 4, &h, 22),
        Err(HierarchyError::Channels(22))
    ));
    assert!(schedule(ar, 4, &h, 21).is_ok());
}
