//! Timing and checking one section, on any executor behind [`Backend`].

use std::sync::Mutex;
use std::time::Instant;

use ferrocoll::Collective;
use ferrocoll::comm::CommError;
use ferrocoll::conformance::{KitElement, SplitMix64, expected, in_place_buffer, wrong_elements};
use ferrocoll::cpu::{self, CpuCommunicator, CpuConfig};

use super::report::{Measure, Row};
use super::{BenchArgs, Section};

/// An executor the bench can drive: a launcher of ranks, and per rank a
/// way to place buffers where the executor works on them (host memory for
/// the CPU, device memory for CUDA), call, and read back.
pub(crate) trait Backend: Sync {
    /// One rank.
    type Rank: BenchRank;
    /// Run `f` on every rank; one result per rank.
    fn run<R: Send>(
        &self,
        f: &(dyn Fn(&mut Self::Rank) -> Result<R, CommError> + Sync),
    ) -> Result<Vec<Result<R, CommError>>, String>;
    /// The configured schedule, if the section runs one.
    fn schedule(&self) -> Option<&ferrocoll::Verified>;
    /// The rank of the first result `run` returns (ranks in other
    /// processes return their own).
    fn first_rank(&self) -> u32 {
        0
    }
}

/// One rank of a [`Backend`].
pub(crate) trait BenchRank {
    /// Where the buffers of a call live.
    type Buffers<T: KitElement>;
    fn rank(&self) -> u32;
    fn world_size(&self) -> u32;
    fn barrier(&mut self) -> Result<(), CommError>;
    /// Place `input` and `output` (in place: `output` is the one buffer).
    fn place<T: KitElement>(
        &mut self,
        input: &[T],
        output: Vec<T>,
    ) -> Result<Self::Buffers<T>, CommError>;
    /// Run the collective on placed buffers.
    fn call<T: KitElement>(
        &mut self,
        buffers: &mut Self::Buffers<T>,
        collective: Collective,
        op: ferrocoll::ReduceOp,
        in_place: bool,
        count: usize,
    ) -> Result<(), CommError>;
    /// The output, back on the host.
    fn output<T: KitElement>(&mut self, buffers: &Self::Buffers<T>) -> Result<Vec<T>, CommError>;
    /// Every rank's wrong-element counts of a size, summed, when ranks are
    /// processes (`None`: ranks share this process and its tally).
    fn total_wrong(&mut self, _mine: [u64; 2]) -> Result<Option<[u64; 2]>, CommError> {
        Ok(None)
    }
}

/// The CPU executor with `config`.
pub(crate) struct Cpu<'a> {
    pub n: u32,
    pub config: &'a CpuConfig,
}

impl Backend for Cpu<'_> {
    type Rank = CpuCommunicator;

    fn run<R: Send>(
        &self,
        f: &(dyn Fn(&mut CpuCommunicator) -> Result<R, CommError> + Sync),
    ) -> Result<Vec<Result<R, CommError>>, String> {
        Ok(cpu::run(self.n, self.config, f))
    }

    fn schedule(&self) -> Option<&ferrocoll::Verified> {
        self.config.schedule.as_deref()
    }
}

