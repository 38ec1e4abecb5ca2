//! Which kernel variant a call runs: the vector width and the kind of
//! store to the call's outputs, chosen for the call's regime — its bytes
//! within a share of the last-level cache, or past it — by timing every
//! variant this CPU runs in each regime ([`calibrate`](super::calibrate));
//! and the stores to hand-offs another rank reads next, by [`StoreRule`]
//! on their own size.
//!
//! A [`KernelChoice`] can only be made for what this CPU supports
//! ([`KernelChoice::available`]), which is what makes calling the
//! `#[target_feature]` kernels behind it sound.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::calibrate::{self, Regime};
use super::rule::StoreRule;
use super::variant::{KernelChoice, Stores, Width, stores_name, width_name};

/// One regime's variant and what it was chosen on.
#[derive(Debug, Clone)]
pub struct RegimeChoice {
    /// The width and the stores to outputs (hand-offs go by the rule).
    pub choice: KernelChoice,
    /// Every variant's rate in GB/s, as timed in this regime (empty where
    /// `FERROCOLL_KERNELS` forced it or the CPU has one variant).
    pub rates: Vec<(KernelChoice, f64)>,
    /// Bytes of each of the four arrays it was timed on.
    pub array_bytes: u64,
    /// The rate in GB/s the chosen variant was timed at: here, or by the
    /// launcher that handed its choice on (`FERROCOLL_KERNELS`'s
    /// `@GB/s`). `None` where a user forced the variant: the run-time
    /// watch ([`super::KernelWatch`]) then keeps it whatever it measures.
    pub rate: Option<f64>,
    /// Forced by `FERROCOLL_KERNELS`.
    pub forced: bool,
}

/// The two regimes' variants, and how hand-offs store.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// Calls whose bytes fit the cache's share.
    pub in_cache: RegimeChoice,
    /// Calls past it (and calls of unknown size).
    pub past_cache: RegimeChoice,
    /// Stores to hand-offs forced by `FERROCOLL_KERNELS` (else the rule's).
    pub forced_handoff: Option<Stores>,
    /// Where the regimes meet, and the stores of hand-offs.
    pub rule: StoreRule,
    /// How long timing took.
    pub took: Duration,
}

impl Calibration {
    /// The choice of `regime`.
    pub fn regime(&self, regime: Regime) -> &RegimeChoice {
        match regime {
            Regime::InCache => &self.in_cache,
            Regime::PastCache => &self.past_cache,
        }
    }

    /// The `FERROCOLL_KERNELS` value that makes another process choose
    /// the same (`in:avx512,cached@34.2;past:avx2,nt@21.0`; hand-offs by
    /// the rule unless forced here). Each regime carries the rate it was
    /// timed at, so the other process's watch knows what to expect.
    pub fn spec(&self) -> String {
        let one = |r: &RegimeChoice| {
            let rate = r.rate.map(|g| format!("@{g:.1}")).unwrap_or_default();
            format!(
                "{},{}{rate}",
                width_name(r.choice.width),
                stores_name(r.choice.stores, true)
            )
        };
        let mut spec = format!("in:{};past:{}", one(&self.in_cache), one(&self.past_cache));
        if let Some(h) = self.forced_handoff {
            spec.push_str(&format!(";handoff:{}", stores_name(h, true)));
        }
        spec
    }
}

impl std::fmt::Display for Calibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        let threshold = mib(self.rule.threshold());
        write!(
            f,
            "calls up to {threshold:.0} MiB ({:.0}% of the {:.0} MiB last-level cache{}): {}; past it: {}; hand-offs: ",
            super::rule::LLC_SHARE * 100.0,
            mib(self.rule.llc_bytes),
            if self.rule.measured { "" } else { ", assumed" },
            regime_name(&self.in_cache.choice),
            regime_name(&self.past_cache.choice),
        )?;
        match self.forced_handoff {
            Some(h) => write!(f, "{} stores (FERROCOLL_KERNELS)", stores_name(h, false))?,
            None => write!(f, "cached up to {threshold:.0} MiB, non-temporal past it")?,
        }
        for (name, r) in [
            ("in the cache", &self.in_cache),
            ("past it", &self.past_cache),
        ] {
            if r.forced {
                write!(f, "; {name}: FERROCOLL_KERNELS")?;
                if let Some(rate) = r.rate {
                    write!(f, " (timed at {rate:.1} GB/s by the launcher)")?;
                }
            } else if !r.rates.is_empty() {
                write!(f, "; {name}, 4 x {:.0} MiB:", mib(r.array_bytes))?;
                for (c, rate) in &r.rates {
                    write!(
                        f,
                        " {}/{} {rate:.1}",
                        width_name(c.width),
                        stores_name(c.stores, true)
                    )?;
                }
                f.write_str(" GB/s")?;
            }
        }
        if self.took > Duration::ZERO {
            write!(f, " (timed in {:.0?})", self.took)?;
        }
        Ok(())
    }
}

