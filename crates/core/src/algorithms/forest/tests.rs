//! Forests' shapes are checked; random forests verify and run on the CPU
//! executor against the serial reference.

use super::*;
use crate::conformance::SplitMix64;
use crate::verify::{VerifyOptions, verify};

/// A random spanning tree rooted at `root`: ranks in a random order, each
/// hanging from a random rank before it.
pub(crate) fn random_tree(rng: &mut SplitMix64, n: u32, root: Rank) -> Vec<Option<Rank>> {
    let mut order: Vec<Rank> = (0..n).filter(|&r| r != root).collect();
    for i in (1..order.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order.insert(0, root);
    let mut parent = vec![None; n as usize];
    for i in 1..order.len() {
        let p = order[(rng.next_u64() % i as u64) as usize];
        parent[order[i] as usize] = Some(p);
    }
    parent
}

/// Per root, `split` random trees sharing the block's chunks unevenly;
/// for all-reduce the roots first share the block.
pub(crate) fn random_forest(rng: &mut SplitMix64, n: u32, all_reduce: bool) -> Forest {
    let per_tree = 1 + (rng.next_u64() % 3) as u32;
    let splits = 1 + (rng.next_u64() % 3) as u32;
    let per_root = per_tree * splits;
    let chunks_per_block = if all_reduce { per_root * n } else { per_root };
    let mut trees = Vec::new();
    for root in 0..n {
        let base = if all_reduce { root * per_root } else { 0 };
        // Uneven: the last tree takes what the others leave.
        let mut first = 0;
        for s in 0..splits {
            let chunks = if s + 1 == splits {
                per_root - first
            } else {
                1 + (rng.next_u64() % u64::from(per_tree)) as u32
            };
            trees.push(PackedTree {
                root,
                parent: random_tree(rng, n, root),
                channel: s,
                first_chunk: base + first,
                chunks,
            });
            first += chunks;
        }
    }
    Forest {
        chunks_per_block,
        trees,
    }
}

#[test]
fn random_forests_verify_for_every_collective_up_to_16_ranks() {
    let mut rng = SplitMix64(7);
    for n in 1..=16 {
        for c in [
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllReduce,
        ] {
            for _ in 0..3 {
                let forest = random_forest(&mut rng, n, c == Collective::AllReduce);
                let s = schedule(c, n, &forest).unwrap();
                if let Err(e) = verify(s, &VerifyOptions::default()) {
                    panic!("{c} n={n}: {e}\n{forest:?}");
                }
            }
        }
    }
}

#[test]
fn a_forest_that_misses_a_chunk_is_refused_by_the_verifier() {
    let mut forest = random_forest(&mut SplitMix64(3), 4, false);
    forest.chunks_per_block += 1;
    let s = schedule(Collective::AllGather, 4, &forest).unwrap();
    assert!(verify(s, &VerifyOptions::default()).is_err());
}

#[test]
fn shapes_that_are_not_spanning_trees_are_typed_errors() {
    let tree = |parent: Vec<Option<Rank>>, root| Forest {
        chunks_per_block: 1,
        trees: vec![PackedTree {
            root,
            parent,
            channel: 0,
            first_chunk: 0,
            chunks: 1,
        }],
    };
    let ag = Collective::AllGather;
    let cycle = tree(vec![None, Some(2), Some(1)], 0);
    assert!(
        matches!(schedule(ag, 3, &cycle), Err(ForestError::NotATree { why, .. }) if why.contains("cycle"))
    );
    let two_roots = tree(vec![None, None, Some(0)], 0);
    assert!(matches!(
        schedule(ag, 3, &two_roots),
        Err(ForestError::NotATree { .. })
    ));
    let short = tree(vec![None, Some(0)], 0);
    assert!(matches!(
        schedule(ag, 3, &short),
        Err(ForestError::NotATree { .. })
    ));
    let self_parent = tree(vec![None, Some(1), Some(0)], 0);
    assert!(matches!(
        schedule(ag, 3, &self_parent),
        Err(ForestError::NotATree { .. })
    ));
    let mut past = tree(vec![None, Some(0), Some(0)], 0);
    past.trees[0].chunks = 2;
    assert!(matches!(
        schedule(ag, 3, &past),
        Err(ForestError::Chunks { .. })
    ));
    let far = tree(vec![None, Some(2), Some(7)], 0);
    assert!(matches!(
        schedule(ag, 3, &far),
        Err(ForestError::NotATree { .. })
    ));
    let mut high = tree(vec![None, Some(0), Some(1)], 0);
    high.trees[0].channel = u32::MAX;
    assert!(matches!(
        schedule(ag, 3, &high),
        Err(ForestError::Channel { .. })
    ));
    high.trees[0].channel = 40;
    assert!(schedule(ag, 3, &high).is_ok());
    let ar = Collective::AllReduce;
    assert!(
        matches!(schedule(ar, 3, &high), Err(ForestError::Channel { .. })),
        "doubled past 64"
    );
    let mut huge = tree(vec![None, Some(0)], 1);
    huge.chunks_per_block = 3_000_000_000;
    huge.trees[0].first_chunk = 2_000_000_000;
    assert!(matches!(schedule(ag, 2, &huge), Err(ForestError::Size(_))));
    let empty = Forest {
        chunks_per_block: 1,
        trees: Vec::new(),
    };
    assert!(matches!(
        schedule(ag, 1_000_000, &empty),
        Err(ForestError::Size(_))
    ));
    let ok = tree(vec![None, Some(0), Some(1)], 0);
    let bcast = Collective::Broadcast { root: 0 };
    assert!(matches!(
        schedule(bcast, 3, &ok),
        Err(ForestError::Collective(_))
    ));
}

#[test]
fn random_forests_run_on_the_cpu_executor_with_nothing_wrong() {
    use crate::conformance::check_schedule_on_threads;
    use crate::types::{DataType, ReduceOp};
    let mut rng = SplitMix64(11);
    for n in [1, 2, 3, 5, 8] {
        for c in [
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllReduce,
        ] {
            let forest = random_forest(&mut rng, n, c == Collective::AllReduce);
            let s = schedule(c, n, &forest).unwrap();
            let verified = std::sync::Arc::new(verify(s, &VerifyOptions::default()).unwrap());
            let kinds = [
                (DataType::F32, ReduceOp::Sum),
                (DataType::I64, ReduceOp::Max),
                (DataType::Bf16, ReduceOp::Avg),
                (DataType::U8, ReduceOp::Min),
            ];
            check_schedule_on_threads(verified, &kinds, &mut rng)
                .unwrap_or_else(|e| panic!("{e}\n{forest:?}"));
        }
    }
}
