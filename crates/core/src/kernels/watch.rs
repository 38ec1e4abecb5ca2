//! Kernels kept honest at run time: a communicator's watch over its large
//! calls, which re-measures the kernel variants when calls run well below
//! the rate their variant was timed at, and switches every rank alike.
//!
//! The calibration ([`super::calibration`]) times each regime once, alone,
//! when the process starts. A host's state can change after that (another
//! tenant's traffic, a frequency change) and which variant streams best
//! past the cache can change with it: one host measured 0.37 of the memory
//! ceiling with the calibrated variant and 0.95 with another in the same
//! window. The watch catches that:
//!
//! - every call of at least [`WATCH_MIN_BYTES`] per rank (the same on
//!   every rank: it is the plan's) is *watched*, and counts towards
//!   checkpoints; where it is past this host's cache, the executor times
//!   its kernels ([`Meter`]), and the bytes they read and wrote over the
//!   time they took (not the call's, which waits on peers too) is compared
//!   with the rate the past-cache variant was timed at (calls in the cache
//!   run the variant timed where they run, and are not judged);
//! - after a number of watched calls that every rank counts alike (4,
//!   then more while nothing is wrong), every rank stops at the same
//!   *checkpoint*: one all-reduce (max) says whether any rank's last calls
//!   ran under [`SLOW_BELOW`] of that rate;
//! - if one did, every rank re-measures every variant at the calls' size,
//!   at once (so under the same contention as its calls), bounded to a
//!   few passes over arrays no larger than the calibration's; a second
//!   all-reduce (min) gives each variant its slowest rank's rate, and the
//!   fastest of those is the group's choice: the same on every rank, and
//!   one that every rank's CPU runs (a rank without a variant reports 0);
//! - the switch is logged at info with both rates; the re-measured rate
//!   becomes the expectation, so contention alone does not trigger again.
//!
//! A variant a user forced (`FERROCOLL_KERNELS` without a rate) is kept:
//! that rank votes nothing and adopts nothing, but joins every
//! checkpoint, as every rank must.

use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::calibrate::{self, Regime};
use super::choice::calibration;
use super::variant::{KernelChoice, Stores, Width, rate_of};
use crate::types::ReduceOp;

/// Calls of at least this many bytes per rank (input and output) are
/// watched. Below it, a call's time is mostly synchronization, and a
/// checkpoint (three tiny all-reduces at most) would cost a visible share.
pub const WATCH_MIN_BYTES: u64 = 8 << 20;

/// A regime's calls run below this share of their variant's rate, over
/// the last few watched calls, trigger a re-measurement.
pub const SLOW_BELOW: f64 = 0.6;

/// Watched calls before the first checkpoint.
const FIRST_CHECK: u64 = 4;

/// The most watched calls between checkpoints: spacing doubles after
/// each checkpoint that changed nothing, up to this.
const MAX_SPACING: u64 = 256;

/// Watched calls whose median rate decides a rank's vote.
const WINDOW: usize = 4;

/// Re-measurement passes per variant (after one that faults the pages in).
const PASSES: u32 = 2;

/// Every variant any CPU may run, in the order the checkpoint's
/// all-reduce carries their rates.
const UNIVERSE: [(Width, Stores); 6] = [
    (Width::Baseline, Stores::Cached),
    (Width::Baseline, Stores::NonTemporal),
    (Width::Avx2, Stores::Cached),
    (Width::Avx2, Stores::NonTemporal),
    (Width::Avx512, Stores::Cached),
    (Width::Avx512, Stores::NonTemporal),
];

/// How a watch learns kernel rates: by timing them ([`TimedProbe`]), or by
/// whatever a test or an experiment injects.
pub trait KernelProbe: Send + Sync + fmt::Debug {
    /// Each candidate's rate in GB/s, timed on four arrays of `bytes`.
    fn rates(&self, candidates: &[KernelChoice], bytes: u64) -> Vec<(KernelChoice, f64)>;

    /// The rate a watched call ran `choice` at, from what was measured
    /// (an injected probe can make a variant look slow).
    fn achieved(&self, _choice: KernelChoice, measured: f64) -> f64 {
        measured
    }
}

/// Times the variants as the calibration does.
#[derive(Debug)]
pub struct TimedProbe;

impl KernelProbe for TimedProbe {
    fn rates(&self, candidates: &[KernelChoice], bytes: u64) -> Vec<(KernelChoice, f64)> {
        calibrate::rates(candidates, bytes, PASSES)
    }
}

