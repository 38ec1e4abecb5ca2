//! Timing the kernel variants where calls run: on arrays that fit a share
//! of the last-level cache, and on arrays twice its size, once each per
//! process (or once per job: `ferrocoll launch` passes the choices on).
//!
//! Timing in the cache alone chose wrong past it on three host classes
//! (issue 40: on one, a 512-bit kernel streamed at 0.37 of the ceiling
//! for a while where the 256-bit one reached 0.95, while the two timed
//! alike in the cache), so each regime is timed where its calls run, and
//! a width and its kind of store are timed together.

use std::time::Instant;

use super::rule::StoreRule;
use super::variant::{KernelChoice, Stores, Width};
use crate::aligned::AlignedBuffer;

/// Where a call's bytes sit against the last-level cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Regime {
    /// Within the cache's share ([`StoreRule::threshold`]): the
    /// destinations are read back from the cache.
    InCache,
    /// Past it: every pass waits on memory.
    PastCache,
}

impl Regime {
    /// The regime of a call whose outputs and inputs take `call_bytes`.
    pub fn of(rule: &StoreRule, call_bytes: u64) -> Regime {
        if call_bytes > rule.threshold() {
            Regime::PastCache
        } else {
            Regime::InCache
        }
    }

    /// Its name in `FERROCOLL_KERNELS` (`in:`, `past:`) and reports.
    pub fn key(self) -> &'static str {
        match self {
            Regime::InCache => "in",
            Regime::PastCache => "past",
        }
    }

    /// The stores a regime takes where nothing was measured: cached in the
    /// cache (the reader finds the lines there), non-temporal past it.
    pub(super) fn default_stores(self) -> Stores {
        match self {
            Regime::InCache => Stores::Cached,
            Regime::PastCache => Stores::NonTemporal,
        }
    }
}

/// Each in-cache array's size bounds: four of them take a quarter of the
/// cache's share at most, so what is timed is a pass out of the cache.
const IN_CACHE_BYTES: (u64, u64) = (64 << 10, 4 << 20);

/// Each past-cache array's bounds: four of them take twice the cache (a
/// sequential sweep of more than the cache misses on every line), at
/// least 64 MiB in all, and at most 2 GiB (a 1 GiB cache).
const PAST_CACHE_BYTES: (u64, u64) = (16 << 20, 512 << 20);

/// Bytes of each of the four arrays a regime is timed on.
pub(super) fn array_bytes(rule: &StoreRule, regime: Regime) -> u64 {
    match regime {
        Regime::InCache => (rule.threshold() / 16).clamp(IN_CACHE_BYTES.0, IN_CACHE_BYTES.1),
        Regime::PastCache => (rule.llc_bytes / 2).clamp(PAST_CACHE_BYTES.0, PAST_CACHE_BYTES.1),
    }
}

/// A variant within this fraction of the fastest ties with it in the
/// cache; a tie goes to the wider width (it computes faster, and the same
/// width compiles every other type's and op's loop), then to the
/// regime's usual stores.
pub(super) const TIED_IN_CACHE: f64 = 0.03;

/// The same past the cache, wider: there every width waits on memory
/// alike, so a few percent between widths is the machine's noise (one
/// run here put the baseline width 4 % ahead of AVX2), while the
/// differences that matter are large (0.37 against 0.95 of the ceiling on
/// a 260 MiB L3).
pub(super) const TIED_PAST_CACHE: f64 = 0.08;

