//! The memory ceiling measured beside the calls it judges.
//!
//! A shared host's memory bandwidth moves between runs and within one:
//! on the 2 vCPU EPYC of issue 31 a probe read 67 GB/s before a sweep and
//! 106 GB/s after it, seconds apart. A row timed in the slow stretch and
//! judged against the fast probe reads 0.6 of the ceiling when it ran at
//! 0.93 of what the memory gave it then. So with `--membw`, an all-reduce
//! row past the last-level cache, on ranks that share this host's memory
//! and clock (threads, or processes over shared memory), splits its
//! timed calls into
//! [`ROUNDS`] rounds with a probe before the first and after each; the
//! ranks run the probe themselves, each on its own arrays, at once. Each
//! round is judged against the higher of the two probes around it (so a
//! change inside a round errs low), and the row reports the median, the
//! lowest and the highest of those ratios.
//!
//! Only rows past the cache are paired: their data is streamed from memory
//! whatever ran before, while a small row after a probe would run on a
//! cold cache and time something else than the unpaired row does.

use ferrocoll::comm::{CommError, Communicator, CommunicatorExt};
use ferrocoll::topo::probe::membw::{self, Arrays, Kernel};
use serde::Serialize;

/// Rounds a paired row's timed calls are split into.
pub(crate) const ROUNDS: u32 = 5;

/// busbw ceiling of an in-process all-reduce that reads each input once
/// and writes each output once, from the memory's rate `memory_gbps`:
/// BW·(n−1)/n² (all-reduce's bus factor over n ranks' 2·S bytes of
/// traffic).
pub(crate) fn ceiling(memory_gbps: f64, n: u32) -> f64 {
    let n = f64::from(n);
    memory_gbps * (n - 1.0) / (n * n)
}

/// Which rows of a section a rank pairs, and its probe's arrays once a
/// row needs them.
pub(crate) struct Pairing {
    /// The smallest paired row (bytes per rank); `None`: none is.
    from: Option<u64>,
    arrays: Option<Arrays>,
}

impl Pairing {
    /// Pair rows past the last-level cache when `wanted`: the largest
    /// cache among the ranks, agreed by all of them (one all-reduce, made
    /// by every rank or by none: `wanted` is the same everywhere) so every
    /// rank makes the same calls whatever its own reading said.
    pub(crate) fn agree<C: Communicator + ?Sized>(
        comm: &mut C,
        wanted: bool,
    ) -> Result<Pairing, CommError> {
        let from = match wanted {
            true => {
                let mut llc = [ferrocoll::kernels::StoreRule::host().llc_bytes];
                comm.all_reduce_in_place(&mut llc, ferrocoll::ReduceOp::Max)?;
                Some(llc[0])
            }
            false => None,
        };
        Ok(Pairing { from, arrays: None })
    }

    /// The probe's arrays for a row of `size` bytes on `n` ranks, if it is
    /// paired (allocated at the first such row).
    pub(crate) fn for_size(
        &mut self,
        size: usize,
        n: u32,
    ) -> Result<Option<&mut Arrays>, CommError> {
        if self.from.is_none_or(|from| (size as u64) < from) {
            return Ok(None);
        }
        if self.arrays.is_none() {
            self.arrays = Some(arrays(n)?);
        }
        Ok(self.arrays.as_mut())
    }
}

/// This rank's share of the probe's arrays: [`membw::ARRAY_BYTES`] over
/// the ranks, far past any last-level cache in all.
fn arrays(n: u32) -> Result<Arrays, CommError> {
    let bytes = membw::ARRAY_BYTES / n.max(1) as usize;
    Arrays::new(bytes).map_err(|e| CommError::Capacity {
        what: format!("cannot allocate the memory probe's two arrays of {bytes} bytes: {e}"),
    })
}

/// Passes of each kernel per probe, the fastest counting: one pass can
/// lose a few milliseconds to a neighbour, and a low probe would flatter
/// the round it judges.
const PASSES: usize = 2;

/// The memory rate the ranks stream now, GB/s: every rank runs each
/// kernel on its own arrays after a barrier; all ranks' bytes over the
/// time from the first rank's start to the last rank's end; the best
/// kernel and pass.
///
/// This is what the collective's own threads (one per rank) can move,
/// its bound; with fewer ranks than cores it is below the every-core
/// rate of the sweep-wide probe, which stays the stricter ceiling.
///
/// Not over one rank's own time: with more ranks than cores a rank can
/// wake from the barrier after the others have done most of the work, and
/// its time alone would read the memory fast. Every rank makes the same
/// calls: the kernels are the host's, and all ranks share it.
pub(crate) fn probe<C: Communicator + ?Sized>(
    comm: &mut C,
    arrays: &mut Arrays,
) -> Result<f64, CommError> {
    let ranks = f64::from(comm.world_size());
    let mut best: f64 = 0.0;
    for kernel in Kernel::available() {
        for _ in 0..PASSES {
            comm.barrier()?;
            let start = clock::now_ns();
            let bytes = arrays.pass(kernel);
            // The earliest start (as the largest complement) and the
            // latest end, in one call that is also the closing barrier.
            let mut span = [u64::MAX - start, clock::now_ns()];
            comm.all_reduce_in_place(&mut span, ferrocoll::ReduceOp::Max)?;
            let nanos = span[1].saturating_sub(u64::MAX - span[0]);
            if nanos > 0 {
                best = best.max(bytes * ranks / nanos as f64);
            }
        }
    }
    Ok(best)
}