/// A probe for tests and demonstrations: calls that run `slow` achieve a
/// sliver of what they measured, others far more than any expectation,
/// and re-measurement rates `fast` at 100 GB/s, `slow` at 1, the rest at
/// 10 — so the first checkpoint replaces `slow` with `fast`.
#[derive(Debug, Clone, Copy)]
pub struct SlowedProbe {
    /// The variant made slow (width, output stores).
    pub slow: (Width, Stores),
    /// The variant that wins the re-measurement.
    pub fast: (Width, Stores),
}

impl KernelProbe for SlowedProbe {
    fn rates(&self, candidates: &[KernelChoice], _bytes: u64) -> Vec<(KernelChoice, f64)> {
        let rate = |c: &KernelChoice| match (c.width, c.stores) {
            k if k == self.fast => 100.0,
            k if k == self.slow => 1.0,
            _ => 10.0,
        };
        candidates.iter().map(|c| (*c, rate(c))).collect()
    }

    fn achieved(&self, choice: KernelChoice, measured: f64) -> f64 {
        if (choice.width, choice.stores) == self.slow {
            1e-6
        } else {
            measured.max(1e6)
        }
    }
}

/// A probe shared by a group's ranks; equal when it is the same one.
#[derive(Clone)]
pub struct SharedProbe(pub Arc<dyn KernelProbe>);

impl PartialEq for SharedProbe {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}

impl Eq for SharedProbe {}

impl fmt::Debug for SharedProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An all-reduce of a few `f64` over the group, in place, with an op;
/// `E` is the communicator's error.
pub type GroupReduce<'a, E> = dyn FnMut(&mut [f64], ReduceOp) -> Result<(), E> + 'a;

/// Whether and how a communicator watches its kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSettings {
    /// Watch at all (on by default). It must be the same on every rank:
    /// checkpoints are calls every rank makes.
    pub enabled: bool,
    /// Where rates come from (`None`: timed).
    pub probe: Option<SharedProbe>,
}

impl Default for WatchSettings {
    fn default() -> Self {
        WatchSettings {
            enabled: true,
            probe: None,
        }
    }
}

/// The past-cache variant as the watch keeps it.
#[derive(Debug, Clone, Copy)]
struct Kept {
    choice: KernelChoice,
    /// GB/s the variant was last timed at; `None` where it was forced.
    expected: Option<f64>,
}

/// Times one call's kernels, where its executor runs them; off for calls
/// the watch does not watch, when it costs nothing but a branch.
#[derive(Debug, Default)]
pub struct Meter {
    on: bool,
    bytes: Cell<u64>,
    time: Cell<Duration>,
}

impl Meter {
    /// Run `kernel`, which reads and writes `bytes`, timing it when on.
    #[inline]
    pub fn time<R>(&self, bytes: u64, kernel: impl FnOnce() -> R) -> R {
        if !self.on {
            return kernel();
        }
        let started = Instant::now();
        let r = kernel();
        self.bytes.set(self.bytes.get() + bytes);
        self.time.set(self.time.get() + started.elapsed());
        r
    }

    /// The bytes the timed kernels moved and the time they took.
    pub fn reading(&self) -> (u64, Duration) {
        (self.bytes.get(), self.time.get())
    }
}

/// A switch the watch made.
#[derive(Debug, Clone, PartialEq)]
pub struct Switch {
    /// The past-cache variant before.
    pub from: KernelChoice,
    /// The variant every rank runs now.
    pub to: KernelChoice,
    /// Each variant's rate as re-measured, the slowest rank's.
    pub rates: Vec<(KernelChoice, f64)>,
}

/// A communicator's watch over its kernels (see the module's docs).
#[derive(Debug)]
pub struct KernelWatch {
    settings: WatchSettings,
    /// The past-cache variant (calls in the cache run the calibration's:
    /// it was timed where they run, and they are not judged).
    past: Kept,
    /// Achieved over expected, of the last judged calls.
    ratios: VecDeque<f64>,
    /// The last judged call: its bytes per rank and the rate it ran at.
    last: Option<(u64, f64)>,
    watched: u64,
    next_check: u64,
    spacing: u64,
    switches: Vec<Switch>,
}

impl KernelWatch {
    /// A watch starting from this process's calibration.
    pub fn new(settings: WatchSettings) -> KernelWatch {
        let past = &calibration().past_cache;
        KernelWatch {
            settings,
            past: Kept {
                choice: past.choice,
                expected: past.rate,
            },
            ratios: VecDeque::with_capacity(WINDOW),
            last: None,
            watched: 0,
            next_check: FIRST_CHECK,
            spacing: FIRST_CHECK,
            switches: Vec::new(),
        }
    }

    /// A watch that watches nothing.
    pub fn off() -> KernelWatch {
        KernelWatch::new(WatchSettings {
            enabled: false,
            probe: None,
        })
    }

