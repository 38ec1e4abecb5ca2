//! The steady-state estimate against the detailed engine, where both run.
//!
//! The bounds are what the estimate is worth today, as measured
//! (docs/topology.md): within 3 % for the full mesh, 0.9-1.1 for rings,
//! slower by up to a fifth where phases take turns on a resource
//! (halving-doubling, the hierarchy), and much faster for one tree at a
//! few segments. A change to either model that moves a case past its
//! bound fails here.

use std::sync::Arc;

use ferrocoll_core::plan::Compiler;
use ferrocoll_core::{Algorithm, AlgorithmParams, Collective, VerifyOptions, generate, verify};

use super::super::*;
use crate::presets;

fn both(compiler: &Compiler, topo: &Topology, size: usize) -> (Prediction, Prediction) {
    let at = |fidelity| SimOptions {
        fidelity,
        ..SimOptions::default()
    };
    let detailed = simulate(compiler, topo, size, &at(Fidelity::Detailed)).unwrap();
    let steady = simulate(compiler, topo, size, &at(Fidelity::Steady)).unwrap();
    assert_eq!(detailed.model, Fidelity::Detailed);
    assert_eq!(steady.model, Fidelity::Steady);
    (detailed, steady)
}

fn builtin(algo: Algorithm, n: u32, channels: u32) -> Compiler {
    let params = AlgorithmParams {
        channels,
        ..AlgorithmParams::default()
    };
    let s = generate(algo, Collective::AllReduce, n, &params).unwrap();
    Compiler::new(Arc::new(verify(s, &VerifyOptions::default()).unwrap()))
}

/// Steady time over detailed time for every size, within `[low, high]`.
fn check(name: &str, compiler: &Compiler, topo: &Topology, low: f64, high: f64) {
    for size in [64 << 10, 16 << 20, 256 << 20] {
        let (d, s) = both(compiler, topo, size);
        let ratio = s.time_us / d.time_us;
        assert!(
            (low..=high).contains(&ratio),
            "{name} on {} at {size} B: steady {:.1} µs, detailed {:.1} µs (ratio {ratio:.3}, allowed {low}..{high})",
            topo.name,
            s.time_us,
            d.time_us
        );
    }
}

#[test]
fn rings_trees_and_the_mesh_agree_with_the_detailed_engine() {
    for preset in ["dgx1-v100", "dgx-a100", "pcie4-4gpu"] {
        let t = presets::by_name(preset, 1).unwrap();
        let n = t.devices().len() as u32;
        check("ring x4", &builtin(Algorithm::Ring, n, 4), &t, 0.93, 1.1);
        check("direct", &builtin(Algorithm::Direct, n, 1), &t, 0.97, 1.03);
        // A tree's pipeline at a few segments runs ahead of the engine's
        // (measured 0.58-0.73 at 16 MiB); at 256 MiB it is within 7 %.
        check("tree", &builtin(Algorithm::Tree, n, 1), &t, 0.55, 1.03);
    }
}

#[test]
fn halving_doubling_is_estimated_slower_never_faster() {
    let t = presets::by_name("dgx1-v100", 1).unwrap();
    let hd = builtin(Algorithm::HalvingDoubling, 8, 1);
    check("halving-doubling", &hd, &t, 0.99, 1.2);
}

#[test]
fn the_hierarchy_across_two_machines_agrees() {
    let t = presets::by_name("dgx-h100x2", 1).unwrap();
    let devices = t.devices();
    let h = crate::search::hierarchy(&t, &devices, &CostModel::default())
        .unwrap()
        .expect("two machines of eight");
    let s = ferrocoll_core::algorithms::hierarchical::schedule(Collective::AllReduce, 16, &h, 1)
        .unwrap();
    let c = Compiler::new(Arc::new(verify(s, &VerifyOptions::default()).unwrap()));
    check("hierarchical", &c, &t, 0.99, 1.2);
    check("ring x2", &builtin(Algorithm::Ring, 16, 2), &t, 0.88, 1.03);
}

#[test]
fn auto_takes_the_detailed_engine_while_it_is_cheap() {
    let t = presets::by_name("dgx1-v100", 1).unwrap();
    let p = simulate(
        &builtin(Algorithm::Ring, 8, 1),
        &t,
        1 << 20,
        &SimOptions::default(),
    )
    .unwrap();
    assert_eq!(p.model, Fidelity::Detailed);
}
