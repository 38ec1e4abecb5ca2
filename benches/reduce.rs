//! The CPU reduction kernels: two 1 Mi-element sources into one
//! destination, per element type and op (throughput in bytes touched).
//! Run with `cargo bench --bench reduce`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferrocoll::kernels::reduce_slices;
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

criterion_group!(benches, kernels);
criterion_main!(benches);