/// A regime's variant as reports name it: `avx2 + non-temporal stores`.
fn regime_name(c: &KernelChoice) -> String {
    format!(
        "{} + {} stores",
        width_name(c.width),
        stores_name(c.stores, false)
    )
}

/// The variant of a call whose outputs and inputs take `call_bytes`
/// (every rank's, where ranks share this host's cache) and whose
/// hand-offs are `handoff_bytes` each: its regime's width and output
/// stores, and hand-off stores by the rule on their size, unless
/// `FERROCOLL_KERNELS` forces them.
pub fn for_call(call_bytes: u64, handoff_bytes: u64) -> KernelChoice {
    let c = calibration();
    let chosen = c.regime(Regime::of(&c.rule, call_bytes)).choice;
    let handoff = c
        .forced_handoff
        .unwrap_or_else(|| c.rule.stores(handoff_bytes));
    usable(KernelChoice { handoff, ..chosen })
}

/// `choice`, its stores cached where this CPU has no non-temporal ones.
pub(super) fn usable(choice: KernelChoice) -> KernelChoice {
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

/// The variant of a call of unknown size: past the cache (the case that
/// decides bandwidth), hand-offs within it.
pub fn chosen() -> KernelChoice {
    let c = calibration();
    usable(KernelChoice {
        handoff: c.forced_handoff.unwrap_or(Stores::Cached),
        ..c.past_cache.choice
    })
}

/// The calibration, run on first use (tens of milliseconds on a cache of
/// tens of MiB, a few hundred on one of hundreds), unless
/// `FERROCOLL_KERNELS` forces both regimes.
pub fn calibration() -> &'static Calibration {
    static CALIBRATION: OnceLock<Calibration> = OnceLock::new();
    CALIBRATION.get_or_init(|| {
        let rule = StoreRule::host();
        let forced = crate::settings::kernels_override().and_then(|v| match parse(&v) {
            Some(f) => Some(f),
            None => {
                tracing::warn!(
                    "FERROCOLL_KERNELS=`{v}` is not a variant this CPU can run; calibrating"
                );
                None
            }
        });
        let forced = forced.unwrap_or_default();
        let started = Instant::now();
        let regime = |r: Regime, forced: Option<(Width, Option<Stores>)>, rate| match forced {
            Some((width, stores)) => RegimeChoice {
                choice: usable(KernelChoice {
                    width,
                    stores: stores.unwrap_or(r.default_stores()),
                    handoff: Stores::Cached,
                }),
                rates: Vec::new(),
                array_bytes: 0,
                rate,
                forced: true,
            },
            None => timed(&rule, r),
        };
        let in_cache = regime(Regime::InCache, forced.in_cache, forced.rates.0);
        let past_cache = regime(Regime::PastCache, forced.past_cache, forced.rates.1);
        let c = Calibration {
            in_cache,
            past_cache,
            forced_handoff: forced.handoff,
            rule,
            took: started.elapsed(),
        };
        tracing::debug!("host kernels: {c}");
        c
    })
}

/// `regime` chosen by timing every variant there; the first variant,
/// untimed, where there is one or none could be timed (no memory).
fn timed(rule: &StoreRule, regime: Regime) -> RegimeChoice {
    let measured = calibrate::measure(rule, regime)
        .and_then(|(bytes, rates)| Some((calibrate::pick(&rates, regime)?, bytes, rates)));
    match measured {
        Some((choice, array_bytes, rates)) => {
            let rate = super::variant::rate_of(&rates, choice.width, choice.stores);
            RegimeChoice {
                choice,
                rates,
                array_bytes,
                rate,
                forced: false,
            }
        }
        None => RegimeChoice {
            choice: usable(KernelChoice {
                handoff: Stores::Cached,
                ..KernelChoice::available()[0]
            }),
            rates: Vec::new(),
            array_bytes: 0,
            rate: None,
            forced: false,
        },
    }
}