/// One clock for every rank of the host, threads and processes alike
/// (`Instant` cannot cross a process), that no time step moves.
mod clock {
    /// `CLOCK_MONOTONIC`, which every process of a Linux host shares.
    #[cfg(target_os = "linux")]
    pub(super) fn now_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is
        // always available on Linux.
        let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        if r != 0 {
            return 0;
        }
        let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
        let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
        secs.saturating_mul(1_000_000_000).saturating_add(nanos)
    }

    /// Elsewhere the wall clock: a time step during a probe spoils that
    /// probe alone.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn now_ns() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// Calls timed between two probes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Round {
    /// Wall time of the round's calls, closing barrier included.
    pub secs: f64,
    /// The calls timed.
    pub calls: u32,
    /// The higher of the probes before and after, GB/s.
    pub memory_gbps: f64,
}

/// A paired row's verdict.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Paired {
    /// Rounds judged (those with calls and a probe reading).
    pub rounds: usize,
    /// The median of the rounds' memory rates, GB/s.
    pub memory_gbps: f64,
    /// busbw over the ceiling, each round against its own probes: the
    /// median, lowest and highest.
    pub ratio: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
}

impl Paired {
    /// The verdict on `rounds` of calls of `bytes` with bus factor
    /// `factor` on `n` ranks; `None` without rounds or without a ceiling
    /// (one rank).
    pub(crate) fn of(rounds: &[Round], bytes: usize, factor: f64, n: u32) -> Option<Paired> {
        if n < 2 {
            return None;
        }
        let judged: Vec<&Round> = rounds
            .iter()
            .filter(|r| r.calls > 0 && r.secs > 0.0 && r.memory_gbps > 0.0)
            .collect();
        let mut ratios: Vec<f64> = judged
            .iter()
            .map(|r| {
                let busbw = bytes as f64 * f64::from(r.calls) / r.secs / 1e9 * factor;
                busbw / ceiling(r.memory_gbps, n)
            })
            .collect();
        let mut rates: Vec<f64> = judged.iter().map(|r| r.memory_gbps).collect();
        ratios.sort_by(f64::total_cmp);
        rates.sort_by(f64::total_cmp);
        Some(Paired {
            rounds: ratios.len(),
            memory_gbps: median(&rates)?,
            ratio: median(&ratios)?,
            ratio_min: *ratios.first()?,
            ratio_max: *ratios.last()?,
        })
    }
}

/// The middle of sorted values (the mean of the two middle ones when
/// their number is even).
fn median(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// How many of `iters` calls round `i` of `rounds` times: as even as
/// they divide, every call in exactly one round.
pub(crate) fn calls_in_round(iters: u32, rounds: u32, i: u32) -> u32 {
    let at = |k: u32| (u64::from(iters) * u64::from(k) / u64::from(rounds.max(1))) as u32;
    at(i + 1) - at(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_is_judged_against_its_own_probes() {
        // 2 ranks, all-reduce factor 1: 1 GB in 0.1 s is 10 GB/s busbw.
        // Against 40 GB/s the ceiling is 10 (ratio 1.0); against 80, 20
        // (ratio 0.5). A sweep-wide probe of 80 would call both 0.5.
        let round = |memory_gbps| Round {
            secs: 0.1,
            calls: 1,
            memory_gbps,
        };
        let rounds = [round(40.0), round(80.0), round(40.0)];
        let p = Paired::of(&rounds, 1_000_000_000, 1.0, 2).unwrap();
        assert_eq!(p.rounds, 3);
        assert!((p.ratio - 1.0).abs() < 1e-9, "{p:?}");
        assert!((p.ratio_min - 0.5).abs() < 1e-9, "{p:?}");
        assert!((p.ratio_max - 1.0).abs() < 1e-9, "{p:?}");
        assert_eq!(p.memory_gbps, 40.0);
    }

    #[test]
    fn no_verdict_without_rounds_or_a_ceiling() {
        let one = [Round {
            secs: 0.1,
            calls: 1,
            memory_gbps: 40.0,
        }];
        assert_eq!(Paired::of(&[], 8, 1.0, 2), None);
        assert_eq!(Paired::of(&one, 8, 1.0, 1), None, "one rank has no ceiling");
        let empty = [Round { calls: 0, ..one[0] }];
        assert_eq!(Paired::of(&empty, 8, 1.0, 2), None);
    }

    #[test]
    fn rounds_share_the_calls_evenly() {
        for (iters, rounds) in [(20, 5), (7, 5), (3, 3), (1, 1), (1000, 7)] {
            let each: Vec<u32> = (0..rounds)
                .map(|i| calls_in_round(iters, rounds, i))
                .collect();
            assert_eq!(each.iter().sum::<u32>(), iters, "{each:?}");
            let (lo, hi) = (each.iter().min().unwrap(), each.iter().max().unwrap());
            assert!(hi - lo <= 1, "{each:?}");
        }
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), Some(3.0));
        assert_eq!(median(&[5.0]), Some(5.0));
        assert_eq!(median(&[]), None);
    }
}
