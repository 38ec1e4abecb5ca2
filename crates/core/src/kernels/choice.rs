//! Which kernel variant this host runs: the vector width (by CPU feature
//! detection) and the kind of store (non-temporal or cached) for each kind
//! of destination — a call's output, and a hand-off another rank reads
//! next — chosen by measuring once per process.
//!
//! A [`KernelChoice`] can only be made for what this CPU supports
//! ([`KernelChoice::available`]), which is what makes calling the
//! `#[target_feature]` kernels behind it sound.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The vector width the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Width {
    /// What the compile target guarantees (SSE2 on x86-64, NEON on
    /// aarch64), autovectorized.
    Baseline,
    /// 256-bit AVX2 (x86-64).
    Avx2,
    /// 512-bit AVX-512 F/BW/VL (x86-64).
    Avx512,
}

/// How results reach a destination that is written once and not read
/// again by this core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stores {
    /// Non-temporal (streaming) stores: whole lines straight to memory,
    /// skipping the read-for-ownership of each destination line.
    NonTemporal,
    /// Ordinary stores through the cache.
    Cached,
}

/// What a long write is for, which decides the best kind of store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Destination {
    /// A call's output: read by the caller later, if soon then by one
    /// pass that prefetches well — the stores that write fastest win.
    Output,
    /// A hand-off (a shared-memory slot, a staging area): another rank
    /// reads it right after, so stores that leave it in the cache can
    /// beat stores that are faster to write but send it to memory.
    Handoff,
}

/// One kernel variant this CPU can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelChoice {
    width: Width,
    stores: Stores,
    handoff: Stores,
}

fn width_name(w: Width) -> &'static str {
    match w {
        Width::Baseline => "baseline",
        Width::Avx2 => "avx2",
        Width::Avx512 => "avx512",
    }
}

fn stores_name(s: Stores, short: bool) -> &'static str {
    match (s, short) {
        (Stores::NonTemporal, true) => "nt",
        (Stores::NonTemporal, false) => "non-temporal",
        (Stores::Cached, _) => "cached",
    }
}

impl std::fmt::Display for KernelChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (width, stores) = (width_name(self.width), stores_name(self.stores, false));
        if self.handoff == self.stores {
            write!(f, "{width} + {stores} stores")
        } else {
            let handoff = stores_name(self.handoff, false);
            write!(
                f,
                "{width} + {stores} stores to outputs, {handoff} to hand-offs"
            )
        }
    }
}

impl KernelChoice {
    /// The `FERROCOLL_KERNELS` value that forces this variant
    /// (`avx2,nt,cached`: width, stores to outputs, stores to hand-offs).
    pub fn spec(&self) -> String {
        format!(
            "{},{},{}",
            width_name(self.width),
            stores_name(self.stores, true),
            stores_name(self.handoff, true)
        )
    }

    /// This variant's width with cached stores (always runnable: the width
    /// is what the CPU was checked for) — for outputs that are read again
    /// soon, or written over the very lines just loaded (in place), where
    /// a non-temporal store would first have to evict the line.
    pub fn cached(self) -> KernelChoice {
        KernelChoice {
            stores: Stores::Cached,
            ..self
        }
    }

    /// This variant as it writes to `to`: its stores for that kind of
    /// destination.
    pub fn to(self, to: Destination) -> KernelChoice {
        match to {
            Destination::Output => self,
            Destination::Handoff => KernelChoice {
                stores: self.handoff,
                ..self
            },
        }
    }

    /// The vector width.
    pub fn width(&self) -> Width {
        self.width
    }

    /// The stores for long outputs.
    pub fn stores(&self) -> Stores {
        self.stores
    }

    /// The stores for hand-offs another rank reads next.
    pub fn handoff_stores(&self) -> Stores {
        self.handoff
    }

    /// Every variant this CPU can run, narrowest first (each with the same
    /// stores for both kinds of destination).
    pub fn available() -> Vec<KernelChoice> {
        let mut widths = vec![Width::Baseline];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                widths.push(Width::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
            {
                widths.push(Width::Avx512);
            }
        }
        let stores: &[Stores] = if cfg!(target_arch = "x86_64") {
            &[Stores::NonTemporal, Stores::Cached]
        } else {
            &[Stores::Cached]
        };
        widths
            .into_iter()
            .flat_map(|width| {
                stores.iter().map(move |&stores| KernelChoice {
                    width,
                    stores,
                    handoff: stores,
                })
            })
            .collect()
    }

    /// Variants named in `KernelChoice::available` but not runnable here,
    /// for reports: the widths this CPU lacks.
    pub fn unavailable() -> Vec<Width> {
        let have: Vec<Width> = KernelChoice::available().iter().map(|c| c.width).collect();
        [Width::Avx2, Width::Avx512]
            .into_iter()
            .filter(|w| !have.contains(w))
            .collect()
    }
}