/// What `FERROCOLL_KERNELS` forces: each regime's width and maybe its
/// output stores, and maybe the hand-offs' stores; and the rates a
/// launcher timed its regimes' variants at (in the cache, past it).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Forced {
    in_cache: Option<(Width, Option<Stores>)>,
    past_cache: Option<(Width, Option<Stores>)>,
    handoff: Option<Stores>,
    rates: (Option<f64>, Option<f64>),
}

/// `FERROCOLL_KERNELS`, if this CPU can run what it names:
/// - `avx2` — the width in both regimes, stores by regime and rule;
/// - `avx2,cached` — also the stores of outputs and hand-offs;
/// - `avx2,nt,cached` — outputs' stores, then hand-offs';
/// - `in:avx512,cached;past:avx2,nt` — per regime, with `;handoff:nt`
///   optionally; a regime not named is timed;
/// - `in:avx512,cached@34.2;past:avx2,nt@21.0` — what `ferrocoll launch`
///   passes its ranks: each regime's variant and the GB/s it was timed at
///   (a variant handed on with its rate may be re-measured at run time,
///   one forced without stays).
fn parse(spec: &str) -> Option<Forced> {
    if spec.contains(':') {
        let mut f = Forced::default();
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once(':')?;
            let (value, rate) = match value.split_once('@') {
                Some((v, rate)) => {
                    let rate: f64 = rate.trim().parse().ok()?;
                    if !(rate.is_finite() && rate > 0.0) {
                        return None;
                    }
                    (v, Some(rate))
                }
                None => (value, None),
            };
            match key.trim() {
                "in" => (f.in_cache, f.rates.0) = (Some(one_regime(value)?), rate),
                "past" => (f.past_cache, f.rates.1) = (Some(one_regime(value)?), rate),
                "handoff" if rate.is_none() => f.handoff = Some(stores(value.trim())?),
                _ => return None,
            }
        }
        return Some(f);
    }
    let (width, stores) = variant(spec)?;
    let (output, handoff) = match stores[..] {
        [] => (None, None),
        [one] => (Some(one), Some(one)),
        [output, handoff] => (Some(output), Some(handoff)),
        _ => return None,
    };
    runnable(width, output)?;
    runnable(width, handoff)?;
    Some(Forced {
        in_cache: Some((width, output)),
        past_cache: Some((width, output)),
        handoff,
        rates: (None, None),
    })
}

/// One regime's `width[,stores]`, if runnable.
fn one_regime(text: &str) -> Option<(Width, Option<Stores>)> {
    let (width, stores) = variant(text)?;
    let output = match stores[..] {
        [] => None,
        [one] => Some(one),
        _ => return None,
    };
    runnable(width, output)?;
    Some((width, output))
}

/// A width and the stores after it.
fn variant(text: &str) -> Option<(Width, Vec<Stores>)> {
    let mut width = None;
    let mut list = Vec::new();
    for part in text.split([',', '+', ' ']).filter(|p| !p.is_empty()) {
        match part.trim().to_ascii_lowercase().as_str() {
            "baseline" => width = Some(Width::Baseline),
            "avx2" => width = Some(Width::Avx2),
            "avx512" => width = Some(Width::Avx512),
            other => list.push(stores(other)?),
        }
    }
    Some((width?, list))
}

fn stores(text: &str) -> Option<Stores> {
    match text.to_ascii_lowercase().as_str() {
        "nt" | "non-temporal" => Some(Stores::NonTemporal),
        "cached" => Some(Stores::Cached),
        _ => None,
    }
}