/// `BenchRank` for a communicator on host memory: buffers are vectors and
/// calls go through [`dispatch`]. Extra items (overrides) may follow.
macro_rules! host_bench_rank {
    ($ty:ty $(, $extra:item)*) => {
        impl $crate::bench::run::BenchRank for $ty {
            type Buffers<T: ferrocoll::conformance::KitElement> = (Vec<T>, Vec<T>);

            fn rank(&self) -> u32 {
                ferrocoll::comm::Communicator::rank(self)
            }

            fn world_size(&self) -> u32 {
                ferrocoll::comm::Communicator::world_size(self)
            }

            fn barrier(&mut self) -> Result<(), ferrocoll::comm::CommError> {
                ferrocoll::comm::Communicator::barrier(self)
            }

            fn place<T: ferrocoll::conformance::KitElement>(
                &mut self,
                input: &[T],
                output: Vec<T>,
            ) -> Result<(Vec<T>, Vec<T>), ferrocoll::comm::CommError> {
                Ok((input.to_vec(), output))
            }

            fn call<T: ferrocoll::conformance::KitElement>(
                &mut self,
                (input, output): &mut (Vec<T>, Vec<T>),
                collective: ferrocoll::Collective,
                op: ferrocoll::ReduceOp,
                in_place: bool,
                _count: usize,
            ) -> Result<(), ferrocoll::comm::CommError> {
                ferrocoll::comm::dispatch(self, collective, op, in_place, input, output)
            }

            fn output<T: ferrocoll::conformance::KitElement>(
                &mut self,
                buffers: &(Vec<T>, Vec<T>),
            ) -> Result<Vec<T>, ferrocoll::comm::CommError> {
                Ok(buffers.1.clone())
            }

            $($extra)*
        }
    };
}
pub(crate) use host_bench_rank;

host_bench_rank!(CpuCommunicator);

pub(crate) fn section<B: Backend>(
    args: &BenchArgs,
    backend: &B,
    section: &Section,
    sizes: &[usize],
    progress: Option<&indicatif::ProgressBar>,
) -> Result<Vec<Row>, String> {
    ferrocoll::with_element_type!(section.dtype, T => typed::<T, B>(args, backend, section, sizes, progress))
}

/// Deterministic inputs of `rank` for a size, regenerated by every rank
/// that needs them for the check (as nccl-tests does).
fn inputs<T: KitElement>(rank: u32, len: usize, seed: u64, op: ferrocoll::ReduceOp) -> Vec<T> {
    let mut rng = SplitMix64(seed ^ (u64::from(rank) << 32) ^ 0x5eed);
    (0..len).map(|_| T::random(rng.next_u64(), op)).collect()
}

fn typed<T: KitElement, B: Backend>(
    args: &BenchArgs,
    backend: &B,
    section: &Section,
    sizes: &[usize],
    progress: Option<&indicatif::ProgressBar>,
) -> Result<Vec<Row>, String> {
    let n = args.ranks;
    let custom = backend.schedule().filter(|_| section.custom);
    let collective = match custom {
        Some(v) => v.schedule().collective,
        None => section.kind.with_root(args.root),
    };
    let rows: Mutex<Vec<Row>> = Mutex::new(Vec::new());
    let wrong: Mutex<Vec<[u64; 2]>> = Mutex::new(vec![[0, 0]; sizes.len()]);
    let results = backend.run(&|comm: &mut B::Rank| {
        for (i, &size) in sizes.iter().enumerate() {
            let blocks = (collective.input_blocks(n).max(collective.output_blocks(n))) as usize;
            let count = size / (std::mem::size_of::<T>() * blocks);
            let mut measures = [None, None];
            let mut mine = [0u64; 2];
            for (m, in_place) in [false, true].into_iter().enumerate() {
                let proven_in_place = custom.is_none_or(|v| v.supports_in_place());
                if in_place && (collective.in_place_alias(0).is_none() || !proven_in_place) {
                    continue;
                }
                let (time, bad) = one_size::<T, B::Rank>(
                    comm, args, section, collective, count, in_place, i as u64,
                )?;
                wrong.lock().unwrap()[i][m] += bad;
                mine[m] = bad;
                measures[m] = Some(time);
            }
            if let Some(total) = comm.total_wrong(mine)? {
                wrong.lock().unwrap()[i] = total;
            }
            comm.barrier()?;
            if comm.rank() == 0 {
                let bytes = count * blocks * std::mem::size_of::<T>();
                let factor = collective.bus_bandwidth_factor(n);
                let w = wrong.lock().unwrap()[i];
                let measure = |m: usize| {
                    measures[m].map(|secs: f64| {
                        let algbw = if secs > 0.0 {
                            bytes as f64 / secs / 1e9
                        } else {
                            0.0
                        };
                        Measure {
                            time_us: secs * 1e6,
                            algbw,
                            busbw: algbw * factor,
                            wrong: w[m],
                        }
                    })
                };
                rows.lock().unwrap().push(Row {
                    collective: section.kind.name().to_owned(),
                    algorithm: section
                        .algorithm
                        .map_or("auto".to_owned(), |a| a.name().to_owned()),
                    ranks: n,
                    size: bytes,
                    count: count * blocks,
                    dtype: section.dtype.nccl_tests_name().to_owned(),
                    redop: if collective.reduces() {
                        section.op.name().to_owned()
                    } else {
                        "none".to_owned()
                    },
                    root: collective.root().map_or(-1, i64::from),
                    out_of_place: measure(0),
                    in_place: measure(1),
                    predicted_us: None,
                });
                if let Some(bar) = progress {
                    bar.inc(1);
                }
            }
        }
        Ok(())
    })?;
    for (r, res) in results.into_iter().enumerate() {
        res.map_err(|e| format!("rank {}: {e}", r as u32 + backend.first_rank()))?;
    }
    let mut rows = rows.into_inner().unwrap();
    rows.sort_by_key(|r| r.size);
    Ok(rows)
}

