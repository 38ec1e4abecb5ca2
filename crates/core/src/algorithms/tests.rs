//! Every built-in algorithm × collective it supports × world size 1..=64,
//! proven by the verifier and replayed on concrete data.

use super::*;
use crate::plan::{Chunking, compile};
use crate::replay::replay;
use crate::types::{CallShape, DataType};
use crate::verify::{VerifyOptions, verify};

fn supported() -> Vec<(Algorithm, CollectiveKind)> {
    applicable().collect()
}

#[test]
fn every_algorithm_verifies_for_every_world_size_up_to_64() {
    for (algorithm, kind) in supported() {
        for n in 1..=64u32 {
            let roots = if kind.with_root(0).root().is_some() {
                vec![0, n / 2, n - 1]
            } else {
                vec![0]
            };
            for root in roots {
                let collective = kind.with_root(root);
                let schedule = generate(algorithm, collective, n, &AlgorithmParams::default())
                    .unwrap_or_else(|e| panic!("{algorithm} {collective} n={n}: {e}"));
                if let Err(e) = verify(schedule, &VerifyOptions::default()) {
                    panic!("{algorithm} {collective} n={n}: {e}\n{:#?}", e.violations);
                }
            }
        }
    }
}

use crate::conformance::{KitElement, SplitMix64 as Rng, expected, wrong_elements};
use crate::types::ReduceOp;

const POISON: u64 = 0xdead_beef_dead_beef;

/// Compile `verified` for a call, replay the plan on random data and
/// compare with the reference.
fn check_replay(
    verified: &crate::verify::Verified,
    count: usize,
    chunking: Chunking,
    in_place: bool,
    seed: u64,
) {
    let s = verified.schedule();
    let (n, collective) = (s.world_size, s.collective);
    let mut rng = Rng(seed);
    let in_len = collective.input_blocks(n) as usize * count;
    let out_len = collective.output_blocks(n) as usize * count;
    let inputs: Vec<Vec<u64>> = (0..n)
        .map(|_| (0..in_len).map(|_| rng.next_u64() | 1).collect())
        .collect();
    // Wrapping sum and max: exact, so any misplaced element shows.
    for op in [ReduceOp::Sum, ReduceOp::Max] {
        let f = |a: u64, b: u64| u64::reference(op, &[a, b]);
        let shape = CallShape {
            collective,
            count,
            dtype: DataType::U64,
            op,
            in_place,
            purpose: Default::default(),
        };
        let plan = compile(verified, &shape, chunking, 2).expect("a verified schedule compiles");
        plan.check().expect("compiled plans are well formed");
        let segments = plan.segments;
        let outputs = vec![vec![POISON; out_len]; n as usize];
        let got = replay(&plan, inputs.clone(), outputs, f);
        for (r, g) in got.iter().enumerate() {
            let ctx = || {
                format!(
                    "{} {collective} n={n} count={count} segments={segments} in_place={in_place} rank {r}",
                    s.name
                )
            };
            let want = expected(collective, op, n, count, r as u32, &inputs);
            let untouched = if in_place {
                inputs[r].clone()
            } else {
                vec![POISON; count]
            };
            let wrong = wrong_elements(op, &want, g, &untouched);
            assert!(
                wrong.is_empty(),
                "{}: wrong elements {:?}",
                ctx(),
                &wrong[..wrong.len().min(8)]
            );
        }
    }
}