/// Every variant's rate in GB/s (bytes read and written by a fused
/// two-source, two-destination f32 sum) on four arrays of `bytes`, best
/// of a few passes after one that brings the pages (and, in the cache,
/// the lines) in. Each pass reads what the one before wrote, so stores
/// that leave their lines out of the cache pay for it when they are read
/// back, as a call's output is.
pub(super) fn rates(
    candidates: &[KernelChoice],
    bytes: u64,
    passes: u32,
) -> Vec<(KernelChoice, f64)> {
    let len = (bytes / 4) as usize;
    // On cache lines: non-temporal stores need destinations at one offset
    // in their lines, which arrays from the system allocator only have
    // while it maps each one freshly (a variant refused every pass timed
    // nothing, at millions of GB/s).
    let array = |f: fn(usize) -> f32| AlignedBuffer::try_from_fn(len, f).ok();
    let (Some(a), Some(b), Some(c), Some(d)) = (
        array(|i| (i % 1024) as f32),
        array(|_| 0.5),
        array(|_| 0.25),
        array(|_| 0.125),
    ) else {
        tracing::warn!("host kernels: no memory for 4 x {bytes} bytes to time the variants on");
        return Vec::new();
    };
    let mut arrays = [a, b, c, d];
    let moved = (4 * len * 4) as f64;
    let mut flip = false;
    let mut pass = |choice: KernelChoice| {
        let [a, b, c, d] = &mut arrays;
        let (srcs, dsts) = if flip {
            ([c, d], [a, b])
        } else {
            ([a, b], [c, d])
        };
        flip = !flip;
        let t = Instant::now();
        // SAFETY: four distinct arrays of `len` elements; `choice` is one
        // of `KernelChoice::available()`, so this CPU runs it.
        let done = unsafe {
            super::lines::sum_f32(
                choice,
                &[srcs[0].as_ptr(), srcs[1].as_ptr()],
                &[dsts[0].as_mut_ptr(), dsts[1].as_mut_ptr()],
                len,
            )
        };
        super::stream_fence();
        done.then(|| t.elapsed().as_secs_f64())
    };
    let mut out = Vec::with_capacity(candidates.len());
    for &choice in candidates {
        pass(choice);
        // A pass the kernel refused did nothing: the variant is not timed.
        let best = (0..passes)
            .map(|_| pass(choice))
            .try_fold(f64::MAX, |best, t| t.map(|t| best.min(t)));
        if let Some(best) = best {
            out.push((choice, moved / best.max(1e-9) / 1e9));
        }
    }
    std::hint::black_box(&arrays);
    out
}

/// Time every variant this CPU runs for `regime`; `None` where there is
/// only one.
pub(super) fn measure(rule: &StoreRule, regime: Regime) -> Option<(u64, Vec<(KernelChoice, f64)>)> {
    let candidates = KernelChoice::available();
    if candidates.len() < 2 {
        return None;
    }
    let bytes = array_bytes(rule, regime);
    let passes = match regime {
        Regime::InCache => 5,
        Regime::PastCache => 3,
    };
    Some((bytes, rates(&candidates, bytes, passes)))
}

