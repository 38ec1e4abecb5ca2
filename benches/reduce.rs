//! The CPU reduction kernels: two 1 Mi-element sources into one
//! destination, per element type and op (throughput in bytes touched),
//! with the calibrated variant; then every variant this CPU can run (each
//! vector width, non-temporal and cached stores) on the fused f32 sum into
//! two destinations and on an f32 and an i8 sum, so the calibration's
//! choice can be checked against a longer measurement.
//! Run with `cargo bench --bench reduce`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferrocoll::kernels::{KernelChoice, reduce_slices};
use ferrocoll::{DataType, Reduce, ReduceOp};
use half::{bf16, f16};

const LEN: usize = 1 << 20;

fn one<T: Reduce>(c: &mut Criterion, dtype: DataType, one: T) {
    let mut group = c.benchmark_group(format!("reduce_{}", dtype.name()));
    group.throughput(Throughput::Bytes(
        (3 * LEN * std::mem::size_of::<T>()) as u64,
    ));
    group.sample_size(20);
    let a = vec![one; LEN];
    let b = vec![one; LEN];
    let mut out = vec![one; LEN];
    for op in [ReduceOp::Sum, ReduceOp::Max] {
        group.bench_function(BenchmarkId::from_parameter(op.name()), |bench| {
            bench.iter(|| reduce_slices(op, &[&a, &b], &mut out));
        });
    }
    group.finish();
}

fn kernels(c: &mut Criterion) {
    one(c, DataType::F32, 1.0f32);
    one(c, DataType::F64, 1.0f64);
    one(c, DataType::F16, f16::ONE);
    one(c, DataType::Bf16, bf16::ONE);
    one(c, DataType::I8, 1i8);
    one(c, DataType::U8, 1u8);
    one(c, DataType::I32, 1i32);
    one(c, DataType::U32, 1u32);
    one(c, DataType::I64, 1i64);
    one(c, DataType::U64, 1u64);
}

/// Each variant on the shapes the executor runs: a fused two-source sum
/// streamed to two destinations (direct all-reduce out of place, N = 2),
/// and plain two-source reductions.
fn variants(c: &mut Criterion) {
    // 64 MiB per array: past most last-level caches, like a large call.
    const BIG: usize = 16 << 20;
    let a = vec![1.0f32; BIG];
    let b = vec![2.0f32; BIG];
    let mut d0 = vec![0.0f32; BIG];
    let mut d1 = vec![0.0f32; BIG];
    let mut group = c.benchmark_group("fused_sum_f32_2x2");
    group.throughput(Throughput::Bytes((4 * BIG * 4) as u64));
    group.sample_size(10);
    for choice in KernelChoice::available() {
        group.bench_function(BenchmarkId::from_parameter(choice), |bench| {
            bench.iter(|| {
                // SAFETY: four distinct arrays of BIG elements.
                unsafe {
                    f32::reduce_stream_with(
                        choice,
                        ReduceOp::Sum,
                        &[a.as_ptr(), b.as_ptr()],
                        &[d0.as_mut_ptr(), d1.as_mut_ptr()],
                        BIG,
                    )
                }
            });
        });
    }
    group.finish();
    handoffs(c, &a, &b, &mut d0);
    let x = vec![1i8; LEN];
    let mut y = vec![0i8; LEN];
    for (name, bytes) in [("reduce_sum_f32", 4usize), ("reduce_sum_i8", 1)] {
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Bytes((3 * LEN * bytes) as u64));
        group.sample_size(20);
        for choice in KernelChoice::available() {
            group.bench_function(BenchmarkId::from_parameter(choice), |bench| {
                bench.iter(|| {
                    // SAFETY: distinct arrays of at least LEN elements.
                    unsafe {
                        if bytes == 4 {
                            f32::reduce_with(
                                choice,
                                ReduceOp::Sum,
                                &[a.as_ptr(), b.as_ptr()],
                                d0.as_mut_ptr(),
                                LEN,
                            )
                        } else {
                            i8::reduce_with(
                                choice,
                                ReduceOp::Sum,
                                &[x.as_ptr(), x.as_ptr()],
                                y.as_mut_ptr(),
                                LEN,
                            )
                        }
                    }
                });
            });
        }
        group.finish();
    }
}

criterion_group!(benches, kernels, variants);
criterion_main!(benches);

/// The hand-off path: a slot-sized (512 KiB) two-source sum written with
/// each variant's stores, then read back as the receiving rank would —
/// what the calibration's hand-off measurement times, on fresh bytes of
/// the big arrays each round.
fn handoffs(c: &mut Criterion, a: &[f32], b: &[f32], d: &mut [f32]) {
    const SLOT: usize = 128 << 10;
    let rounds = a.len() / SLOT;
    let mut group = c.benchmark_group("handoff_sum_f32_512k");
    group.throughput(Throughput::Bytes((3 * SLOT * 4) as u64));
    group.sample_size(20);
    for choice in KernelChoice::available() {
        let mut round = 0;
        group.bench_function(BenchmarkId::from_parameter(choice), |bench| {
            bench.iter(|| {
                let at = (round % rounds) * SLOT;
                round += 1;
                // SAFETY: three distinct arrays holding SLOT elements from `at`.
                unsafe {
                    f32::reduce_stream_with(
                        choice,
                        ReduceOp::Sum,
                        &[a[at..].as_ptr(), b[at..].as_ptr()],
                        &[d[at..].as_mut_ptr()],
                        SLOT,
                    );
                }
                ferrocoll::kernels::stream_fence();
                d[at..at + SLOT]
                    .iter()
                    .fold(0u32, |acc, x| acc ^ x.to_bits())
            });
        });
    }
    group.finish();
}
