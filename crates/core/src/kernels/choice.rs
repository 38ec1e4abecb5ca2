//! Which kernel variant a call runs: the vector width (by CPU feature
//! detection, and a timing once per process on arrays larger than the
//! last-level cache) and the kind of store (non-temporal or cached) for
//! each kind of destination — a call's output, and a hand-off another
//! rank reads next — chosen per call by [`StoreRule`]: by how many bytes
//! pass through the cache before the destination is read again.
//!
//! A [`KernelChoice`] can only be made for what this CPU supports
//! ([`KernelChoice::available`]), which is what makes calling the
//! `#[target_feature]` kernels behind it sound.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::rule::StoreRule;
use super::variant::{KernelChoice, Stores, Width, stores_name, width_name};

/// What the calibration measured and chose, and how stores are decided.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// The width every call uses, with the stores of a call of unknown
    /// size (outputs past the cache, hand-offs within it).
    pub choice: KernelChoice,
    /// Each width's rate in GB/s (bytes read and written by a fused
    /// two-source, two-destination f32 sum with non-temporal stores, on
    /// arrays larger than the last-level cache), best of a few runs.
    pub rates: Vec<(KernelChoice, f64)>,
    /// Stores forced by `FERROCOLL_KERNELS` (outputs, hand-offs), instead
    /// of the rule.
    pub forced_stores: Option<(Stores, Stores)>,
    /// How stores are chosen per call.
    pub rule: StoreRule,
    /// How long calibrating took.
    pub took: Duration,
}

impl std::fmt::Display for Calibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(width_name(self.choice.width))?;
        if self.rates.is_empty() {
            f.write_str(" (forced by FERROCOLL_KERNELS, or the only width)")?;
        } else {
            write!(f, " (calibrated in {:.0?}:", self.took)?;
            for (c, rate) in &self.rates {
                write!(f, " {} {rate:.1} GB/s;", width_name(c.width))?;
            }
            f.write_str(")")?;
        }
        match self.forced_stores {
            Some((output, handoff)) => write!(
                f,
                "; {} stores to outputs, {} to hand-offs (forced by FERROCOLL_KERNELS)",
                stores_name(output, false),
                stores_name(handoff, false)
            ),
            None => write!(f, "; {}", self.rule),
        }
    }
}

/// The variant of a call whose outputs and inputs take `call_bytes`
/// (every rank's, where ranks share this host's cache) and whose
/// hand-offs are `handoff_bytes` each: the calibrated width, and stores
/// by the rule — non-temporal to outputs past a share of the last-level
/// cache, cached below; hand-offs, read right after they are written,
/// by their own size — unless `FERROCOLL_KERNELS` forces them.
pub fn for_call(call_bytes: u64, handoff_bytes: u64) -> KernelChoice {
    let c = calibration();
    let (stores, handoff) = c
        .forced_stores
        .unwrap_or_else(|| (c.rule.stores(call_bytes), c.rule.stores(handoff_bytes)));
    usable(KernelChoice {
        width: c.choice.width,
        stores,
        handoff,
    })
}

/// `choice`, its stores cached where this CPU has no non-temporal ones.
fn usable(choice: KernelChoice) -> KernelChoice {
    let runnable = |s: Stores| {
        KernelChoice::available()
            .iter()
            .any(|c| c.width == choice.width && c.stores == s)
    };
    let or_cached = |s| if runnable(s) { s } else { Stores::Cached };
    KernelChoice {
        stores: or_cached(choice.stores),
        handoff: or_cached(choice.handoff),
        ..choice
    }
}

/// The variant of a call of unknown size: outputs past the cache (the
/// case that decides bandwidth), hand-offs within it.
pub fn chosen() -> KernelChoice {
    calibration().choice
}

