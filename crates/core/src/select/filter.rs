//! `FERROCOLL_ALGO` in NCCL_ALGO's form: which algorithms calls may run,
//! per collective.
//!
//! - `ring` — one algorithm for every collective (forced);
//! - `ring,tree` — any of these; the selector or the rule picks among them;
//! - `^direct` — anything but these;
//! - `allreduce:tree;broadcast:ring,direct` — per collective, `;` between
//!   rules (collectives as NCCL spells them, `allreduce`, or as ferrocoll
//!   does, `all-reduce`); collectives no rule names are free.
//!
//! A collective whose allowed list has one algorithm runs it as if forced
//! (and never takes the one-shot protocol); otherwise the selector's or
//! the rule's pick stands if allowed, else the first allowed algorithm
//! that can express the collective (for `^` lists: ring, tree, direct,
//! halving-doubling in that order). Schedules a selector synthesized
//! count as allowed unless a list names what is allowed.

use std::fmt;

use crate::algorithms::Algorithm;
use crate::types::CollectiveKind;

/// Which algorithms calls may run (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlgoFilter {
    rules: Vec<FilterRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FilterRule {
    /// `None`: every collective.
    collectives: Option<Vec<CollectiveKind>>,
    allowed: Allowed,
}

/// What a rule allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// These, in order of preference.
    Only(Vec<Algorithm>),
    /// Anything but these.
    Except(Vec<Algorithm>),
}

/// The order `^` lists fall back in.
const FALLBACK: [Algorithm; 4] = [
    Algorithm::Ring,
    Algorithm::Tree,
    Algorithm::Direct,
    Algorithm::HalvingDoubling,
];

impl AlgoFilter {
    /// Parse `FERROCOLL_ALGO`'s value; `None` for `auto` or nothing.
    /// A token naming no algorithm or collective is an error naming it.
    pub fn parse(text: &str) -> Result<Option<AlgoFilter>, String> {
        let mut rules = Vec::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (collectives, list) = match part.split_once(':') {
                Some((c, l)) => (Some(parse_collectives(c)?), l),
                None => (None, part),
            };
            let list = list.trim();
            if list.eq_ignore_ascii_case("auto") {
                continue;
            }
            let (except, names) = match list.strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, list),
            };
            let algorithms = names
                .split(',')
                .map(str::trim)
                .map(|n| {
                    n.parse::<Algorithm>()
                        .map_err(|e| format!("`{n}` in `{part}`: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let allowed = if except {
                Allowed::Except(algorithms)
            } else {
                Allowed::Only(algorithms)
            };
            rules.push(FilterRule {
                collectives,
                allowed,
            });
        }
        Ok((!rules.is_empty()).then_some(AlgoFilter { rules }))
    }

    /// The rule for `kind`: the first naming it, else the first naming
    /// no collective.
    pub fn allowed(&self, kind: CollectiveKind) -> Option<&Allowed> {
        let named = self
            .rules
            .iter()
            .find(|r| r.collectives.as_ref().is_some_and(|c| c.contains(&kind)));
        named
            .or_else(|| self.rules.iter().find(|r| r.collectives.is_none()))
            .map(|r| &r.allowed)
    }

    /// The one algorithm `kind` must run, where its list has one.
    pub fn forced(&self, kind: CollectiveKind) -> Option<Algorithm> {
        match self.allowed(kind)? {
            Allowed::Only(list) if list.len() == 1 => Some(list[0]),
            _ => None,
        }
    }

    /// Whether `kind` may run `algorithm` (`None`: a synthesized schedule).
    pub fn permits(&self, kind: CollectiveKind, algorithm: Option<Algorithm>) -> bool {
        match (self.allowed(kind), algorithm) {
            (None, _) => true,
            (Some(Allowed::Only(list)), Some(a)) => list.contains(&a),
            (Some(Allowed::Only(_)), None) => false,
            (Some(Allowed::Except(list)), Some(a)) => !list.contains(&a),
            (Some(Allowed::Except(_)), None) => true,
        }
    }

    /// The first allowed algorithm that can express `kind`, if any.
    pub fn fallback(&self, kind: CollectiveKind) -> Option<Algorithm> {
        let candidates: Vec<Algorithm> = match self.allowed(kind)? {
            Allowed::Only(list) => list.clone(),
            Allowed::Except(list) => FALLBACK.into_iter().filter(|a| !list.contains(a)).collect(),
        };
        candidates.into_iter().find(|a| a.supports(kind).is_ok())
    }
}

pub(super) fn parse_collectives(text: &str) -> Result<Vec<CollectiveKind>, String> {
    text.split(',')
        .map(str::trim)
        .map(|c| {
            c.parse::<CollectiveKind>()
                .map_err(|e| format!("`{c}` before `:`: {e}"))
        })
        .collect()
}