    /// The variant of a call whose buffers take `call_bytes` (every
    /// rank's, where ranks share this host's cache) and whose hand-offs
    /// are `handoff_bytes` each: as [`super::for_call`], with the watch's
    /// switches applied.
    pub fn for_call(&self, call_bytes: u64, handoff_bytes: u64) -> KernelChoice {
        let base = super::for_call(call_bytes, handoff_bytes);
        if Regime::of(&calibration().rule, call_bytes) == Regime::InCache {
            return base;
        }
        super::choice::usable(KernelChoice {
            width: self.past.choice.width,
            stores: self.past.choice.stores,
            handoff: base.handoff,
        })
    }

    /// Whether calls of `rank_bytes` per rank (input and output, the same
    /// on every rank) are watched.
    fn watches(&self, rank_bytes: u64) -> bool {
        self.settings.enabled && rank_bytes >= WATCH_MIN_BYTES
    }

    /// The meter for a call of `rank_bytes` per rank, `call_bytes` in all:
    /// on where it is watched and past the cache here. Calls in the cache
    /// count towards checkpoints but are not judged: their variant was
    /// timed where they run, and one re-measured in the timed loop of a
    /// call of a few milliseconds would cost more than it could win.
    pub fn meter(&self, rank_bytes: u64, call_bytes: u64) -> Meter {
        let past = Regime::of(&calibration().rule, call_bytes) == Regime::PastCache;
        Meter {
            on: self.watches(rank_bytes) && past,
            ..Meter::default()
        }
    }

    /// Record a call of `rank_bytes` per rank, `call_bytes` in all, that
    /// ran `kernels`, as its `meter` timed them. Calls under
    /// [`WATCH_MIN_BYTES`] are not watched.
    pub fn observe(
        &mut self,
        rank_bytes: u64,
        call_bytes: u64,
        kernels: KernelChoice,
        meter: &Meter,
    ) {
        if !self.watches(rank_bytes) {
            return;
        }
        self.watched += 1;
        let (traffic, elapsed) = meter.reading();
        if elapsed.is_zero() {
            // No kernel ran here (every value came by reference).
            return;
        }
        if Regime::of(&calibration().rule, call_bytes) == Regime::InCache {
            return;
        }
        let measured = traffic as f64 / elapsed.as_secs_f64() / 1e9;
        let rate = self.probe().achieved(kernels, measured);
        self.last = Some((rank_bytes, rate));
        if let Some(expected) = self.past.expected {
            if self.ratios.len() == WINDOW {
                self.ratios.pop_front();
            }
            self.ratios.push_back(rate / expected);
        }
    }

    /// Whether the next call must be this checkpoint (the same answer on
    /// every rank: it counts calls of the plan's size).
    pub fn due(&self) -> bool {
        self.settings.enabled && self.watched >= self.next_check
    }

    /// Switches made so far, oldest first.
    pub fn switches(&self) -> &[Switch] {
        &self.switches
    }

    fn probe(&self) -> Arc<dyn KernelProbe> {
        match &self.settings.probe {
            Some(p) => Arc::clone(&p.0),
            None => Arc::new(TimedProbe),
        }
    }

    /// This rank's vote: its last calls' median ran under [`SLOW_BELOW`].
    fn slow(&self) -> bool {
        let mut r: Vec<f64> = self.ratios.iter().copied().collect();
        if r.len() < WINDOW.min(3) {
            return false;
        }
        r.sort_by(f64::total_cmp);
        r[r.len() / 2] < SLOW_BELOW
    }

