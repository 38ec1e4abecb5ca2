//! The conformance kit: runs collectives on any executor and checks every
//! rank's output against a serial reference.
//!
//! An executor plugs in by implementing [`Harness`]; [`check_case`] makes
//! random inputs (never zero), poisons the outputs so an unwritten element
//! shows, runs the case, and compares. Integers must match exactly (sums
//! and products wrap); floats within a tolerance scaled by the magnitude of
//! the inputs: `n × ε(type) × Σ|xᵢ|` for sums, relative `n × ε` for
//! products, exact for min and max.

mod count;
mod misses;

pub use count::{Inputs, count_wrong, count_wrong_by};

use half::{bf16, f16};

use crate::algorithms::Algorithm;
use crate::comm::Planning;
use crate::kernels::Reduce;
use crate::types::{Collective, DataType, Element, Rank, ReduceOp};

/// One collective call to check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Case {
    /// What to run.
    pub collective: Collective,
    /// The algorithm (`None`: the executor's choice).
    pub algorithm: Option<Algorithm>,
    /// Ranks.
    pub world_size: u32,
    /// Elements per block.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction op (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// In place or not.
    pub in_place: bool,
    /// Seed of the inputs.
    pub seed: u64,
}

/// An executor under test.
pub trait Harness {
    /// Run `case` with `inputs[r]` as rank `r`'s input and `outputs[r]` as
    /// its (poisoned) output, and return the outputs. In place, the input
    /// is placed inside the output as the collective defines before the
    /// call (the kit does that), so `inputs` are for reference only.
    fn run<T: KitElement>(
        &self,
        case: &Case,
        inputs: &[Vec<T>],
        outputs: Vec<Vec<T>>,
    ) -> Result<Vec<Vec<T>>, String>;
}

/// An element the kit can generate, reduce serially and compare.
pub trait KitElement: Reduce {
    /// A random non-zero value from `bits`; products stay near 1 for floats.
    fn random(bits: u64, op: ReduceOp) -> Self;
    /// A value that no correct run produces in the inputs' range.
    fn poison() -> Self;
    /// The serial reduction of `values` (in rank order) under `op`.
    fn reference(op: ReduceOp, values: &[Self]) -> Self;
    /// Whether `got` is acceptably close to `want` for a reduction of `values`.
    fn close(op: ReduceOp, got: Self, want: Self, values: &[Self]) -> bool;
    /// How many of `got` are not [`close`](Self::close) to the
    /// [`reference`](Self::reference) over `ranks` (`ranks[r][j]` is rank
    /// `r`'s value for `got[j]`; each at least as long as `got`): the same
    /// judgement, a block at a time.
    fn count_misses(op: ReduceOp, got: &[Self], ranks: &[&[Self]]) -> usize;
}

macro_rules! int_kit {
    ($($t:ty),*) => {$(
        impl KitElement for $t {
            // Called per element of a checked gigabyte, across crates.
            #[inline]
            fn random(bits: u64, _op: ReduceOp) -> Self {
                let v = bits as $t;
                if v == 0 { 1 } else { v }
            }
            fn poison() -> Self { <$t>::MAX / 2 + 3 }
            // Called per element of a checked gigabyte, across crates.
            #[inline]
            fn reference(op: ReduceOp, values: &[Self]) -> Self {
                let fold = |f: fn($t, $t) -> $t| values.iter().copied().reduce(f).expect("n >= 1");
                match op {
                    ReduceOp::Sum => fold(<$t>::wrapping_add),
                    ReduceOp::Avg => fold(<$t>::wrapping_add).divide(values.len() as u32),
                    ReduceOp::Prod => fold(<$t>::wrapping_mul),
                    ReduceOp::Min => fold(|a, b| a.min(b)),
                    ReduceOp::Max => fold(|a, b| a.max(b)),
                }
            }
            // Called per element of a checked gigabyte, across crates.
            #[inline]
            fn close(_op: ReduceOp, got: Self, want: Self, _values: &[Self]) -> bool { got == want }
            fn count_misses(op: ReduceOp, got: &[Self], ranks: &[&[Self]]) -> usize {
                let divide = |x: $t, n: u32| x.divide(n);
                misses::int_misses(op, got, ranks, (<$t>::wrapping_add, <$t>::wrapping_mul, divide))
            }
        }
    )*};
}

