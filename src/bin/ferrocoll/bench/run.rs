//! Timing and checking one section, on any executor behind [`Backend`].

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrocoll::Collective;
use ferrocoll::aligned::AlignedBuffer;
use ferrocoll::comm::{CommError, Communicator};
use ferrocoll::conformance::KitElement;
use ferrocoll::cpu::{self, CpuCommunicator, CpuConfig};
use ferrocoll::topo::probe::membw::Arrays;

use super::buffers::{Pattern, try_filled};
use super::check::{count_wrong, inputs};
use super::paired::{self, Paired, Round};
use super::row::{Measure, Outside, Row};
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
    /// Whether this process runs one rank of a group of processes (the
    /// others keep their own tallies of wrong elements).
    fn one_rank_per_process(&self) -> bool {
        false
    }
}

/// One rank of a [`Backend`]: its communicator (rank, size, barrier), plus
/// where the buffers of a call live.
pub(crate) trait BenchRank: Communicator {
    /// Where the buffers of a call live.
    type Buffers<T: KitElement>;
    /// Place `input` (shared: a host backend calls on it where it lies)
    /// and an output holding `output`.
    fn place<T: KitElement>(
        &mut self,
        input: &Arc<AlignedBuffer<T>>,
        output: &Pattern<'_, T>,
    ) -> Result<Self::Buffers<T>, CommError>;
    /// Write the placed output anew as `output` (whose length may differ
    /// from the placed one's: reduce-scatter in place outputs its whole
    /// input), in the memory placed before where the length is the same.
    fn rewrite<T: KitElement>(
        &mut self,
        buffers: &mut Self::Buffers<T>,
        output: &Pattern<'_, T>,
    ) -> Result<(), CommError>;
    /// Run the collective on placed buffers.
    fn collective<T: KitElement>(
        &mut self,
        buffers: &mut Self::Buffers<T>,
        collective: Collective,
        op: ferrocoll::ReduceOp,
        in_place: bool,
        count: usize,
    ) -> Result<(), CommError>;
    /// Run `iters` calls timed by the executor itself (GPU backends:
    /// enqueued back to back, timed by CUDA events), the seconds of each;
    /// `None` where the host's clock times calls one by one.
    #[allow(clippy::too_many_arguments)]
    fn timed<T: KitElement>(
        &mut self,
        _buffers: &mut Self::Buffers<T>,
        _collective: Collective,
        _op: ferrocoll::ReduceOp,
        _in_place: bool,
        _count: usize,
        _iters: u32,
    ) -> Option<Result<Vec<f64>, CommError>> {
        None
    }
    /// The output, back on the host (read where it lies when it is host
    /// memory already: copying a gigabyte only to check it doubled the
    /// check's memory traffic).
    fn output<'b, T: KitElement>(
        &mut self,
        buffers: &'b Self::Buffers<T>,
    ) -> Result<Cow<'b, [T]>, CommError>;
    /// Whether the calls move this host's memory and every rank reads one
    /// clock, so `--membw` can judge rows against a probe run between
    /// their calls ([`paired`]; the same answer on every rank).
    fn shares_host_memory(&self) -> bool {
        false
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
        self.config.planning.schedule.as_deref()
    }
}

/// Threads on host memory: buffers start on cache lines, as the slots do,
/// and the input is called on where the bench made it.
impl BenchRank for CpuCommunicator {
    type Buffers<T: KitElement> = (Arc<AlignedBuffer<T>>, AlignedBuffer<T>);

    fn place<T: KitElement>(
        &mut self,
        input: &Arc<AlignedBuffer<T>>,
        output: &Pattern<'_, T>,
    ) -> Result<Self::Buffers<T>, CommError> {
        Ok((input.clone(), output.try_aligned("output")?))
    }

    fn rewrite<T: KitElement>(
        &mut self,
        (_, placed): &mut Self::Buffers<T>,
        output: &Pattern<'_, T>,
    ) -> Result<(), CommError> {
        if placed.len() == output.len() {
            output.write(0, placed);
        } else {
            // Freed first: a gigabyte need not be held twice.
            *placed = try_filled(T::poison(), 0, "output")?;
            *placed = output.try_aligned("output")?;
        }
        Ok(())
    }