/// What the calibration measured and chose.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// The variant every call uses.
    pub choice: KernelChoice,
    /// Each candidate's rate in GB/s (bytes read and written by a fused
    /// two-source, two-destination f32 sum), best of a few runs.
    pub rates: Vec<(KernelChoice, f64)>,
    /// With the chosen width, each kind of store's rate in GB/s for a
    /// hand-off: a slot-sized sum written, then read back.
    pub handoff_rates: Vec<(Stores, f64)>,
    /// How long calibrating took.
    pub took: Duration,
}

impl std::fmt::Display for Calibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.rates.is_empty() && self.took.is_zero() {
            return write!(f, "{} (forced by FERROCOLL_KERNELS)", self.choice);
        }
        write!(f, "{} (calibrated in {:.0?}:", self.choice, self.took)?;
        for (c, rate) in &self.rates {
            write!(f, " {c} {rate:.1} GB/s;")?;
        }
        if !self.handoff_rates.is_empty() {
            f.write_str(" hand-offs:")?;
            for (s, rate) in &self.handoff_rates {
                write!(f, " {} {rate:.1} GB/s;", stores_name(*s, false))?;
            }
        }
        f.write_str(")")
    }
}

/// The variant this process uses, measured on first use and cached.
pub fn chosen() -> KernelChoice {
    calibration().choice
}

/// The calibration, run on first use (a few tens of milliseconds), unless
/// `FERROCOLL_KERNELS` forces a variant this CPU can run.
pub fn calibration() -> &'static Calibration {
    static CALIBRATION: OnceLock<Calibration> = OnceLock::new();
    CALIBRATION.get_or_init(|| {
        let forced = crate::settings::kernels_override().and_then(|v| match parse(&v) {
            Some(c) => Some(c),
            None => {
                tracing::warn!(
                    "FERROCOLL_KERNELS=`{v}` is not a variant this CPU can run; calibrating"
                );
                None
            }
        });
        let c = match forced {
            Some(choice) => Calibration {
                choice,
                rates: Vec::new(),
                handoff_rates: Vec::new(),
                took: Duration::ZERO,
            },
            None => calibrate(),
        };
        tracing::debug!("host kernels: {c}");
        c
    })
}

/// A variant named like `avx2,cached` (both kinds of destination) or
/// `avx2,nt,cached` (outputs, then hand-offs), if this CPU can run it.
fn parse(spec: &str) -> Option<KernelChoice> {
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
    let (output, handoff) = match stores[..] {
        [one] => (one, one),
        [output, handoff] => (output, handoff),
        _ => return None,
    };
    let width = width?;
    let runnable = |s: Stores| {
        KernelChoice::available()
            .iter()
            .any(|c| c.width == width && c.stores == s)
    };
    (runnable(output) && runnable(handoff)).then_some(KernelChoice {
        width,
        stores: output,
        handoff,
    })
}

/// Elements of each calibration array: 4 MiB of f32, large enough that
/// every store leaves L2, small enough to finish in milliseconds.
const CALIBRATION_LEN: usize = 1 << 20;

/// A narrower width within this fraction of the best rate wins: wide
/// vectors can slow the rest of the program down (frequency licences).
const NARROWER_WITHIN: f64 = 0.03;

fn calibrate() -> Calibration {
    let started = Instant::now();
    let candidates = KernelChoice::available();
    if candidates.len() == 1 {
        return Calibration {
            choice: candidates[0],
            rates: Vec::new(),
            handoff_rates: Vec::new(),
            took: started.elapsed(),
        };
    }
    let a: Vec<f32> = (0..CALIBRATION_LEN).map(|i| i as f32).collect();
    let b = vec![0.5f32; CALIBRATION_LEN];
    let mut d0 = vec![0f32; CALIBRATION_LEN];
    let mut d1 = vec![0f32; CALIBRATION_LEN];
    let bytes = (4 * CALIBRATION_LEN * 4) as f64;
    let mut rates = Vec::new();
    for &choice in &candidates {
        let mut best = f64::MAX;
        for _ in 0..4 {
            let t = Instant::now();
            // SAFETY: four distinct arrays of CALIBRATION_LEN elements;
            // `choice` is available on this CPU.
            unsafe {
                super::lines::sum_f32(
                    choice,
                    &[a.as_ptr(), b.as_ptr()],
                    &[d0.as_mut_ptr(), d1.as_mut_ptr()],
                    CALIBRATION_LEN,
                );
            }
            super::stream_fence();
            best = best.min(t.elapsed().as_secs_f64());
        }
        rates.push((choice, bytes / best / 1e9));
    }
    std::hint::black_box((&d0, &d1));
    let choice = pick(&rates);
    let handoff_rates = measure_handoffs(choice, &a, &b, &mut d0);
    let handoff = handoff_rates
        .iter()
        .copied()
        .reduce(|best, r| if r.1 > best.1 { r } else { best })
        .map_or(choice.stores, |r| r.0);
    Calibration {
        choice: KernelChoice { handoff, ..choice },
        rates,
        handoff_rates,
        took: started.elapsed(),
    }
}