/// Time one size in one mode on this rank; returns (seconds per
/// iteration, wrong elements of the checked run).
fn one_size<T: KitElement, C: BenchRank>(
    comm: &mut C,
    args: &BenchArgs,
    section: &Section,
    collective: Collective,
    count: usize,
    in_place: bool,
    seed: u64,
) -> Result<(f64, u64), CommError> {
    let n = comm.world_size();
    let rank = comm.rank();
    let in_len = collective.input_blocks(n) as usize * count;
    let out_len = collective.output_blocks(n) as usize * count;
    let op = section.op;
    let mine: Vec<T> = inputs(rank, in_len, seed, op);
    let fresh = |mine: &[T]| -> Vec<T> {
        if in_place {
            in_place_buffer(
                collective,
                rank,
                count,
                mine,
                vec![T::poison(); out_len.max(in_len)],
            )
        } else {
            vec![T::poison(); out_len]
        }
    };
    let mut placed = comm.place(&mine, fresh(&mine))?;
    for _ in 0..args.warmup {
        comm.call(&mut placed, collective, op, in_place, count)?;
    }
    comm.barrier()?;
    let started = Instant::now();
    for _ in 0..args.iters {
        comm.call(&mut placed, collective, op, in_place, count)?;
    }
    comm.barrier()?;
    let secs = started.elapsed().as_secs_f64() / f64::from(args.iters.max(1));
    if args.check == 0 {
        return Ok((secs, 0));
    }
    let mut placed = comm.place(&mine, fresh(&mine))?;
    comm.call(&mut placed, collective, op, in_place, count)?;
    let out = comm.output(&placed)?;
    Ok((
        secs,
        count_wrong(collective, op, n, rank, count, seed, in_place, &mine, &out),
    ))
}

/// Wrong elements of this rank's checked run, against the kit's serial
/// reference over every rank's (regenerated) inputs.
#[allow(clippy::too_many_arguments)]
fn count_wrong<T: KitElement>(
    collective: Collective,
    op: ferrocoll::ReduceOp,
    n: u32,
    rank: u32,
    count: usize,
    seed: u64,
    in_place: bool,
    mine: &[T],
    out: &[T],
) -> u64 {
    let all: Vec<Vec<T>> = (0..n)
        .map(|r| {
            if r == rank {
                mine.to_vec()
            } else {
                inputs(r, mine.len(), seed, op)
            }
        })
        .collect();
    let r = rank as usize;
    let result: &[T] = match (collective, in_place) {
        (Collective::ReduceScatter, true) => &out[r * count..(r + 1) * count],
        _ => out,
    };
    let untouched = if in_place {
        mine.to_vec()
    } else {
        vec![T::poison(); count]
    };
    let want = expected(collective, op, n, count, rank, &all);
    wrong_elements(op, &want, result, &untouched).len() as u64
}
