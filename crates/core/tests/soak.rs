//! Soak: many random collectives on 8 ranks (threads), some with a rank
//! that dies (panics) instead of calling. Counts hangs (must be 0: every
//! survivor returns within the timeout, with an error if it needed the dead
//! rank) and wrong results (0), and prints them with how many survivors
//! finished because their part did not involve the dead rank.
//! `FERROCOLL_SOAK_TRIALS` sets the trial count (CI runs a short version).

use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferrocoll_core::comm::{CommError, Planning};
use ferrocoll_core::conformance::{Case, Harness, KitElement, SplitMix64, call_case, check_case};
use ferrocoll_core::cpu::{self, CpuConfig};
use ferrocoll_core::{DataType, ReduceOp};

const RANKS: u32 = 8;
const TIMEOUT: Duration = Duration::from_secs(2);

/// The CPU executor; `victim` dies (panics) before its call.
struct Cpu {
    victim: Option<u32>,
}

impl Harness for Cpu {
    fn run<T: KitElement>(
        &self,
        case: &Case,
        inputs: &[Vec<T>],
        outputs: Vec<Vec<T>>,
    ) -> Result<Vec<Vec<T>>, String> {
        let config = CpuConfig {
            planning: Planning {
                timeout: TIMEOUT,
                algorithm: case.algorithm,
                max_chunk_bytes: Some(1024),
                ..CpuConfig::default().planning
            },
            ..CpuConfig::default()
        };
        let outputs: Vec<Mutex<Vec<T>>> = outputs.into_iter().map(Mutex::new).collect();
        let victim = self.victim;
        let results = cpu::run(case.world_size, &config, |comm| {
            let r = ferrocoll_core::comm::Communicator::rank(comm);
            if Some(r) == victim {
                panic!("rank {r} dies");
            }
            let mut out = std::mem::take(&mut *outputs[r as usize].lock().unwrap());
            call_case(comm, case, &inputs[r as usize], &mut out)?;
            Ok::<_, CommError>(out)
        });
        if victim.is_some() {
            // Survivors either finished (their part never needed the dead
            // rank) or reported an error; hanging is caught by the caller.
            let finished = results.iter().filter(|x| x.is_ok()).count();
            return Err(format!("SURVIVORS_FINISHED={finished}"));
        }
        results
            .into_iter()
            .enumerate()
            .map(|(r, x)| x.map_err(|e| format!("rank {r}: {e}")))
            .collect()
    }
}

#[test]
fn random_collectives_with_random_deaths() {
    let trials: u64 = std::env::var("FERROCOLL_SOAK_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let applicable: Vec<_> = ferrocoll_core::algorithms::applicable().collect();
    let dtypes = [
        DataType::F32,
        DataType::I32,
        DataType::F64,
        DataType::Bf16,
        DataType::U8,
    ];
    // The dying ranks' panics are expected; keep their reports quiet.
    std::panic::set_hook(Box::new(|_| {}));
    let (mut hangs, mut wrong, mut finished, mut killed) = (0u64, 0u64, 0u64, 0u64);
    let mut rng = SplitMix64(0x50a4);
    let started = Instant::now();
    for trial in 0..trials {
        let (algorithm, kind) = applicable[(rng.next_u64() % applicable.len() as u64) as usize];
        let collective = kind.with_root((rng.next_u64() % u64::from(RANKS)) as u32);
        let in_place = collective.in_place_alias(0).is_some() && rng.next_u64() % 2 == 0;
        let case = Case {
            collective,
            algorithm: Some(algorithm),
            world_size: RANKS,
            count: (rng.next_u64() % 3000) as usize,
            dtype: dtypes[(rng.next_u64() % dtypes.len() as u64) as usize],
            op: ReduceOp::ALL[(rng.next_u64() % 5) as usize],
            in_place,
            seed: trial,
        };
        let victim = (rng.next_u64() % 10 == 0).then(|| (rng.next_u64() % u64::from(RANKS)) as u32);
        killed += u64::from(victim.is_some());
        // Run on a helper thread so a hang is counted, not suffered.
        let (tx, rx) = mpsc::channel();
        let c = case;
        std::thread::spawn(move || {
            let _ = tx.send(check_case(&Cpu { victim }, &c));
        });
        match rx.recv_timeout(TIMEOUT * 5) {
            Err(_) => hangs += 1,
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                if let Some(n) = e.split("SURVIVORS_FINISHED=").nth(1) {
                    finished += n
                        .trim_end_matches(|c: char| !c.is_ascii_digit())
                        .parse::<u64>()
                        .unwrap_or(0);
                } else {
                    wrong += 1;
                    eprintln!("trial {trial}: {e}");
                }
            }
        }
    }
    println!(
        "soak: {trials} trials on {RANKS} ranks ({killed} with a rank killed) in {:.1} s: hangs {hangs}, wrong results {wrong}; survivors of killed trials that finished without needing the dead rank: {finished}, the rest reported errors",
        started.elapsed().as_secs_f64()
    );
    let _ = std::panic::take_hook();
    assert_eq!((hangs, wrong), (0, 0));
}