/// Elements of a hand-off in the calibration: 512 KiB of f32, the size of
/// a shared-memory slot with the default settings.
const HANDOFF_LEN: usize = 128 << 10;

/// Each kind of store `choice`'s width has, timed on what a hand-off
/// costs: a slot-sized two-source sum written, then read back, as the
/// receiving rank does next (read here by the same core — the cache it
/// leaves the data in, or not, is what the kinds differ by). Rates are
/// bytes moved (three arrays) per second, best of a few rounds, each
/// round on fresh bytes of the arrays.
fn measure_handoffs(
    choice: KernelChoice,
    a: &[f32],
    b: &[f32],
    d: &mut [f32],
) -> Vec<(Stores, f64)> {
    let kinds: Vec<Stores> = KernelChoice::available()
        .iter()
        .filter(|c| c.width == choice.width)
        .map(|c| c.stores)
        .collect();
    if kinds.len() < 2 {
        return Vec::new();
    }
    let bytes = (3 * HANDOFF_LEN * 4) as f64;
    let rounds = a.len() / HANDOFF_LEN;
    kinds
        .into_iter()
        .map(|stores| {
            let v = KernelChoice { stores, ..choice };
            let mut best = f64::MAX;
            for round in 0..rounds {
                let at = round * HANDOFF_LEN;
                let t = Instant::now();
                // SAFETY: three distinct arrays, each holding HANDOFF_LEN
                // elements from `at` (rounds stay within their length);
                // `v` is available on this CPU.
                unsafe {
                    super::lines::sum_f32(
                        v,
                        &[a[at..].as_ptr(), b[at..].as_ptr()],
                        &[d[at..].as_mut_ptr()],
                        HANDOFF_LEN,
                    );
                }
                super::stream_fence();
                // Bits, not floats: a read the compiler vectorizes, as a
                // receiver's reduction is.
                let read = d[at..at + HANDOFF_LEN]
                    .iter()
                    .fold(0u32, |acc, x| acc ^ x.to_bits());
                std::hint::black_box(read);
                best = best.min(t.elapsed().as_secs_f64());
            }
            (stores, bytes / best / 1e9)
        })
        .collect()
}

/// The fastest variant, or a narrower one within [`NARROWER_WITHIN`] of it.
fn pick(rates: &[(KernelChoice, f64)]) -> KernelChoice {
    let best = rates.iter().map(|r| r.1).fold(0.0, f64::max);
    rates
        .iter()
        .find(|r| r.1 >= best * (1.0 - NARROWER_WITHIN))
        .map_or(rates[0].0, |r| r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Some(KernelChoice {
                width: Width::Baseline,
                stores: Stores::Cached,
                handoff: Stores::Cached,
            })
        );
        assert!(parse("avx2").is_none(), "stores are required");
        for c in KernelChoice::available() {
            assert_eq!(parse(&c.spec()), Some(c), "{c} round-trips");
        }
        let split = parse("baseline,cached,cached").unwrap();
        assert_eq!(split.to(Destination::Handoff), split);
        if let Some(nt) = parse("avx2,nt,cached") {
            assert_eq!(nt.stores(), Stores::NonTemporal);
            assert_eq!(nt.to(Destination::Handoff).stores(), Stores::Cached);
            assert_eq!(nt.to(Destination::Output), nt);
            assert_eq!(parse(&nt.spec()), Some(nt), "{nt} round-trips");
            assert!(nt.to_string().contains("to hand-offs"), "{nt}");
        }
        assert!(parse("avx2,nt,cached,nt").is_none(), "at most two kinds");
        assert!(parse("avx3,nt").is_none());
        assert!(parse("").is_none());
        for w in KernelChoice::unavailable() {
            let name = if w == Width::Avx2 {
                "avx2,nt"
            } else {
                "avx512,nt"
            };
            assert!(parse(name).is_none(), "{name} offered on a CPU without it");
        }
    }

    #[test]
    fn a_narrower_width_wins_a_near_tie() {
        let all = KernelChoice::available();
        let rates: Vec<_> = all
            .iter()
            .enumerate()
            .map(|(i, &c)| (c, 10.0 + 0.01 * i as f64))
            .collect();
        assert_eq!(pick(&rates), all[0]);
        let mut rates = rates;
        if let Some(last) = rates.last_mut() {
            last.1 = 20.0;
        }
        assert_eq!(pick(&rates), *all.last().unwrap());
    }
}