/// The calibration, run on first use (a few tens of milliseconds), unless
/// `FERROCOLL_KERNELS` forces a width this CPU can run.
pub fn calibration() -> &'static Calibration {
    static CALIBRATION: OnceLock<Calibration> = OnceLock::new();
    CALIBRATION.get_or_init(|| {
        let rule = StoreRule::host();
        let forced = crate::settings::kernels_override().and_then(|v| match parse(&v) {
            Some(c) => Some(c),
            None => {
                tracing::warn!(
                    "FERROCOLL_KERNELS=`{v}` is not a variant this CPU can run; calibrating"
                );
                None
            }
        });
        let (width, rates, forced_stores, took) = match forced {
            Some(Forced { width, stores }) => (width, Vec::new(), stores, Duration::ZERO),
            None => {
                let started = Instant::now();
                let (width, rates) = calibrate(&rule);
                (width, rates, None, started.elapsed())
            }
        };
        let (stores, handoff) = forced_stores.unwrap_or((Stores::NonTemporal, Stores::Cached));
        let c = Calibration {
            choice: usable(KernelChoice {
                width,
                stores,
                handoff,
            }),
            rates,
            forced_stores,
            rule,
            took,
        };
        tracing::debug!("host kernels: {c}");
        c
    })
}

/// What `FERROCOLL_KERNELS` forces: a width, and maybe the stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Forced {
    width: Width,
    stores: Option<(Stores, Stores)>,
}

/// A variant named like `avx2` (the width; stores by the rule),
/// `avx2,cached` (both kinds of destination) or `avx2,nt,cached`
/// (outputs, then hand-offs), if this CPU can run it.
fn parse(spec: &str) -> Option<Forced> {
    let mut width = None;
    let mut stores = Vec::new();
    for part in spec.split([',', '+', ' ']).filter(|p| !p.is_empty()) {
        match part.trim().to_ascii_lowercase().as_str() {
            "baseline" => width = Some(Width::Baseline),
            "avx2" => width = Some(Width::Avx2),
            "avx512" => width = Some(Width::Avx512),
            "nt" | "non-temporal" => stores.push(Stores::NonTemporal),
            "cached" => stores.push(Stores::Cached),
            _ => return None,
        }
    }
    let stores = match stores[..] {
        [] => None,
        [one] => Some((one, one)),
        [output, handoff] => Some((output, handoff)),
        _ => return None,
    };
    let width = width?;
    let runnable = |s: Stores| {
        KernelChoice::available()
            .iter()
            .any(|c| c.width == width && c.stores == s)
    };
    let ok = match stores {
        None => runnable(Stores::Cached),
        Some((output, handoff)) => runnable(output) && runnable(handoff),
    };
    ok.then_some(Forced { width, stores })
}

/// The calibration's four arrays together are this many times the
/// last-level cache, so what is timed is what a call past the cache does
/// (a timing that fits the cache can favour what loses at DRAM sizes).
const CALIBRATION_LLC_MULTIPLE: u64 = 2;

/// Each calibration array's size bounds: at least 4 MiB (past any L2),
/// at most 32 MiB (a few tens of milliseconds in all).
const CALIBRATION_BYTES: (u64, u64) = (4 << 20, 32 << 20);

/// A width within this fraction of the fastest ties with it; of tied
/// widths the widest wins: past the cache every width waits on memory
/// alike, and in the cache the widest computes fastest.
const TIED_WITHIN: f64 = 0.03;

/// Time each width on arrays past the cache; the width to use and every
/// width's rate.
fn calibrate(rule: &StoreRule) -> (Width, Vec<(KernelChoice, f64)>) {
    let candidates: Vec<KernelChoice> = KernelChoice::available()
        .into_iter()
        .filter(|c| c.stores == Stores::NonTemporal || !cfg!(target_arch = "x86_64"))
        .collect();
    if candidates.len() == 1 {
        return (candidates[0].width, Vec::new());
    }
    let bytes = (rule.llc_bytes * CALIBRATION_LLC_MULTIPLE / 4)
        .clamp(CALIBRATION_BYTES.0, CALIBRATION_BYTES.1);
    let len = (bytes / 4) as usize;
    let a: Vec<f32> = (0..len).map(|i| i as f32).collect();
    let b = vec![0.5f32; len];
    let mut d0 = vec![0f32; len];
    let mut d1 = vec![0f32; len];
    let moved = (4 * len * 4) as f64;
    let mut rates = Vec::new();
    for &choice in &candidates {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            // SAFETY: four distinct arrays of `len` elements; `choice` is
            // available on this CPU.
            unsafe {
                super::lines::sum_f32(
                    choice,
                    &[a.as_ptr(), b.as_ptr()],
                    &[d0.as_mut_ptr(), d1.as_mut_ptr()],
                    len,
                );
            }
            super::stream_fence();
            best = best.min(t.elapsed().as_secs_f64());
        }
        rates.push((choice, moved / best / 1e9));
    }
    std::hint::black_box((&d0, &d1));
    (pick(&rates).width, rates)
}

