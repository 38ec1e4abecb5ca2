//! The conformance kit on NCCL, on a GPU machine. Skips (printing
//! `SKIPPED:`) without NCCL or a GPU; `FERROCOLL_REQUIRE_GPU=1` makes that
//! a failure. Ranks share device 0 unless `FERROCOLL_CUDA_DEVICES` lists
//! devices; several ranks on one GPU need NCCL ≥ 2.30 with
//! `NCCL_MULTI_RANK_GPU_ENABLE=1`, so without it only one rank runs.

use std::time::Duration;

use ferrocoll_core::conformance::{Case, Harness, KitElement, check_case, run_on_threads};
use ferrocoll_core::{Collective, DataType, ReduceOp};
use ferrocoll_nccl::NcclConfig;

fn skip() -> Option<String> {
    let required = std::env::var("FERROCOLL_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let why = match nccl_rs_sys::library() {
        Err(e) => Some(e.to_string()),
        // SAFETY: only tries to open libcuda.
        Ok(_) if !unsafe { cudarc::driver::sys::is_culib_present() } => {
            Some("no libcuda".to_owned())
        }
        Ok(_) => None,
    };
    if let Some(w) = &why
        && required
    {
        panic!("FERROCOLL_REQUIRE_GPU=1 but {w}");
    }
    why
}

fn devices(n: u32) -> Vec<usize> {
    let list: Vec<usize> = std::env::var("FERROCOLL_CUDA_DEVICES")
        .ok()
        .map(|s| s.split(',').filter_map(|d| d.trim().parse().ok()).collect())
        .filter(|l: &Vec<usize>| !l.is_empty())
        .unwrap_or_else(|| vec![0]);
    (0..n as usize).map(|r| list[r % list.len()]).collect()
}

struct Nccl;

impl Harness for Nccl {
    fn run<T: KitElement>(
        &self,
        case: &Case,
        inputs: &[Vec<T>],
        outputs: Vec<Vec<T>>,
    ) -> Result<Vec<Vec<T>>, String> {
        let config = NcclConfig {
            timeout: Duration::from_secs(30),
            ..NcclConfig::default()
        };
        run_on_threads(case, inputs, outputs, |f| {
            ferrocoll_nccl::run(&devices(case.world_size), &config, f).map_err(|e| e.to_string())
        })
    }
}

#[test]
fn nccl_matches_the_serial_reference() {
    if let Some(reason) = skip() {
        println!("SKIPPED: {reason}");
        return;
    }
    let multi = std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").is_ok_and(|v| v == "1")
        || std::env::var("FERROCOLL_CUDA_DEVICES").is_ok();
    let sizes: &[u32] = if multi { &[1, 2, 4, 8] } else { &[1] };
    let mut seed = 0;
    let mut cases = Vec::new();
    for &n in sizes {
        for collective in [
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
            Collective::Broadcast { root: n - 1 },
            Collective::Reduce { root: 0 },
            Collective::AllToAll,
        ] {
            for dtype in [DataType::F32, DataType::I32, DataType::Bf16] {
                for in_place in [false, true] {
                    if in_place && collective.in_place_alias(0).is_none() {
                        continue;
                    }
                    seed += 1;
                    cases.push(Case {
                        collective,
                        algorithm: None,
                        world_size: n,
                        count: 1031,
                        dtype,
                        op: ReduceOp::Sum,
                        in_place,
                        seed,
                    });
                }
            }
        }
    }
    for case in &cases {
        if let Err(e) = check_case(&Nccl, case) {
            panic!("{e}");
        }
    }
    println!("{} NCCL cases passed", cases.len());
}