int_kit!(i8, u8, i32, u32, i64, u64);

macro_rules! float_kit {
    ($($t:ty => $to:expr, $from:expr, $eps:expr);* $(;)?) => {$(
        impl KitElement for $t {
            // Called per element of a checked gigabyte, across crates.
            #[inline]
            fn random(bits: u64, op: ReduceOp) -> Self {
                let unit = (bits >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
                let v = match op {
                    ReduceOp::Prod => 0.75 + 0.5 * unit,
                    _ => if bits & 1 == 0 { 0.5 + unit } else { -0.5 - unit },
                };
                $from(v)
            }
            fn poison() -> Self { $from(1.0e4) }
            // Called per element of a checked gigabyte, across crates.
            #[inline]
            fn reference(op: ReduceOp, values: &[Self]) -> Self {
                let xs = values.iter().map(|&x| $to(x));
                let n = values.len() as f64;
                $from(match op {
                    ReduceOp::Sum => xs.sum(),
                    ReduceOp::Avg => xs.sum::<f64>() / n,
                    ReduceOp::Prod => xs.product(),
                    ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
                    ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
                })
            }
            // Called per element of a checked gigabyte, across crates.
            #[inline]
            fn close(op: ReduceOp, got: Self, want: Self, values: &[Self]) -> bool {
                let (g, w) = ($to(got), $to(want));
                let n = values.len() as f64;
                let scale = match op {
                    ReduceOp::Min | ReduceOp::Max => return g == w,
                    ReduceOp::Prod => w.abs(),
                    ReduceOp::Sum => values.iter().map(|&x| $to(x).abs()).sum(),
                    ReduceOp::Avg => values.iter().map(|&x| $to(x).abs()).sum::<f64>() / n,
                };
                (g - w).abs() <= (n + 1.0) * $eps * scale.max(f64::MIN_POSITIVE)
            }
            fn count_misses(op: ReduceOp, got: &[Self], ranks: &[&[Self]]) -> usize {
                misses::float_misses(op, got, ranks, ($to, $from, $eps))
            }
        }
    )*};
}

float_kit! {
    f32 => |x: f32| x as f64, |v: f64| v as f32, f32::EPSILON as f64;
    f64 => |x: f64| x, |v: f64| v, f64::EPSILON;
    f16 => |x: f16| x.to_f64(), f16::from_f64, f16::EPSILON.to_f64();
    bf16 => |x: bf16| x.to_f64(), bf16::from_f64, bf16::EPSILON.to_f64();
}

/// A small, fast, seedable generator (SplitMix64) for reproducible test
/// and benchmark data; not for anything that needs real randomness.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

/// SplitMix64's increment.
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        mix(self.0)
    }

    /// What the `i`-th call of [`next_u64`](Self::next_u64) (from 0) on a
    /// generator started at `seed` returns, without the calls before it:
    /// the state only ever adds a constant.
    pub fn nth(seed: u64, i: u64) -> u64 {
        mix(seed.wrapping_add(GOLDEN_GAMMA.wrapping_mul(i.wrapping_add(1))))
    }

    /// `into[k] = T::random(nth(seed, at + k), op)`: a stretch of the
    /// values a stream makes, each independent of the one before, so the
    /// loop runs on vectors where the CPU multiplies 64-bit lanes (a
    /// benchmark makes and checks gigabytes of them).
    pub fn fill<T: KitElement>(seed: u64, at: u64, op: ReduceOp, into: &mut [T]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx512vl")
            {
                // SAFETY: the CPU has the features the function enables.
                return unsafe { fill_avx512(seed, at, op, into) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: as above.
                return unsafe { fill_avx2(seed, at, op, into) };
            }
        }
        fill_with(seed, at, op, into);
    }
}

/// [`SplitMix64::fill`]'s loop, compiled once per instruction set.
#[inline(always)]
fn fill_with<T: KitElement>(seed: u64, at: u64, op: ReduceOp, into: &mut [T]) {
    for (i, v) in (at..).zip(into) {
        *v = T::random(SplitMix64::nth(seed, i), op);
    }
}

/// [`fill_with`] with AVX-512's 64-bit multiplies and conversions.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl")]
unsafe fn fill_avx512<T: KitElement>(seed: u64, at: u64, op: ReduceOp, into: &mut [T]) {
    fill_with(seed, at, op, into);
}