    fn collective<T: KitElement>(
        &mut self,
        (input, output): &mut Self::Buffers<T>,
        collective: Collective,
        op: ferrocoll::ReduceOp,
        in_place: bool,
        _count: usize,
    ) -> Result<(), CommError> {
        let input = (!in_place).then(|| (&input[..]).into());
        let call =
            ferrocoll::comm::Call::collective(collective, op, input, (&mut output[..]).into());
        Communicator::execute(self, call)
    }

    fn output<'b, T: KitElement>(
        &mut self,
        buffers: &'b Self::Buffers<T>,
    ) -> Result<Cow<'b, [T]>, CommError> {
        Ok(Cow::Borrowed(&buffers.1))
    }

    fn shares_host_memory(&self) -> bool {
        true
    }
}

pub(crate) fn section<B: Backend>(
    args: &BenchArgs,
    backend: &B,
    section: &Section,
    sizes: &[usize],
    progress: Option<&indicatif::ProgressBar>,
) -> Result<Vec<Row>, String> {
    ferrocoll::with_element_type!(section.dtype, T => typed::<T, B>(args, backend, section, sizes, progress))
}

/// One row's timing on this rank, in seconds: the mean over the timed
/// loop (what the table prints, as nccl-tests does: the loop's time over
/// the iterations — the host's wall time, closing barrier included, or
/// the device's between the events around the calls) and the spread of
/// the single calls.
#[derive(Debug, Clone, Copy)]
struct Timing {
    mean: f64,
    min: f64,
    median: f64,
    max: f64,
    /// With `--membw`, past the cache: the rounds against their probes.
    paired: Option<Paired>,
}

impl Timing {
    /// The row's numbers for calls of `bytes` with bus factor `factor`.
    fn measure(self, bytes: usize, factor: f64, wrong: u64) -> Measure {
        let algbw = if self.mean > 0.0 {
            bytes as f64 / self.mean / 1e9
        } else {
            0.0
        };
        Measure {
            time_us: self.mean * 1e6,
            time_us_min: self.min * 1e6,
            time_us_median: self.median * 1e6,
            time_us_max: self.max * 1e6,
            algbw,
            busbw: algbw * factor,
            wrong,
            paired: self.paired,
        }
    }

    /// From calls timed back to back on the device: the loop's time is
    /// their sum.
    fn of_calls(each: Vec<f64>) -> Self {
        Timing::new(each.iter().sum(), each)
    }

    fn new(total: f64, mut each: Vec<f64>) -> Self {
        let mean = total / each.len().max(1) as f64;
        each.sort_by(f64::total_cmp);
        let at = |i: usize| each.get(i).copied().unwrap_or(mean);
        Timing {
            mean,
            min: at(0),
            median: at(each.len() / 2),
            max: each.last().copied().unwrap_or(mean),
            paired: None,
        }
    }
}

/// Where rank 0 tells the progress bar its phase (`None` on other ranks).
type Say<'a> = Option<&'a dyn Fn(&str)>;

/// Say on the progress bar what rank 0 does now: one phase of a large
/// row (making its data, settling, checking) can take seconds.
fn phase(progress: Option<&indicatif::ProgressBar>, rank: u32, what: impl FnOnce() -> String) {
    if let Some(bar) = progress.filter(|_| rank == 0) {
        bar.set_message(what());
    }
}

/// Untimed calls of the first size before any row: what ran just before
/// (the `--membw` probe, the selector's host measurement, starting the
/// ranks) can leave two ranks sharing a core for tens of milliseconds,
/// and the first rows alone would pay for it. At most this many calls…
const SETTLE_CALLS: u32 = 200;

/// …and no more batches once this long has passed: the transient lasts
/// tens of milliseconds, and a count alone made a 16 MiB row over a
/// 1 Gbit/s network settle for 28 s, a 1 GiB row for minutes.
const SETTLE_TIME: Duration = Duration::from_millis(250);

/// The settling calls for `n` ranks: fewer when there are many (each call
/// then lasts longer, and the same time passes in fewer); the same on
/// every rank.
fn settle_calls(n: u32) -> u32 {
    (SETTLE_CALLS * 8 / n.max(1)).clamp(5, SETTLE_CALLS)
}