/// The fastest variant of `rates` for `regime`, ties going to the wider
/// width, then to the regime's usual stores.
pub fn pick(rates: &[(KernelChoice, f64)], regime: Regime) -> Option<KernelChoice> {
    let best = rates.iter().map(|r| r.1).fold(0.0, f64::max);
    let tie = match regime {
        Regime::InCache => TIED_IN_CACHE,
        Regime::PastCache => TIED_PAST_CACHE,
    };
    let width_rank = |w: Width| match w {
        Width::Baseline => 0,
        Width::Avx2 => 1,
        Width::Avx512 => 2,
    };
    rates
        .iter()
        .filter(|r| r.1 >= best * (1.0 - tie))
        .max_by_key(|r| {
            let usual = r.0.stores == regime.default_stores();
            (width_rank(r.0.width), usual)
        })
        .map(|r| r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(width: Width, stores: Stores) -> KernelChoice {
        KernelChoice {
            width,
            stores,
            handoff: stores,
        }
    }

    use Stores::{Cached, NonTemporal as Nt};
    use Width::{Avx2, Avx512, Baseline};

    /// The rates other host classes recorded (../shared/hosts/), fed to
    /// the rule: each regime picks its own fastest, which a single timing
    /// in the cache could not.
    #[test]
    fn recorded_rates_of_other_hosts_pick_the_fastest_in_each_regime() {
        // Intel Xeon, 260 MiB L3, window A: in the cache avx512 34.2,
        // avx2 24.1, baseline 17.0 GB/s (NT stores); past it, 512 MiB
        // busbw over the ceiling: avx512 nt 0.37, cached 0.32; avx2 nt
        // 0.95, cached 0.50.
        let in_a = [
            (v(Baseline, Nt), 17.0),
            (v(Avx2, Nt), 24.1),
            (v(Avx512, Nt), 34.2),
        ];
        assert_eq!(pick(&in_a, Regime::InCache), Some(v(Avx512, Nt)));
        let past_a = [
            (v(Avx2, Nt), 0.95),
            (v(Avx2, Cached), 0.50),
            (v(Avx512, Nt), 0.37),
            (v(Avx512, Cached), 0.32),
        ];
        assert_eq!(pick(&past_a, Regime::PastCache), Some(v(Avx2, Nt)));
        // Window B, an hour later: avx512 nt 1.05-1.10, avx2 nt 1.01-1.04
        // (medians 1.08 and 1.03): avx512 either way, the faster and the
        // wider.
        let past_b = [(v(Avx2, Nt), 1.03), (v(Avx512, Nt), 1.08)];
        assert_eq!(pick(&past_b, Regime::PastCache), Some(v(Avx512, Nt)));
        // AMD EPYC Zen 3, 32 MiB L3: in the cache avx2 cached 33.4 over
        // nt 27.7 GB/s; past it (16 MiB calls, busbw over the ceiling)
        // nt outputs 0.96 against cached 0.27.
        let in_zen = [(v(Avx2, Nt), 27.7), (v(Avx2, Cached), 33.4)];
        assert_eq!(pick(&in_zen, Regime::InCache), Some(v(Avx2, Cached)));
        let past_zen = [(v(Avx2, Nt), 0.96), (v(Avx2, Cached), 0.27)];
        assert_eq!(pick(&past_zen, Regime::PastCache), Some(v(Avx2, Nt)));
    }

    #[test]
    fn a_near_tie_goes_to_the_wider_width_then_to_the_regimes_stores() {
        let rates = [
            (v(Avx2, Nt), 10.0),
            (v(Avx512, Cached), 9.9),
            (v(Avx512, Nt), 9.8),
        ];
        assert_eq!(pick(&rates, Regime::PastCache), Some(v(Avx512, Nt)));
        assert_eq!(pick(&rates, Regime::InCache), Some(v(Avx512, Cached)));
        let clear = [(v(Avx2, Nt), 10.0), (v(Avx512, Nt), 9.0)];
        assert_eq!(pick(&clear, Regime::PastCache), Some(v(Avx2, Nt)));
        let noise = [(v(Baseline, Nt), 31.5), (v(Avx2, Nt), 30.2)];
        assert_eq!(pick(&noise, Regime::PastCache), Some(v(Avx2, Nt)));
        assert_eq!(pick(&noise, Regime::InCache), Some(v(Baseline, Nt)));
        assert_eq!(pick(&[], Regime::InCache), None);
    }

    /// Every variant is timed, non-temporal ones included, however the
    /// allocator placed earlier blocks: before the arrays started on
    /// cache lines, a variant whose destinations sat at different offsets
    /// was refused every pass and "ran" at millions of GB/s.
    #[test]
    fn every_variant_is_timed_at_a_believable_rate() {
        // A freed large block raises the allocator's mapping threshold,
        // then blocks of odd sizes: the arrays come from its heap at
        // whatever offsets, not from fresh mappings.
        drop(std::hint::black_box(vec![1u8; 8 << 20]));
        let _litter: Vec<Vec<u8>> = (1..40).map(|k| vec![1u8; k * 4_099]).collect();
        let all = KernelChoice::available();
        let timed = rates(&all, 1 << 20, 2);
        assert_eq!(timed.len(), all.len(), "{timed:?}");
        for (c, gbps) in timed {
            assert!(
                gbps.is_finite() && gbps > 0.0 && gbps < 5_000.0,
                "{c}: {gbps} GB/s"
            );
        }
    }

    /// The past-cache arrays take twice the cache in all; the in-cache
    /// ones a quarter of its share at most.
    #[test]
    fn each_regime_is_timed_where_its_calls_run() {
        for llc in [8u64 << 20, 32 << 20, 260 << 20] {
            let rule = StoreRule::new(llc);
            assert!(4 * array_bytes(&rule, Regime::PastCache) >= 2 * llc);
            assert!(4 * array_bytes(&rule, Regime::InCache) <= rule.threshold() / 4);
        }
    }
}