/// [`fill_with`] on AVX2's vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_avx2<T: KitElement>(seed: u64, at: u64, op: ReduceOp, into: &mut [T]) {
    fill_with(seed, at, op, into);
}

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Run `case` on `harness` with the element type its `dtype` names.
pub fn check_case(harness: &impl Harness, case: &Case) -> Result<(), String> {
    crate::with_element_type!(case.dtype, T => check_typed::<T>(harness, case))
}

fn check_typed<T: KitElement>(harness: &impl Harness, case: &Case) -> Result<(), String> {
    let n = case.world_size;
    let inputs = case_inputs::<T>(case);
    let outputs = vec![poisoned_output::<T>(case); n as usize];
    let got = harness.run(case, &inputs, outputs)?;
    for r in 0..n {
        check_output(case, r, &inputs, &got[r as usize])?;
    }
    Ok(())
}

/// Every rank's input of `case`: the same on every process that asks, so
/// ranks in different processes can each check their own output.
pub fn case_inputs<T: KitElement>(case: &Case) -> Vec<Vec<T>> {
    let n = case.world_size;
    let mut rng = SplitMix64(case.seed);
    (0..n)
        .map(|_| {
            (0..case.collective.input_blocks(n) as usize * case.count)
                .map(|_| T::random(rng.next_u64(), case.op))
                .collect()
        })
        .collect()
}

/// Rank outputs filled with the poison value, sized for `case`.
pub fn poisoned_output<T: KitElement>(case: &Case) -> Vec<T> {
    vec![T::poison(); case.collective.output_blocks(case.world_size) as usize * case.count]
}

/// Compare rank `r`'s output of `case` with the serial reference.
pub fn check_output<T: KitElement>(
    case: &Case,
    r: Rank,
    inputs: &[Vec<T>],
    out: &[T],
) -> Result<(), String> {
    let want = expected(
        case.collective,
        case.op,
        case.world_size,
        case.count,
        r,
        inputs,
    );
    let untouched = if case.in_place {
        inputs[r as usize].clone()
    } else {
        vec![T::poison(); case.count]
    };
    if let Some(&i) = wrong_elements(case.op, &want, out, &untouched).first() {
        return Err(match &want {
            Expectation::Values(w) => format!(
                "{case:?}: rank {r} element {i}: got {:?}, want {:?}",
                out.get(i),
                w.get(i).map(|(v, _)| v)
            ),
            Expectation::Untouched => {
                format!("{case:?}: reduce changed non-root rank {r}'s output")
            }
        });
    }
    Ok(())
}

/// Run `case` on this rank only — for executors whose ranks live in
/// different processes — and check this rank's output: every process
/// derives all inputs from the case's seed, runs its own call through
/// [`call_case`], and compares with the serial reference.
pub fn check_rank<C: crate::comm::Communicator + ?Sized>(
    comm: &mut C,
    case: &Case,
) -> Result<(), String> {
    crate::with_element_type!(case.dtype, T => {
        let r = comm.rank();
        let inputs = case_inputs::<T>(case);
        let mut out = poisoned_output::<T>(case);
        call_case(comm, case, &inputs[r as usize], &mut out)
            .map_err(|e| format!("{case:?}: rank {r}: {e}"))?;
        check_output(case, r, &inputs, &out)
    })
}

/// What one rank's output must hold after a collective.
#[derive(Debug, Clone, PartialEq)]
pub enum Expectation<T> {
    /// Per element: the wanted value and the values it reduces.
    Values(Vec<(T, Vec<T>)>),
    /// Reduce on a non-root rank: the output must be left as it was.
    Untouched,
}

