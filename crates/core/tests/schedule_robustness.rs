//! Stable-toolchain fuzzing of the schedule loader and the verifier:
//! schedule files mutated at random must load or fail with a typed error,
//! and whatever loads must verify or fail with violations — never panic.

use ferrocoll_core::{
    Algorithm, AlgorithmParams, Collective, Schedule, VerifyOptions, generate, verify,
};
use proptest::prelude::*;

fn seeds() -> Vec<String> {
    let mut out =
        vec![include_str!("../../../examples/schedules/star_all_reduce_3.json").to_owned()];
    for (a, c, n) in [
        (Algorithm::Ring, Collective::AllReduce, 3),
        (Algorithm::Tree, Collective::Broadcast { root: 1 }, 4),
        (Algorithm::Direct, Collective::AllToAll, 3),
        (Algorithm::HalvingDoubling, Collective::ReduceScatter, 4),
    ] {
        out.push(
            generate(a, c, n, &AlgorithmParams::default())
                .unwrap()
                .to_json(),
        );
    }
    out
}

fn mutate(text: &str, edits: &[(u8, usize, u8)]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for &(kind, at, byte) in edits {
        if bytes.is_empty() {
            bytes.push(byte);
            continue;
        }
        let i = at % bytes.len();
        match kind % 4 {
            0 => bytes[i] = byte,
            1 => bytes.insert(i, byte),
            2 => {
                bytes.remove(i);
            }
            _ => bytes.truncate(i),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn mutated_schedule_files_load_or_fail_cleanly(
        pick in 0usize..5,
        edits in prop::collection::vec((any::<u8>(), any::<usize>(), prop::sample::select(b"0123456789,:[]{}\" ".to_vec())), 1..6),
    ) {
        let seeds = seeds();
        let text = mutate(&seeds[pick % seeds.len()], &edits);
        if let Ok(schedule) = Schedule::from_json(&text) {
            // Loaded: the verifier accepts or reports; it never panics.
            let _ = verify(schedule, &VerifyOptions::default());
        }
    }
}
