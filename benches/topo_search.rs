//! The ring search (`ferrocoll::topo::search::rings`) on all-NVLink
//! machines of 8, 16, 64 and 128 GPUs: a full mesh of direct links (the
//! hardest case for the heuristic: every ring is a candidate) and the
//! NVSwitch fabric `nvidia-smi topo -m` text of all-`NV18` pairs becomes.
//! Up to 9 GPUs the search is exhaustive, above it bounded. Run with
//! `cargo bench --bench topo_search`.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ferrocoll::topo::Topology;
use ferrocoll::topo::search::{self, MAX_RINGS};
use ferrocoll::topo::sim::CostModel;

// The graphs the topology crate's tests search, so the bench times the
// same work the tests bound.
#[path = "../crates/topo/tests/common/mod.rs"]
mod common;

const SIZES: [u32; 4] = [8, 16, 64, 128];

fn rings(c: &mut Criterion) {
    for (name, build) in [
        ("ring_search_mesh", common::mesh as fn(u32) -> Topology),
        ("ring_search_smi_nv18", |n| {
            common::all_nvlink_smi(n as usize)
        }),
    ] {
        let mut group = c.benchmark_group(name);
        group.sample_size(10);
        for n in SIZES {
            let t = build(n);
            let devices = t.devices();
            let cost = CostModel::default();
            group.bench_function(BenchmarkId::from_parameter(n), |bench| {
                bench.iter(|| search::rings(&t, &devices, &cost, MAX_RINGS).expect("searches"));
            });
        }
        group.finish();
    }
}

criterion_group!(benches, rings);
criterion_main!(benches);