/// The serial reference: what rank `r`'s output must hold when every
/// rank's input is `inputs[rank]` (`count` elements per block). The
/// result of an in-place reduce-scatter is block `r` of the buffer.
pub fn expected<T: KitElement>(
    c: Collective,
    op: ReduceOp,
    n: u32,
    count: usize,
    r: Rank,
    inputs: &[Vec<T>],
) -> Expectation<T> {
    let reduce_block = |block: usize| -> Vec<(T, Vec<T>)> {
        (0..count)
            .map(|i| {
                let values: Vec<T> = inputs.iter().map(|x| x[block * count + i]).collect();
                (T::reference(op, &values), values)
            })
            .collect()
    };
    let copy = |v: Vec<T>| -> Vec<(T, Vec<T>)> { v.into_iter().map(|x| (x, vec![x])).collect() };
    let r = r as usize;
    Expectation::Values(match c {
        Collective::AllReduce => reduce_block(0),
        Collective::ReduceScatter => reduce_block(r),
        Collective::AllGather => copy(inputs.concat()),
        Collective::Broadcast { root } => copy(inputs[root as usize].clone()),
        Collective::Reduce { root } if root as usize == r => reduce_block(0),
        Collective::Reduce { .. } => return Expectation::Untouched,
        Collective::AllToAll => copy(
            (0..n as usize)
                .flat_map(|k| inputs[k][r * count..(r + 1) * count].to_vec())
                .collect(),
        ),
        Collective::SendRecv => copy(inputs[(r + n as usize - 1) % n as usize].clone()),
    })
}

/// Indices of `out` that miss `want` (`untouched` is what an output left
/// alone holds); an output of the wrong length counts its missing or extra
/// elements as wrong, at the end.
pub fn wrong_elements<T: KitElement>(
    op: ReduceOp,
    want: &Expectation<T>,
    out: &[T],
    untouched: &[T],
) -> Vec<usize> {
    let (wanted, mut wrong): (usize, Vec<usize>) = match want {
        Expectation::Values(w) => (
            w.len(),
            out.iter()
                .zip(w)
                .enumerate()
                .filter(|(_, (g, (w, values)))| !T::close(op, **g, *w, values))
                .map(|(i, _)| i)
                .collect(),
        ),
        Expectation::Untouched => (
            untouched.len(),
            out.iter()
                .zip(untouched)
                .enumerate()
                .filter(|(_, (g, u))| g != u)
                .map(|(i, _)| i)
                .collect(),
        ),
    };
    wrong.extend(out.len().min(wanted)..out.len().max(wanted));
    wrong
}

/// Run `case` on one rank of any [`Communicator`](crate::comm::Communicator):
/// out of place with `input` into `output`, or in place by building the
/// collective's single buffer first (and, for reduce-scatter, cutting this
/// rank's block out of it afterwards). Every executor's kit harness calls
/// this per rank.
pub fn call_case<C: crate::comm::Communicator + ?Sized, T: KitElement>(
    comm: &mut C,
    case: &Case,
    input: &[T],
    output: &mut Vec<T>,
) -> Result<(), crate::comm::CommError> {
    use crate::comm::Call;
    let (c, count) = (case.collective, case.count);
    if !case.in_place {
        let call = Call::collective(c, case.op, Some(input.into()), output.as_mut_slice().into());
        return comm.execute(call);
    }
    let mut buf = in_place_buffer(c, comm.rank(), count, input, std::mem::take(output));
    comm.execute(Call::collective(
        c,
        case.op,
        None,
        buf.as_mut_slice().into(),
    ))?;
    if c == crate::Collective::ReduceScatter {
        let r = comm.rank() as usize;
        buf = buf[r * count..(r + 1) * count].to_vec();
    }
    *output = buf;
    Ok(())
}

/// The part every harness whose ranks are threads repeats: hand rank `r`
/// its (poisoned) output, run the case through [`call_case`], and gather
/// the outputs, naming the rank of any error. `launch` starts the
/// executor's ranks and runs the given function on each — for the CPU
/// executor, `|f| Ok(cpu::run(n, &config, f))`.
pub fn run_on_threads<C, T, L>(
    case: &Case,
    inputs: &[Vec<T>],
    outputs: Vec<Vec<T>>,
    launch: L,
) -> Result<Vec<Vec<T>>, String>
where
    C: crate::comm::Communicator,
    T: KitElement,
    L: FnOnce(
        &(dyn Fn(&mut C) -> Result<Vec<T>, crate::comm::CommError> + Sync),
    ) -> Result<Vec<Result<Vec<T>, crate::comm::CommError>>, String>,
{
    let outputs: Vec<std::sync::Mutex<Vec<T>>> =
        outputs.into_iter().map(std::sync::Mutex::new).collect();
    let per_rank = |comm: &mut C| {
        let r = comm.rank() as usize;
        let mut out = std::mem::take(&mut *outputs[r].lock().unwrap_or_else(|e| e.into_inner()));
        call_case(comm, case, &inputs[r], &mut out)?;
        Ok(out)
    };
    launch(&per_rank)?
        .into_iter()
        .enumerate()
        .map(|(r, x)| x.map_err(|e| format!("rank {r}: {e}")))
        .collect()
}