/// Settle with calls of `count` elements: batches of 1, 2, 4, … calls
/// until [`settle_calls`] ran or [`SETTLE_TIME`] passed on some rank.
/// Ranks decide together after each batch (one small all-reduce), so
/// every rank makes the same calls whatever its own clock says.
fn settle<T: KitElement, C: BenchRank>(
    comm: &mut C,
    placed: &mut C::Buffers<T>,
    section: &Section,
    collective: Collective,
    count: usize,
) -> Result<(), CommError> {
    let started = Instant::now();
    let (mut done, mut batch) = (0, 1);
    let most = settle_calls(comm.world_size());
    while done < most {
        let iters = batch.min(most - done);
        for _ in 0..iters {
            comm.collective(placed, collective, section.op, false, count)?;
        }
        done += iters;
        batch *= 2;
        let mut late = [i32::from(started.elapsed() >= SETTLE_TIME)];
        ferrocoll::comm::CommunicatorExt::all_reduce_in_place(
            comm,
            &mut late,
            ferrocoll::ReduceOp::Max,
        )?;
        if late[0] == 1 {
            break;
        }
    }
    Ok(())
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
    let pairs = args.membw && n >= 2 && collective == Collective::AllReduce;
    let results = backend.run(&|comm: &mut B::Rank| {
        let wanted = pairs && comm.shares_host_memory();
        let mut pairing = paired::Pairing::agree(comm, wanted)?;
        for (i, &size) in sizes.iter().enumerate() {
            let blocks = collective.size_blocks(n) as usize;
            let count = size / (std::mem::size_of::<T>() * blocks);
            // One input per size, for both modes and the check: making it
            // is most of the time a large row spends outside its calls.
            let in_len = collective.input_blocks(n) as usize * count;
            phase(progress, comm.rank(), || format!("{size} B: making data"));
            let mut outside = Outside::default();
            let started = Instant::now();
            let input = Arc::new(inputs(comm.rank(), in_len, i as u64, section.op)?);
            outside.data_s = started.elapsed().as_secs_f64();
            // Placed once for both modes, the settling and the check:
            // a gigabyte's first touch costs more than filling it again.
            let started = Instant::now();
            let out_len = collective.output_blocks(n) as usize * count;
            let mut placed = comm.place(&input, &Pattern::poison(out_len))?;
            outside.placing_s = started.elapsed().as_secs_f64();
            outside.buffer_bytes = (in_len + out_len) * std::mem::size_of::<T>();
            if i == 0 {
                phase(progress, comm.rank(), || format!("{size} B: settling"));
                let started = Instant::now();
                settle::<T, B::Rank>(comm, &mut placed, section, collective, count)?;
                outside.untimed_calls_s = started.elapsed().as_secs_f64();
            }
            let mut probe = pairing.for_size(size, n)?;
            let mut measures = [None, None];
            let mut mine = [0u64; 2];
            for (m, in_place) in [false, true].into_iter().enumerate() {
                let proven_in_place = custom.is_none_or(|v| v.supports_in_place());
                if in_place && (collective.in_place_alias(0).is_none() || !proven_in_place) {
                    continue;
                }
                let mode = if in_place { "in place" } else { "out of place" };
                let say = |what: &str| phase(progress, 0, || format!("{size} B {mode}: {what}"));
                let say = (comm.rank() == 0).then_some(&say as &dyn Fn(&str));
                let (time, bad) = one_size::<T, B::Rank>(
                    comm,
                    &mut placed,
                    args,
                    section,
                    collective,
                    (count, &input),
                    in_place,
                    i as u64,
                    (probe.as_deref_mut(), say),
                    &mut outside,
                )?;
                wrong.lock().unwrap()[i][m] += bad;
                mine[m] = bad;
                measures[m] = Some(time);
            }
            drop(placed);
            // Ranks in other processes have their own tallies: sum them.
            if backend.one_rank_per_process() {
                let mut total = mine;
                ferrocoll::comm::CommunicatorExt::all_reduce_in_place(
                    comm,
                    &mut total,
                    ferrocoll::ReduceOp::Sum,
                )?;
                wrong.lock().unwrap()[i] = total;
            }
            comm.barrier()?;
            if comm.rank() == 0 {
                let w = wrong.lock().unwrap()[i];
                let shape = (collective, custom, count);
                let row = row_of::<T>(section, shape, n, measures, w, outside);
                rows.lock().unwrap().push(row);
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

/// Rank 0's row for one size: nccl-tests' columns from the modes' timings
/// and the group's wrong elements, and where its time outside went.
fn row_of<T: KitElement>(
    section: &Section,
    (collective, custom, count): (Collective, Option<&ferrocoll::Verified>, usize),
    n: u32,
    measures: [Option<Timing>; 2],
    wrong: [u64; 2],
    outside: Outside,
) -> Row {
    let blocks = collective.size_blocks(n) as usize;
    let bytes = count * blocks * std::mem::size_of::<T>();
    let factor = collective.bus_bandwidth_factor(n);
    let measure = |m: usize| measures[m].map(|t: Timing| t.measure(bytes, factor, wrong[m]));
    Row {
        collective: section.kind.name().to_owned(),
        algorithm: match (custom, section.algorithm) {
            (Some(v), _) => v.schedule().name.clone(),
            (None, Some(a)) => a.name().to_owned(),
            (None, None) => "auto".to_owned(),
        },
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
        outside: Some(outside),
    }
}

/// Time one size in one mode on this rank; returns (seconds per
/// iteration, wrong elements of the checked run). With `probe`, the timed
/// calls run in [`paired::ROUNDS`] rounds between probes of the memory.
#[allow(clippy::too_many_arguments)]
fn one_size<T: KitElement, C: BenchRank>(
    comm: &mut C,
    placed: &mut C::Buffers<T>,
    args: &BenchArgs,
    section: &Section,
    collective: Collective,
    (count, mine): (usize, &[T]),
    in_place: bool,
    seed: u64,
    (probe, say): (Option<&mut Arrays>, Say<'_>),
    outside: &mut Outside,
) -> Result<(Timing, u64), CommError> {
    let since = |started: Instant| started.elapsed().as_secs_f64();
    let say = |what: &str| {
        if let Some(say) = say {
            say(what);
        }
    };
    say("placing");
    let started = Instant::now();
    let n = comm.world_size();
    let rank = comm.rank();
    let out_len = collective.output_blocks(n) as usize * count;
    let op = section.op;
    let pattern = if in_place {
        Pattern::in_place(collective, rank, count, mine, out_len)
    } else {
        Pattern::poison(out_len)
    };
    comm.rewrite(placed, &pattern)?;
    outside.placing_s += since(started);
    let started = Instant::now();
    for _ in 0..args.warmup {
        comm.collective(placed, collective, op, in_place, count)?;
    }
    comm.barrier()?;
    say("timing");
    let timing = match comm.timed(placed, collective, op, in_place, count, args.iters) {
        Some(each) => {
            let each = each?;
            comm.barrier()?;
            Timing::of_calls(each)
        }
        None => {
            let call = |comm: &mut C, placed: &mut C::Buffers<T>| {
                comm.collective(placed, collective, op, in_place, count)
            };
            match probe {
                None => host_loop(comm, placed, args.iters, call)?,
                Some(arrays) => {
                    let bytes =
                        count * collective.size_blocks(n) as usize * std::mem::size_of::<T>();
                    let factor = collective.bus_bandwidth_factor(n);
                    paired_loop(comm, placed, args.iters, arrays, call, |rounds| {
                        Paired::of(rounds, bytes, factor, n)
                    })?
                }
            }
        }
    };
    // The loop's own time is the row's; the rest (warm-up, probes
    // between rounds) is not.
    outside.untimed_calls_s += (since(started) - timing.mean * f64::from(args.iters)).max(0.0);
    if args.check == 0 {
        return Ok((timing, 0));
    }
    // Out of place, the timed calls left the last one's output: checking
    // it checks a call on inputs the loop kept (a call that wrote its
    // input shows). In place, every call reduced the last one's result:
    // the check runs once more on fresh data (as it does when no call ran).
    say("checking");
    if in_place || args.iters + args.warmup == 0 {
        let started = Instant::now();
        comm.rewrite(placed, &pattern)?;
        outside.placing_s += since(started);
        let started = Instant::now();
        comm.collective(placed, collective, op, in_place, count)?;
        outside.untimed_calls_s += since(started);
    }
    let started = Instant::now();
    let out = comm.output(placed)?;
    let wrong = count_wrong(collective, op, n, rank, count, seed, in_place, mine, &out)?;
    outside.checking_s += since(started);
    Ok((timing, wrong))
}

/// `iters` calls timed by the host's clock one by one, and the loop's
/// wall time with the closing barrier.
fn host_loop<C: BenchRank, P>(
    comm: &mut C,
    placed: &mut P,
    iters: u32,
    call: impl Fn(&mut C, &mut P) -> Result<(), CommError>,
) -> Result<Timing, CommError> {
    let mut each = Vec::with_capacity(iters as usize);
    let secs = timed_calls(comm, placed, iters, &call, &mut each)?;
    Ok(Timing::new(secs, each))
}

/// `calls` calls, each's time pushed on `each`; the wall time of them all
/// with the closing barrier.
fn timed_calls<C: BenchRank, P>(
    comm: &mut C,
    placed: &mut P,
    calls: u32,
    call: &impl Fn(&mut C, &mut P) -> Result<(), CommError>,
    each: &mut Vec<f64>,
) -> Result<f64, CommError> {
    let started = Instant::now();
    for _ in 0..calls {
        let t = Instant::now();
        call(comm, placed)?;
        each.push(t.elapsed().as_secs_f64());
    }
    comm.barrier()?;
    Ok(started.elapsed().as_secs_f64())
}

/// [`host_loop`] in rounds with a probe of the memory before the first
/// and after each; the mean is over the rounds' time alone.
fn paired_loop<C: BenchRank, P>(
    comm: &mut C,
    placed: &mut P,
    iters: u32,
    arrays: &mut Arrays,
    call: impl Fn(&mut C, &mut P) -> Result<(), CommError>,
    verdict: impl Fn(&[Round]) -> Option<Paired>,
) -> Result<Timing, CommError> {
    let rounds = paired::ROUNDS.min(iters).max(1);
    let mut each = Vec::with_capacity(iters as usize);
    let mut done = Vec::with_capacity(rounds as usize);
    let mut before = paired::probe(comm, arrays)?;
    for i in 0..rounds {
        let calls = paired::calls_in_round(iters, rounds, i);
        let secs = timed_calls(comm, placed, calls, &call, &mut each)?;
        let after = paired::probe(comm, arrays)?;
        done.push(Round {
            secs,
            calls,
            memory_gbps: before.max(after),
        });
        before = after;
    }
    let total = done.iter().map(|r| r.secs).sum();
    Ok(Timing {
        paired: verdict(&done),
        ..Timing::new(total, each)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paired_loop_makes_every_call_between_probes_on_every_rank() {
        let results = cpu::run(2, &CpuConfig::default(), |comm| {
            // Small arrays: this checks the protocol, it measures nothing.
            let mut arrays = Arrays::new(1 << 20).unwrap();
            let input = Arc::new(AlignedBuffer::try_copy(&[1.0f32; 1024]).unwrap());
            let mut placed = comm.place(&input, &Pattern::poison(1024))?;
            assert_eq!(
                placed.0.as_ptr() as usize % 64,
                0,
                "buffers start on a line"
            );
            let made = std::cell::Cell::new(0u32);
            let call =
                |comm: &mut CpuCommunicator,
                 placed: &mut <CpuCommunicator as BenchRank>::Buffers<f32>| {
                    made.set(made.get() + 1);
                    comm.collective(
                        placed,
                        Collective::AllReduce,
                        ferrocoll::ReduceOp::Sum,
                        false,
                        1024,
                    )
                };
            let seen = std::cell::RefCell::new(Vec::new());
            let timing = paired_loop(comm, &mut placed, 7, &mut arrays, call, |rounds| {
                seen.borrow_mut().extend(rounds.iter().map(|r| r.calls));
                Paired::of(rounds, 4096, 1.0, 2)
            })?;
            assert!(placed.1.iter().all(|&x| x == 2.0), "the calls ran");
            Ok((made.get(), seen.into_inner(), timing.paired))
        });
        for r in results {
            let (made, rounds, paired) = r.unwrap();
            assert_eq!(made, 7);
            assert_eq!(rounds, [1, 1, 2, 1, 2], "7 calls over 5 rounds");
            let p = paired.expect("a verdict");
            assert_eq!(p.rounds, 5);
            assert!(p.memory_gbps > 0.0 && p.ratio_min > 0.0, "{p:?}");
        }
    }

    #[test]
    fn a_device_loop_reports_the_sum_of_its_calls_over_their_number() {
        let t = Timing::of_calls(vec![3e-3, 1e-3, 2e-3, 6e-3]);
        assert_eq!(t.mean, 3e-3);
        assert_eq!((t.min, t.median, t.max), (1e-3, 3e-3, 6e-3));
        let host = Timing::new(1.0, vec![0.1; 4]);
        assert_eq!(
            host.mean, 0.25,
            "the host loop's wall time, barrier included"
        );
    }
}