/// The widest variant within [`TIED_WITHIN`] of the fastest.
fn pick(rates: &[(KernelChoice, f64)]) -> KernelChoice {
    let best = rates.iter().map(|r| r.1).fold(0.0, f64::max);
    rates
        .iter()
        .rev()
        .find(|r| r.1 >= best * (1.0 - TIED_WITHIN))
        .map_or(rates[0].0, |r| r.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Destination;

    #[test]
    fn only_runnable_variants_are_offered_and_one_is_chosen() {
        let all = KernelChoice::available();
        assert!(all.iter().any(|c| c.width() == Width::Baseline));
        let c = chosen();
        for stores in [c.stores(), c.handoff_stores()] {
            assert!(
                all.iter()
                    .any(|a| a.width() == c.width() && a.stores() == stores),
                "{c}"
            );
        }
        for w in KernelChoice::unavailable() {
            assert!(all.iter().all(|c| c.width() != w));
        }
        let shown = calibration().to_string();
        assert!(shown.contains("stores"), "{shown}");
    }

    #[test]
    fn forced_variants_parse_only_when_runnable() {
        assert_eq!(
            parse("baseline,cached"),
            Some(Forced {
                width: Width::Baseline,
                stores: Some((Stores::Cached, Stores::Cached)),
            })
        );
        // A width alone leaves the stores to the rule.
        assert_eq!(
            parse("baseline"),
            Some(Forced {
                width: Width::Baseline,
                stores: None,
            })
        );
        for c in KernelChoice::available() {
            let f = parse(&c.spec()).expect("round-trips");
            assert_eq!((f.width, f.stores), (c.width, Some((c.stores, c.handoff))));
            assert_eq!(parse(c.width_spec()).unwrap().width, c.width);
        }
        if let Some(f) = parse("avx2,nt,cached") {
            assert_eq!(f.stores, Some((Stores::NonTemporal, Stores::Cached)));
            let nt = KernelChoice {
                width: f.width,
                stores: Stores::NonTemporal,
                handoff: Stores::Cached,
            };
            assert_eq!(nt.to(Destination::Handoff).stores(), Stores::Cached);
            assert_eq!(nt.to(Destination::Output), nt);
            assert!(nt.to_string().contains("to hand-offs"), "{nt}");
        }
        assert!(parse("avx2,nt,cached,nt").is_none(), "at most two kinds");
        assert!(parse("avx3,nt").is_none());
        assert!(parse("").is_none());
        for w in KernelChoice::unavailable() {
            let name = if w == Width::Avx2 { "avx2" } else { "avx512" };
            assert!(parse(name).is_none(), "{name} offered on a CPU without it");
        }
    }

    #[test]
    fn the_widest_width_wins_a_near_tie() {
        let all = KernelChoice::available();
        let rates: Vec<_> = all
            .iter()
            .enumerate()
            .map(|(i, &c)| (c, 10.0 - 0.01 * i as f64))
            .collect();
        assert_eq!(pick(&rates), *all.last().unwrap());
        let mut rates = rates;
        rates[0].1 = 20.0;
        assert_eq!(pick(&rates), all[0]);
    }

    /// Every call's stores follow the rule unless forced: past the share
    /// of the cache outputs stream, within it they are cached; hand-offs
    /// by their own size.
    #[test]
    fn a_calls_stores_follow_its_bytes() {
        let c = calibration();
        if c.forced_stores.is_some() {
            return;
        }
        let past = c.rule.threshold() + 1;
        let nt_here = KernelChoice::available()
            .iter()
            .any(|k| k.stores == Stores::NonTemporal);
        let big = for_call(past, 512 << 10);
        let small = for_call(4 << 10, 512 << 10);
        assert_eq!(small.stores(), Stores::Cached);
        assert_eq!(small.handoff_stores(), Stores::Cached);
        assert_eq!(big.handoff_stores(), Stores::Cached);
        if nt_here {
            assert_eq!(big.stores(), Stores::NonTemporal);
        }
        assert_eq!(big.width(), c.choice.width());
    }
}