/// Place rank `rank`'s input inside its output the way the in-place call of
/// `c` expects; returns the buffer to pass.
pub fn in_place_buffer<T: Element>(
    c: Collective,
    rank: Rank,
    count: usize,
    input: &[T],
    output: Vec<T>,
) -> Vec<T> {
    let infallible = |i: &[T]| Ok::<_, std::convert::Infallible>(i.to_vec());
    match in_place_buffer_with(c, rank, count, input, output, infallible) {
        Ok(buffer) => buffer,
        Err(never) => match never {},
    }
}

/// [`in_place_buffer`] for a buffer of any kind (a bench's aligned one):
/// `from_input` makes one holding `input` where the call's output is a
/// block of its input.
pub fn in_place_buffer_with<T: Element, B: std::ops::DerefMut<Target = [T]>, E>(
    c: Collective,
    rank: Rank,
    count: usize,
    input: &[T],
    mut output: B,
    from_input: impl FnOnce(&[T]) -> Result<B, E>,
) -> Result<B, E> {
    use crate::types::InPlaceAlias;
    match c.in_place_alias(rank) {
        Some(InPlaceAlias::InputIsOutputBlock(b)) => {
            let at = b as usize * count;
            output[at..at + count].copy_from_slice(input);
            Ok(output)
        }
        Some(InPlaceAlias::OutputIsInputBlock(_)) => from_input(input),
        None => Ok(output),
    }
}

/// The CPU executor as a harness, every rank a thread: `config` for every
/// case, with the case's algorithm forced when it names one. Put a
/// verified schedule in `config.schedule` to check a schedule file or a
/// synthesized schedule end to end.
pub struct CpuThreads {
    /// The executor's settings.
    pub config: crate::cpu::CpuConfig,
}

impl Harness for CpuThreads {
    fn run<T: KitElement>(
        &self,
        case: &Case,
        inputs: &[Vec<T>],
        outputs: Vec<Vec<T>>,
    ) -> Result<Vec<Vec<T>>, String> {
        let config = crate::cpu::CpuConfig {
            planning: Planning {
                algorithm: case.algorithm.or(self.config.planning.algorithm),
                ..self.config.clone().planning
            },
            ..self.config.clone()
        };
        run_on_threads(case, inputs, outputs, |f| {
            Ok(crate::cpu::run(case.world_size, &config, f))
        })
    }
}

/// Runs a proven schedule on the CPU executor (64-byte chunks, so chunk and
/// segment boundaries fall inside small calls) against the serial
/// reference: each (dtype, op) of `kinds` at counts 0, 1, 37 and 1000, in
/// place (where the collective has an in-place form) and out.
pub fn check_schedule_on_threads(
    verified: std::sync::Arc<crate::verify::Verified>,
    kinds: &[(DataType, ReduceOp)],
    rng: &mut SplitMix64,
) -> Result<(), String> {
    let (collective, world_size) = {
        let s = verified.schedule();
        (s.collective, s.world_size)
    };
    let harness = CpuThreads {
        config: crate::cpu::CpuConfig {
            planning: Planning {
                schedule: Some(verified),
                max_chunk_bytes: Some(64),
                ..crate::cpu::CpuConfig::default().planning
            },
            ..Default::default()
        },
    };
    for &(dtype, op) in kinds {
        for count in [0, 1, 37, 1000] {
            let in_place_forms = if collective.in_place_alias(0).is_some() {
                &[false, true][..]
            } else {
                &[false][..]
            };
            for &in_place in in_place_forms {
                let case = Case {
                    collective,
                    algorithm: None,
                    world_size,
                    count,
                    dtype,
                    op,
                    in_place,
                    seed: rng.next_u64(),
                };
                check_case(&harness, &case).map_err(|e| format!("{case:?}: {e}"))?;
            }
        }
    }
    Ok(())
}