    /// The checkpoint, on every rank at the same call: `reduce` runs an
    /// all-reduce of a few `f64` over the group with the op given. Returns
    /// the switch, if one was made.
    pub fn checkpoint<E>(&mut self, reduce: &mut GroupReduce<'_, E>) -> Result<Option<Switch>, E> {
        let mut vote = [f64::from(u8::from(self.slow()))];
        reduce(&mut vote, ReduceOp::Max)?;
        if vote[0] == 0.0 {
            self.spaced(false);
            return Ok(None);
        }
        // Every rank has watched calls by now; one that somehow has none
        // still joins the second all-reduce, adopting nothing.
        let (rank_bytes, achieved) = self.last.unwrap_or((0, 0.0));
        let adopts = self.last.is_some() && self.past.expected.is_some();
        let bytes = probe_bytes(rank_bytes);
        let mine = if adopts {
            self.probe().rates(&KernelChoice::available(), bytes)
        } else {
            Vec::new()
        };
        let mut rates = universe_rates(&mine, adopts);
        reduce(&mut rates, ReduceOp::Min)?;
        let slowest: Vec<(KernelChoice, f64)> = UNIVERSE
            .iter()
            .zip(&rates)
            .filter(|(_, r)| r.is_finite() && **r > 0.0)
            .map(|(&(width, stores), &r)| (variant(width, stores), r))
            .collect();
        // The same rates on every rank, so the same pick.
        let kept = self.past;
        let picked = calibrate::pick(&slowest, Regime::PastCache)
            .filter(|to| !ties_with(&slowest, kept.choice, *to));
        let switching = picked.filter(|to| {
            adopts && (to.width, to.stores) != (kept.choice.width, kept.choice.stores)
        });
        // Whether a rank switches depends on the variant it ran, which
        // each host's calibration chose for itself: the next checkpoint is
        // planned on whether any rank did, or ranks on different hosts
        // would meet it at different calls. Asked before anything changes
        // here, so a failed call leaves the watch as it was.
        let mut any = [f64::from(u8::from(switching.is_some()))];
        reduce(&mut any, ReduceOp::Max)?;
        let switched = match switching {
            Some(to) => {
                let own = |c: KernelChoice| rate_of(&mine, c.width, c.stores);
                tracing::info!(
                    "host kernels: calls of {} MiB per rank ran at {achieved:.1} GB/s, under {SLOW_BELOW} of the {:.1} GB/s {} was timed at; re-measured on every rank at 4 x {} MiB ({}, the slowest rank's): switching to {} ({:.1} GB/s here)",
                    rank_bytes >> 20,
                    kept.expected.unwrap_or(0.0),
                    kept.choice,
                    bytes >> 20,
                    describe(&slowest),
                    to,
                    own(to).unwrap_or(0.0),
                );
                self.past = Kept {
                    choice: to,
                    expected: own(to),
                };
                let switch = Switch {
                    from: kept.choice,
                    to,
                    rates: slowest,
                };
                self.switches.push(switch.clone());
                Some(switch)
            }
            None => {
                if adopts {
                    // The rate it runs at now, under this group's contention.
                    let now = rate_of(&mine, kept.choice.width, kept.choice.stores);
                    self.past.expected = now.or(kept.expected);
                    tracing::debug!(
                        "host kernels: calls of {} MiB per rank ran at {achieved:.1} GB/s; re-measured ({}): keeping {}",
                        rank_bytes >> 20,
                        describe(&slowest),
                        kept.choice
                    );
                }
                None
            }
        };
        self.ratios.clear();
        self.spaced(any[0] > 0.0);
        Ok(switched)
    }

    /// Plan the next checkpoint: soon after a switch, later after a check
    /// that changed nothing.
    fn spaced(&mut self, switched: bool) {
        self.spacing = if switched {
            FIRST_CHECK
        } else {
            (self.spacing * 2).min(MAX_SPACING)
        };
        self.next_check = self.watched + self.spacing;
    }
}

/// The re-measurement's array size for calls of `rank_bytes` per rank:
/// a quarter of the call's, at most the calibration's past-cache arrays
/// (twice the cache in all), so it is bounded as the calibration is.
fn probe_bytes(rank_bytes: u64) -> u64 {
    let cap = calibration().past_cache.array_bytes.max(16 << 20);
    (rank_bytes / 4).clamp(1 << 20, cap)
}

/// Whether `current` runs within the past-cache tie of `best`: then it
/// stays (a switch needs a clear winner, or noise would flip variants).
fn ties_with(rates: &[(KernelChoice, f64)], current: KernelChoice, best: KernelChoice) -> bool {
    let rate = |c: KernelChoice| rate_of(rates, c.width, c.stores);
    match (rate(current), rate(best)) {
        (Some(now), Some(top)) => now >= top * (1.0 - calibrate::TIED_PAST_CACHE),
        _ => false,
    }
}

fn variant(width: Width, stores: Stores) -> KernelChoice {
    KernelChoice {
        width,
        stores,
        handoff: Stores::Cached,
    }
}

/// `mine` laid out as [`UNIVERSE`]: 0 for a variant this CPU lacks; a rank
/// that adopts nothing leaves every entry to the others (infinite under a
/// min).
fn universe_rates(mine: &[(KernelChoice, f64)], adopts: bool) -> Vec<f64> {
    UNIVERSE
        .iter()
        .map(|&(w, s)| match adopts {
            false => f64::INFINITY,
            true => rate_of(mine, w, s).unwrap_or(0.0),
        })
        .collect()
}

fn describe(rates: &[(KernelChoice, f64)]) -> String {
    let parts: Vec<String> = rates
        .iter()
        .map(|(c, r)| {
            format!(
                "{}/{} {r:.1}",
                super::variant::width_name(c.width),
                super::variant::stores_name(c.stores, true)
            )
        })
        .collect();
    format!("{} GB/s", parts.join(", "))
}

#[cfg(test)]
mod tests;