impl fmt::Display for AlgoFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<String> = self
            .rules
            .iter()
            .map(|r| {
                let (hat, list) = match &r.allowed {
                    Allowed::Only(l) => ("", l),
                    Allowed::Except(l) => ("^", l),
                };
                let names: Vec<&str> = list.iter().map(|a| a.name()).collect();
                let list = format!("{hat}{}", names.join(","));
                match &r.collectives {
                    None => list,
                    Some(c) => {
                        let c: Vec<&str> = c.iter().map(|k| k.name()).collect();
                        format!("{}:{list}", c.join(","))
                    }
                }
            })
            .collect();
        f.write_str(&rules.join(";"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CollectiveKind as C;

    #[test]
    fn nccl_forms_parse_per_collective_with_exclusions() {
        let f = AlgoFilter::parse("allreduce:tree;AllGather:ring,direct")
            .unwrap()
            .unwrap();
        assert_eq!(f.forced(C::AllReduce), Some(Algorithm::Tree));
        assert_eq!(f.forced(C::AllGather), None);
        assert!(f.permits(C::AllGather, Some(Algorithm::Direct)));
        assert!(!f.permits(C::AllGather, Some(Algorithm::Tree)));
        assert!(
            f.permits(C::Broadcast, Some(Algorithm::Tree)),
            "not named: free"
        );
        assert!(f.permits(C::Broadcast, None));
        assert!(
            !f.permits(C::AllReduce, None),
            "a list excludes synthesized schedules"
        );
        let f = AlgoFilter::parse("^direct, tree").unwrap().unwrap();
        assert!(!f.permits(C::AllReduce, Some(Algorithm::Tree)));
        assert!(f.permits(C::AllReduce, None));
        assert_eq!(f.fallback(C::AllReduce), Some(Algorithm::Ring));
        assert_eq!(f.fallback(C::AllToAll), None, "only direct expresses it");
        assert_eq!(AlgoFilter::parse("auto").unwrap(), None);
        assert_eq!(AlgoFilter::parse(" ; ").unwrap(), None);
        assert_eq!(f.to_string(), "^direct,tree");
        let round = AlgoFilter::parse("all-reduce,reduce:ring;^hd")
            .unwrap()
            .unwrap();
        assert_eq!(
            round.to_string(),
            "all-reduce,reduce:ring;^halving-doubling"
        );
        assert_eq!(
            AlgoFilter::parse(&round.to_string()).unwrap().unwrap(),
            round
        );
    }

    #[test]
    fn a_bad_token_is_an_error_naming_it() {
        for (bad, token) in [
            ("allreduce:nvls", "nvls"),
            ("ring,colnet", "colnet"),
            ("allreduse:ring", "allreduse"),
            ("^", "``"),
        ] {
            let e = AlgoFilter::parse(bad).unwrap_err();
            assert!(e.contains(token.trim_matches('`')), "{bad}: {e}");
        }
    }

    /// `FERROCOLL_ALGO='allreduce:tree'` (as the environment gives it):
    /// every all-reduce, small ones too, runs the tree; other collectives
    /// run what they would.
    #[test]
    fn allreduce_tree_forces_the_tree_on_all_reduce_only() {
        use crate::comm::CommunicatorExt;
        use crate::settings::EnvOverrides;
        let env = EnvOverrides::from_lookup(|k| {
            (k == "FERROCOLL_ALGO").then(|| "allreduce:tree".to_owned())
        })
        .unwrap();
        assert_eq!(env.algorithm, Some(None));
        let config = crate::cpu::CpuConfig {
            planning: crate::comm::Planning::default().with_overrides(&env),
            ..crate::cpu::CpuConfig::builtin()
        };
        let ran = crate::cpu::run(4, &config, |comm| {
            let mut x = vec![1.0f32; 8];
            comm.all_reduce_in_place(&mut x, crate::ReduceOp::Sum)?;
            let mut y = vec![1.0f32; 1 << 16];
            comm.all_reduce_in_place(&mut y, crate::ReduceOp::Sum)?;
            let mut out = vec![0.0f32; 4 << 10];
            comm.all_gather(&vec![1.0f32; 1 << 10], &mut out)?;
            assert!(x.iter().chain(&y).all(|&v| v == 4.0) && out.iter().all(|&v| v == 1.0));
            Ok(comm
                .recorder()
                .calls()
                .into_iter()
                .map(|c| c.algorithm.unwrap_or_default())
                .collect::<Vec<_>>())
        });
        for r in ran {
            let algorithms = r.unwrap();
            assert!(
                algorithms[0].starts_with("tree") && algorithms[1].starts_with("tree"),
                "{algorithms:?}"
            );
            assert!(!algorithms[2].starts_with("tree"), "{algorithms:?}");
        }
        let bad = EnvOverrides::from_lookup(|k| {
            (k == "FERROCOLL_ALGO").then(|| "allreduce:nvls".to_owned())
        });
        let e = bad.unwrap_err().to_string();
        assert!(
            e.starts_with("FERROCOLL_ALGO:") && e.contains("nvls"),
            "{e}"
        );
    }
}
