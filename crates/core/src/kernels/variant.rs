//! A kernel variant: the vector width the kernels are compiled for and
//! the kind of store for each kind of destination. Which variant a call
//! runs is `choice.rs`'s; the kernels that run it are `lines.rs`'s and
//! `mod.rs`'s.
//!
//! A [`KernelChoice`] can only be made for what this CPU supports
//! ([`KernelChoice::available`], and `choice.rs`, which picks among those
//! and falls back to cached stores where non-temporal ones are missing;
//! the fields are private to the kernels), which is what makes calling
//! the `#[target_feature]` kernels behind it sound.

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
    pub(super) width: Width,
    pub(super) stores: Stores,
    pub(super) handoff: Stores,
}

pub(super) fn width_name(w: Width) -> &'static str {
    match w {
        Width::Baseline => "baseline",
        Width::Avx2 => "avx2",
        Width::Avx512 => "avx512",
    }
}

pub(super) fn stores_name(s: Stores, short: bool) -> &'static str {
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

/// The rate `rates` gives the variant of `width` and `stores` (whatever
/// its hand-off stores).
pub(super) fn rate_of(rates: &[(KernelChoice, f64)], width: Width, stores: Stores) -> Option<f64> {
    rates
        .iter()
        .find(|(c, _)| (c.width, c.stores) == (width, stores))
        .map(|r| r.1)
}

impl KernelChoice {
    /// The `FERROCOLL_KERNELS` value that forces this variant's width
    /// alone (`avx2`: stores by the rule, per call).
    pub fn width_spec(&self) -> &'static str {
        width_name(self.width)
    }

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

    /// This variant for one fused pass (`Reduce::reduce_stream_with`) of
    /// `bytes` from the sources to the destinations at these addresses, or
    /// `None` where a destination partly overlaps a source: only a staged
    /// path may write there. A destination may be exactly a source (in
    /// place: over this rank's read, or over the block a peer lent), since
    /// the kernels load a line from every source before storing it; those
    /// lines were just loaded, so the pass then stores through the cache.
    /// The one rule of every host executor's fused pass.
    pub fn for_fused_pass(
        self,
        srcs: &[usize],
        dsts: &[usize],
        bytes: usize,
    ) -> Option<KernelChoice> {
        let meets = |a: usize, b: usize| a < b.saturating_add(bytes) && b < a.saturating_add(bytes);
        let apart = dsts
            .iter()
            .all(|&d| srcs.iter().all(|&s| d == s || !meets(d, s)));
        let aliased = dsts.iter().any(|d| srcs.contains(d));
        apart.then(|| if aliased { self.cached() } else { self })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fused_pass_takes_exact_aliases_through_the_cache_and_refuses_partial_overlaps() {
        for c in KernelChoice::available() {
            let pass = |srcs: &[usize], dsts: &[usize]| {
                c.for_fused_pass(srcs, dsts, 100).map(|c| c.stores())
            };
            assert_eq!(pass(&[0, 1000], &[2000]), Some(c.stores()), "apart");
            assert_eq!(
                pass(&[0, 1000], &[0, 2000]),
                Some(Stores::Cached),
                "in place"
            );
            assert_eq!(pass(&[0, 1000], &[1100]), Some(c.stores()), "adjacent");
            assert_eq!(pass(&[0, 1000], &[1099]), None, "one byte shared");
            assert_eq!(pass(&[1000], &[950]), None, "overlapping from below");
            assert_eq!(
                pass(&[usize::MAX - 10], &[usize::MAX - 50]),
                None,
                "at the top of memory"
            );
        }
    }
}
