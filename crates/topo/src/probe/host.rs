//! The CPU host probe: memory bandwidth of all cores and of one, and the
//! time one thread takes to notice another's hand-off.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

use super::membw;
use super::{LinkProbe, Matrix, ProbeError, ProbeOptions, ProbeReport};

/// What the `host` topology needs to know about this machine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HostMeasurement {
    /// Cores the process may run on.
    pub cores: u32,
    /// Memory traffic (bytes read + written) all cores sustain, GB/s: the
    /// best of copy, streaming copy and accumulate.
    pub memory_gbps: f64,
    /// Memory traffic one core sustains, GB/s.
    pub core_gbps: f64,
    /// One-way hand-off between two threads through a shared flag, µs.
    pub handoff_us: f64,
    /// The same with twice as many threads as cores, all handing off at
    /// once, so a waiting thread must be scheduled before it sees the
    /// flag: what ranks pay when they outnumber the cores, µs.
    pub oversubscribed_handoff_us: f64,
}

#[cfg(test)]
impl HostMeasurement {
    /// A fixed host for tests (4 cores, 40 GB/s of memory): what a
    /// measurement would give, without measuring.
    pub(crate) fn example() -> HostMeasurement {
        HostMeasurement {
            cores: 4,
            memory_gbps: 40.0,
            core_gbps: 12.0,
            handoff_us: 0.2,
            oversubscribed_handoff_us: 5.0,
        }
    }
}

/// Arrays for the quick probe behind [`measured`]: 64 MiB is past the
/// last-level cache of the machines we target and keeps the probe near a
/// tenth of a second.
const QUICK_ARRAY_BYTES: usize = 64 << 20;
const QUICK_REPEATS: usize = 3;
const HANDOFF_ROUNDS: u32 = 2000;

/// This machine, measured once per process (quickly) and then reused, so
/// every rank of every group in the process sees the same numbers.
pub fn measured() -> &'static HostMeasurement {
    static CELL: OnceLock<HostMeasurement> = OnceLock::new();
    CELL.get_or_init(|| measure(QUICK_ARRAY_BYTES, QUICK_REPEATS))
}

/// Measure this machine with arrays of `array_bytes`, best of `repeats`.
pub fn measure(array_bytes: usize, repeats: usize) -> HostMeasurement {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let all = membw::measure(array_bytes, cores, repeats);
    let one = membw::measure(array_bytes, 1, repeats);
    HostMeasurement {
        cores: cores as u32,
        memory_gbps: all.best.max(one.best),
        core_gbps: one.best,
        handoff_us: handoff_us(HANDOFF_ROUNDS, 1),
        oversubscribed_handoff_us: handoff_us(HANDOFF_ROUNDS / 4, cores),
    }
}

/// Half the round trip of a ping-pong over one atomic counter, with
/// `pairs` pairs of threads playing at once, best of three runs, µs. The
/// threads spin briefly and then yield while they wait, as the CPU
/// executor's do, so with more threads than cores this includes the
/// reschedule a waiting rank needs.
pub fn handoff_us(rounds: u32, pairs: usize) -> f64 {
    let rounds = u64::from(rounds.max(1));
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let flags: Vec<AtomicU64> = (0..pairs.max(1)).map(|_| AtomicU64::new(0)).collect();
        let started = Instant::now();
        std::thread::scope(|s| {
            for flag in &flags {
                s.spawn(move || {
                    for i in 0..rounds {
                        wait_for(flag, 2 * i + 1);
                        flag.store(2 * i + 2, Ordering::Release);
                    }
                });
                s.spawn(move || {
                    for i in 0..rounds {
                        flag.store(2 * i + 1, Ordering::Release);
                        wait_for(flag, 2 * i + 2);
                    }
                });
            }
        });
        let us = started.elapsed().as_secs_f64() * 1e6 / (2.0 * rounds as f64);
        best = best.min(us);
    }
    best
}

fn wait_for(flag: &AtomicU64, value: u64) {
    let mut spins = 0u32;
    while flag.load(Ordering::Acquire) < value {
        spins += 1;
        if spins < 1000 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// [`LinkProbe`] for `threads` threads of this process: every pair copies
/// through host memory, so the matrices show what one core and two cores
/// sustain and the hand-off latency.
#[derive(Debug, Clone, Copy)]
pub struct HostProbe {
    /// Threads (ranks) to report on.
    pub threads: usize,
}

impl LinkProbe for HostProbe {
    fn device_count(&self) -> usize {
        self.threads
    }

    fn measure(&self, options: &ProbeOptions) -> Result<ProbeReport, ProbeError> {
        if self.threads == 0 {
            return Err(ProbeError::Failed("no threads to probe".into()));
        }
        let repeats = options.repeats.max(1) as usize;
        // Between threads of one process every pair is the same path, so
        // one measurement per quantity stands for every pair.
        let one = membw::measure(options.bytes, 1, repeats).best / 2.0;
        let two = membw::measure(options.bytes, 2, repeats).best / 2.0;
        let lat = handoff_us(HANDOFF_ROUNDS, 1);
        let n = self.threads;
        let (mut uni, mut bi, mut latency) = (Matrix::new(n), Matrix::new(n), Matrix::new(n));
        for i in 0..n {
            for j in 0..n {
                uni.set(i, j, one);
                bi.set(i, j, if i == j { one } else { two });
                latency.set(i, j, if i == j { 0.0 } else { lat });
            }
        }
        Ok(ProbeReport {
            what: format!(
                "{n} threads of this process, copying {} bytes through host memory (bytes copied per second)",
                options.bytes
            ),
            p2p: true,
            unidirectional_gbps: uni,
            bidirectional_gbps: bi,
            latency_us: latency,
        })
    }
}
