//! How long the symbolic verifier takes per schedule, by algorithm and
//! world size (all-reduce, both buffer arrangements). Run with
//! `cargo bench --bench verify`.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ferrocoll::{Algorithm, AlgorithmParams, Collective, VerifyOptions, generate, verify};

fn verify_all_reduce(c: &mut Criterion) {
    let mut group = c.benchmark_group("verify_all_reduce");
    group.sample_size(10);
    for algorithm in Algorithm::ALL {
        for n in [8u32, 64, 256] {
            let schedule = generate(
                algorithm,
                Collective::AllReduce,
                n,
                &AlgorithmParams::default(),
            )
            .expect("all-reduce is supported by every algorithm");
            group.bench_with_input(BenchmarkId::new(algorithm.name(), n), &schedule, |b, s| {
                b.iter(|| verify(s.clone(), &VerifyOptions::default()).expect("built-ins verify"));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, verify_all_reduce);
criterion_main!(benches);