/// `Some` where this CPU runs `width` with `stores` (cached when `None`).
fn runnable(width: Width, stores: Option<Stores>) -> Option<()> {
    let s = stores.unwrap_or(Stores::Cached);
    KernelChoice::available()
        .iter()
        .any(|c| c.width == width && c.stores == s)
        .then_some(())
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
        assert!(shown.contains("past it"), "{shown}");
        // What the launcher passes its ranks reads back as the same choices.
        let c = calibration();
        let f = parse(&c.spec()).expect("a calibration's spec parses");
        let handed = [
            (&c.in_cache, f.in_cache, f.rates.0),
            (&c.past_cache, f.past_cache, f.rates.1),
        ];
        for (r, forced, rate) in handed {
            assert_eq!(forced, Some((r.choice.width, Some(r.choice.stores))));
            // The rate travels to a tenth of a GB/s.
            let close = |a: f64, b: f64| (a - b).abs() <= 0.05 + 1e-9;
            assert_eq!(rate.is_some(), r.rate.is_some(), "{}", c.spec());
            assert!(rate.zip(r.rate).is_none_or(|(a, b)| close(a, b)));
        }
    }

    #[test]
    fn forced_variants_parse_only_when_runnable() {
        let both = |w, s| Some((w, s));
        assert_eq!(
            parse("baseline,cached"),
            Some(Forced {
                in_cache: both(Width::Baseline, Some(Stores::Cached)),
                past_cache: both(Width::Baseline, Some(Stores::Cached)),
                handoff: Some(Stores::Cached),
                rates: (None, None),
            })
        );
        // A width alone leaves the stores to the regime and the rule.
        assert_eq!(
            parse("baseline"),
            Some(Forced {
                in_cache: both(Width::Baseline, None),
                past_cache: both(Width::Baseline, None),
                handoff: None,
                rates: (None, None),
            })
        );
        // Per regime; a regime not named is timed.
        assert_eq!(
            parse("past:baseline,cached"),
            Some(Forced {
                past_cache: both(Width::Baseline, Some(Stores::Cached)),
                ..Forced::default()
            })
        );
        for c in KernelChoice::available() {
            let f = parse(&c.spec()).expect("round-trips");
            assert_eq!(f.past_cache, Some((c.width, Some(c.stores))));
            assert_eq!(f.handoff, Some(c.handoff));
            assert_eq!(parse(c.width_spec()).unwrap().in_cache.unwrap().0, c.width);
        }
        if let Some(f) = parse("avx2,nt,cached") {
            assert_eq!(f.handoff, Some(Stores::Cached));
            let nt = KernelChoice {
                width: Width::Avx2,
                stores: Stores::NonTemporal,
                handoff: Stores::Cached,
            };
            assert_eq!(nt.to(Destination::Handoff).stores(), Stores::Cached);
            assert_eq!(nt.to(Destination::Output), nt);
            assert!(nt.to_string().contains("to hand-offs"), "{nt}");
        }
        // A launcher's hand-on: variants with the rates they were timed at.
        let handed = parse("in:baseline,cached@34.25;past:baseline,nt@9").unwrap();
        assert_eq!(handed.rates, (Some(34.25), Some(9.0)));
        assert_eq!(handed.in_cache, both(Width::Baseline, Some(Stores::Cached)));
        for bad in [
            "past:baseline,cached@",
            "past:baseline,cached@fast",
            "past:baseline,cached@-3",
            "past:baseline,cached@inf",
            "handoff:nt@3",
            "avx2,nt,cached,nt",
            "avx3,nt",
            "",
            "in:baseline,nt,cached",
            "inside:baseline",
            "handoff:sometimes",
        ] {
            assert!(parse(bad).is_none(), "{bad}");
        }
        for w in KernelChoice::unavailable() {
            let name = if w == Width::Avx2 { "avx2" } else { "avx512" };
            assert!(parse(name).is_none(), "{name} offered on a CPU without it");
            assert!(parse(&format!("past:{name}")).is_none(), "{name}");
        }
    }

    /// Every call takes its regime's width and output stores; hand-offs
    /// store by their own size unless forced.
    #[test]
    fn a_call_runs_its_regimes_choice() {
        let c = calibration();
        let past = c.rule.threshold() + 1;
        let big = for_call(past, 512 << 10);
        let small = for_call(4 << 10, 512 << 10);
        assert_eq!(
            (big.width(), big.stores()),
            (c.past_cache.choice.width, c.past_cache.choice.stores)
        );
        assert_eq!(
            (small.width(), small.stores()),
            (c.in_cache.choice.width, c.in_cache.choice.stores)
        );
        if c.forced_handoff.is_none() {
            assert_eq!(big.handoff_stores(), Stores::Cached);
            let nt_here = KernelChoice::available()
                .iter()
                .any(|k| k.width == big.width && k.stores == Stores::NonTemporal);
            if nt_here {
                assert_eq!(for_call(past, past).handoff_stores(), Stores::NonTemporal);
            }
        }
    }
}
