//! All-reduce on the CPU executor, per algorithm, at a few sizes: one group
//! of threads per sample, timed by rank 0 between barriers.
//! Run with `cargo bench --bench all_reduce`.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferrocoll::comm::{Communicator, CommunicatorExt, Planning};
use ferrocoll::cpu::{self, CpuConfig};
use ferrocoll::{Algorithm, ReduceOp};

fn all_reduce(c: &mut Criterion) {
    let ranks = 4;
    for bytes in [64usize << 10, 4 << 20] {
        let mut group =
            c.benchmark_group(format!("all_reduce_f32_{}KiB_{ranks}ranks", bytes >> 10));
        group.throughput(Throughput::Bytes(bytes as u64));
        group.sample_size(10);
        for algorithm in Algorithm::ALL {
            let config = CpuConfig {
                planning: Planning {
                    algorithm: Some(algorithm),
                    ..CpuConfig::default().planning
                },
                ..CpuConfig::default()
            };
            group.bench_function(BenchmarkId::from_parameter(algorithm.name()), |b| {
                b.iter_custom(|iters| {
                    let times = cpu::run(ranks, &config, |comm| {
                        let input = vec![1.0f32; bytes / 4];
                        let mut output = vec![0.0f32; bytes / 4];
                        comm.barrier()?;
                        let started = Instant::now();
                        for _ in 0..iters {
                            comm.all_reduce(&input, &mut output, ReduceOp::Sum)?;
                        }
                        comm.barrier()?;
                        Ok(started.elapsed())
                    });
                    times
                        .into_iter()
                        .next()
                        .and_then(Result::ok)
                        .unwrap_or(Duration::ZERO)
                });
            });
        }
        group.finish();
    }
}

criterion_group!(benches, all_reduce);
criterion_main!(benches);