#[test]
fn every_algorithm_moves_real_elements_right_for_awkward_lengths() {
    let mut seed = 1;
    for (algorithm, kind) in supported() {
        for n in (1..=9).chain([16, 17, 31]) {
            let collective = kind.with_root(n / 2);
            let schedule = generate(algorithm, collective, n, &AlgorithmParams::default()).unwrap();
            let verified = verify(schedule, &VerifyOptions::default()).unwrap();
            let n = n as usize;
            for count in [0, 1, n.saturating_sub(1), n, n + 1, 97] {
                for segments in [1, 3] {
                    for in_place in [false, true] {
                        if in_place && !verified.supports_in_place() {
                            continue;
                        }
                        seed += 1;
                        check_replay(
                            &verified,
                            count,
                            Chunking::Segments(segments),
                            in_place,
                            seed,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_large_count_streams_through_many_segments() {
    for algorithm in Algorithm::ALL {
        let collective = Collective::AllReduce;
        let schedule = generate(algorithm, collective, 6, &AlgorithmParams::default()).unwrap();
        let verified = verify(schedule, &VerifyOptions::default()).unwrap();
        // 100_003 elements, chunks of at most 4 KiB of u64.
        check_replay(&verified, 100_003, Chunking::MaxBytes(4096), true, 42);
    }
}

#[test]
fn json_round_trips_every_built_in_schedule() {
    for (algorithm, kind) in supported() {
        for n in [1, 2, 3, 5, 8, 13] {
            for channels in [1, 2] {
                let params = AlgorithmParams {
                    channels,
                    ..AlgorithmParams::default()
                };
                let Ok(schedule) = generate(algorithm, kind.with_root(n - 1), n, &params) else {
                    assert_eq!(algorithm, Algorithm::HalvingDoubling);
                    continue;
                };
                let text = schedule.to_json();
                assert_eq!(
                    Schedule::from_json(&text).unwrap(),
                    schedule,
                    "{algorithm} {kind} n={n}"
                );
            }
        }
    }
}

#[test]
fn inapplicable_combinations_are_typed_errors() {
    let p = AlgorithmParams::default();
    let e = generate(Algorithm::Tree, Collective::AllGather, 4, &p).unwrap_err();
    assert!(matches!(e, AlgorithmError::NotApplicable { .. }), "{e}");
    assert!(e.to_string().contains("tree cannot run all-gather"), "{e}");
    let e = generate(Algorithm::Ring, Collective::AllToAll, 4, &p).unwrap_err();
    assert!(matches!(e, AlgorithmError::NotApplicable { .. }));
    let e = generate(Algorithm::Ring, Collective::Broadcast { root: 4 }, 4, &p).unwrap_err();
    assert_eq!(
        e,
        AlgorithmError::RootOutOfRange {
            root: 4,
            world_size: 4
        }
    );
    assert_eq!(
        generate(Algorithm::Direct, Collective::AllReduce, 0, &p).unwrap_err(),
        AlgorithmError::WorldSizeZero
    );
    assert!(matches!(
        generate(Algorithm::Ring, Collective::AllReduce, 100_000, &p),
        Err(AlgorithmError::WorldSizeTooLarge {
            world_size: 100_000
        })
    ));
    let bad_order = AlgorithmParams {
        channels: 1,
        ring_orders: vec![vec![0, 1, 1]],
        ..AlgorithmParams::default()
    };
    let e = generate(Algorithm::Ring, Collective::AllReduce, 3, &bad_order).unwrap_err();
    assert!(matches!(e, AlgorithmError::BadRingOrder { .. }));
    let bad_tree = AlgorithmParams {
        tree_order: vec![2, 0, 0],
        ..AlgorithmParams::default()
    };
    let e = generate(Algorithm::Tree, Collective::AllReduce, 3, &bad_tree).unwrap_err();
    assert!(matches!(e, AlgorithmError::BadTreeOrder { .. }));
    let two = AlgorithmParams {
        channels: 2,
        ..AlgorithmParams::default()
    };
    let e = generate(Algorithm::HalvingDoubling, Collective::AllReduce, 4, &two).unwrap_err();
    assert!(matches!(e, AlgorithmError::SingleChannelOnly { .. }));
}

mod random {
    use super::*;
    use proptest::prelude::*;

    fn params(channels: u32, n: u32, shuffle: u64) -> AlgorithmParams {
        // A random ring order per channel (Fisher-Yates driven by `shuffle`).
        let mut rng = Rng(shuffle);
        let mut shuffled = || {
            let mut order: Vec<Rank> = (0..n).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            order
        };
        let ring_orders = (0..channels).map(|_| shuffled()).collect();
        AlgorithmParams {
            channels,
            ring_orders,
            tree_order: shuffled(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn random_configurations_verify_and_replay(
            pick in 0usize..64,
            n in 1u32..=40,
            channels in 1u32..=3,
            root in 0u32..64,
            shuffle in any::<u64>(),
            count in 0usize..200,
            segments in 1u32..=4,
            in_place in any::<bool>(),
        ) {
            let all = supported();
            let (algorithm, kind) = all[pick % all.len()];
            let channels = if algorithm == Algorithm::HalvingDoubling { 1 } else { channels };
            let collective = kind.with_root(root % n);
            let schedule = generate(algorithm, collective, n, &params(channels, n, shuffle)).unwrap();
            let verified = verify(schedule, &VerifyOptions::default())
                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            let in_place = in_place && verified.supports_in_place();
            check_replay(&verified, count, Chunking::Segments(segments), in_place, shuffle);
        }
    }
}
