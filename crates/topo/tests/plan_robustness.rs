//! Stable-toolchain fuzzing of what reads plans from outside: plan JSON
//! mutated at random must parse and check or fail with a typed error, and
//! plans edited field by field (then re-hashed, so they pass the hash
//! check) must be simulated, ordered or refused — never a panic or a hang.

mod common;

use std::sync::Arc;

use ferrocoll_core::plan::{Chunking, Compiler, ExecutionPlan};
use ferrocoll_core::types::CallShape;
use ferrocoll_core::{
    Algorithm, AlgorithmParams, Collective, DataType, ReduceOp, VerifyOptions, generate, verify,
};
use ferrocoll_topo::sim::{SimOptions, simulate_plan};
use proptest::prelude::*;

fn plans() -> Vec<ExecutionPlan> {
    [
        (Algorithm::Ring, Collective::AllReduce, 3),
        (Algorithm::Tree, Collective::Broadcast { root: 1 }, 4),
        (Algorithm::Direct, Collective::AllToAll, 3),
        (Algorithm::HalvingDoubling, Collective::ReduceScatter, 5),
    ]
    .into_iter()
    .map(|(a, collective, n)| {
        let s = generate(a, collective, n, &AlgorithmParams::default()).unwrap();
        let c = Compiler::new(Arc::new(verify(s, &VerifyOptions::default()).unwrap()));
        let shape = CallShape {
            collective,
            count: 37,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            in_place: false,
            purpose: Default::default(),
        };
        c.compile(&shape, Chunking::Segments(2), 2).unwrap()
    })
    .collect()
}

/// Set one field of one instruction (or of the plan) to `value`.
fn edit(plan: &mut ExecutionPlan, field: u8, at: usize, value: u64) {
    let total = plan.instruction_count().max(1);
    let mut k = at % total;
    let ins = plan
        .ranks
        .iter_mut()
        .flat_map(|r| r.channels.iter_mut().flatten())
        .find(|_| {
            let hit = k == 0;
            k = k.wrapping_sub(1);
            hit
        });
    let small = (value % 8) as u32;
    match (field % 12, ins) {
        (0, Some(i)) => i.bytes = value % 4096,
        (1, Some(i)) => {
            if let Some(m) = i.send.first_mut() {
                m.peer = small;
            }
        }
        (2, Some(i)) => {
            if let Some(m) = i.recv.first_mut() {
                m.index = value % 16;
                m.slot = (m.index % 2) as u32;
            }
        }
        (3, Some(i)) => {
            if let Some(p) = i.read.as_mut().and_then(|r| r.pieces.first_mut()) {
                p.offset = value % 4096;
            }
        }
        (4, Some(i)) => i.after.push(ferrocoll_core::plan::Wait {
            channel: small % 3,
            index: small,
        }),
        (5, Some(i)) => i.direct = Some(small),
        (6, Some(i)) => {
            i.recv.clear();
        }
        (7, Some(i)) => i.send.clear(),
        (8, _) => plan.slots_per_link = small,
        (9, _) => plan.world_size = small,
        (10, _) => plan.output_bytes = value % 4096,
        _ => {
            if let Some(l) = plan.links.first_mut() {
                l.bytes = value % 4096;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn edited_plans_are_simulated_or_refused(
        pick in 0usize..4,
        edits in prop::collection::vec((any::<u8>(), any::<usize>(), any::<u64>()), 1..4),
    ) {
        let mut plan = plans().swap_remove(pick);
        for &(field, at, value) in &edits {
            edit(&mut plan, field, at, value);
        }
        plan.hash = plan.compute_hash();
        let n = plan.world_size.max(1);
        let _ = plan.check();
        let _ = simulate_plan(&plan, &common::mesh(n.min(8)), &SimOptions::default());
    }

    #[test]
    fn mutated_plan_json_parses_and_checks_or_fails_cleanly(
        pick in 0usize..4,
        at in any::<usize>(),
        byte in prop::sample::select(b"0123456789,:[]{}\" ".to_vec()),
    ) {
        let mut text = plans().swap_remove(pick).to_json().into_bytes();
        let i = at % text.len();
        text[i] = byte;
        let _ = ExecutionPlan::from_json(&String::from_utf8_lossy(&text));
    }
}
