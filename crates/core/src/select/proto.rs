//! `FERROCOLL_PROTO` in NCCL_PROTO's form: which protocols a device
//! executor's calls may move their messages with, per collective.
//!
//! - `LL` or `Simple` — that protocol for every collective (forced);
//! - `^LL` — anything but these (here: Simple);
//! - `allreduce:LL;broadcast:simple` — per collective, `;` between rules,
//!   collectives as [`AlgoFilter`](super::AlgoFilter) spells them;
//!   collectives no rule names are free.
//!
//! Names are case-insensitive. NCCL's `LL128` is refused by name: the
//! CUDA executor has no such protocol, and silently running another would
//! hide that from whoever set it. A rule that allows nothing is refused
//! too. Host executors have one protocol (and the one-shot path,
//! `FERROCOLL_ONE_SHOT_BYTES`), so the filter concerns the CUDA executor.

use std::fmt;

use super::Protocol;
use super::filter::parse_collectives;
use crate::types::CollectiveKind;

/// Which protocols calls may use (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoFilter {
    rules: Vec<ProtoRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ProtoRule {
    /// `None`: every collective.
    collectives: Option<Vec<CollectiveKind>>,
    /// The text as written, for messages.
    text: String,
    simple: bool,
    ll: bool,
}

impl ProtoFilter {
    /// Parse `FERROCOLL_PROTO`'s value; `None` for nothing set. A token
    /// naming no protocol or collective, and a rule allowing nothing, are
    /// errors naming it.
    pub fn parse(text: &str) -> Result<Option<ProtoFilter>, String> {
        let mut rules = Vec::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (collectives, list) = match part.split_once(':') {
                Some((c, l)) => (Some(parse_collectives(c)?), l.trim()),
                None => (None, part),
            };
            let (except, names) = match list.strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, list),
            };
            let mut named = (false, false);
            for n in names.split(',').map(str::trim) {
                match parse_protocol(n).map_err(|e| format!("`{n}` in `{part}`: {e}"))? {
                    Protocol::Simple => named.0 = true,
                    Protocol::LowLatency => named.1 = true,
                }
            }
            let (simple, ll) = if except { (!named.0, !named.1) } else { named };
            if !simple && !ll {
                return Err(format!("`{part}` allows no protocol"));
            }
            rules.push(ProtoRule {
                collectives,
                text: part.to_owned(),
                simple,
                ll,
            });
        }
        Ok((!rules.is_empty()).then_some(ProtoFilter { rules }))
    }

    /// The rule for `kind`: the first naming it, else the first naming
    /// no collective.
    fn rule(&self, kind: CollectiveKind) -> Option<&ProtoRule> {
        let named = self
            .rules
            .iter()
            .find(|r| r.collectives.as_ref().is_some_and(|c| c.contains(&kind)));
        named.or_else(|| self.rules.iter().find(|r| r.collectives.is_none()))
    }

    /// Whether `kind` may move its messages with `protocol`.
    pub fn permits(&self, kind: CollectiveKind, protocol: Protocol) -> bool {
        self.rule(kind).is_none_or(|r| match protocol {
            Protocol::Simple => r.simple,
            Protocol::LowLatency => r.ll,
        })
    }

    /// The protocol of a call of `kind` that `chosen` (the selector's
    /// choice, or `None` for the executor's own rule) would have run
    /// with: a protocol the rule forces, else `chosen` if allowed, else
    /// the allowed one. Also returns why, where the filter changed it.
    pub fn apply(
        &self,
        kind: CollectiveKind,
        chosen: Option<Protocol>,
    ) -> (Option<Protocol>, Option<String>) {
        let Some(rule) = self.rule(kind) else {
            return (chosen, None);
        };
        let only = match (rule.simple, rule.ll) {
            (true, false) => Some(Protocol::Simple),
            (false, true) => Some(Protocol::LowLatency),
            _ => None,
        };
        match only {
            Some(p) if chosen != Some(p) => (
                Some(p),
                Some(format!("FERROCOLL_PROTO `{}` runs {p}", rule.text)),
            ),
            _ => (chosen, None),
        }
    }
}

/// A protocol by NCCL_PROTO's names (any case).
fn parse_protocol(name: &str) -> Result<Protocol, String> {
    match name.to_ascii_lowercase().as_str() {
        "simple" => Ok(Protocol::Simple),
        "ll" => Ok(Protocol::LowLatency),
        "ll128" => Err(
            "LL128 is an NCCL protocol the CUDA executor does not have (it has Simple and LL)"
                .to_owned(),
        ),
        "" => Err("an empty protocol name".to_owned()),
        _ => Err("no such protocol (Simple, LL)".to_owned()),
    }
}

impl fmt::Display for ProtoFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<&str> = self.rules.iter().map(|r| r.text.as_str()).collect();
        f.write_str(&rules.join(";"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CollectiveKind as C;
    use Protocol::{LowLatency as Ll, Simple};

    #[test]
    fn nccl_forms_force_or_exclude_per_collective() {
        let f = ProtoFilter::parse("allreduce:ll; ^LL").unwrap().unwrap();
        assert!(f.permits(C::AllReduce, Ll) && !f.permits(C::AllReduce, Simple));
        assert!(!f.permits(C::Broadcast, Ll) && f.permits(C::Broadcast, Simple));
        assert_eq!(f.apply(C::AllReduce, None).0, Some(Ll));
        assert_eq!(f.apply(C::AllReduce, Some(Simple)).0, Some(Ll));
        assert_eq!(f.apply(C::AllGather, Some(Ll)).0, Some(Simple));
        assert!(f.apply(C::AllGather, Some(Ll)).1.unwrap().contains("^LL"));
        assert_eq!(f.apply(C::AllGather, Some(Simple)), (Some(Simple), None));
        let free = ProtoFilter::parse("broadcast:Simple").unwrap().unwrap();
        assert_eq!(free.apply(C::AllReduce, Some(Ll)), (Some(Ll), None));
        assert_eq!(free.apply(C::AllReduce, None), (None, None));
        let both = ProtoFilter::parse("simple,LL").unwrap().unwrap();
        assert_eq!(both.apply(C::Reduce, Some(Ll)), (Some(Ll), None));
        assert_eq!(ProtoFilter::parse(" ; ").unwrap(), None);
        assert_eq!(f.to_string(), "allreduce:ll;^LL");
    }

    #[test]
    fn a_bad_token_or_an_empty_rule_is_an_error_naming_it() {
        for (bad, token) in [
            ("LL128", "LL128"),
            ("allreduce:ll128", "ll128"),
            ("simpel", "simpel"),
            ("allreduse:LL", "allreduse"),
            ("^simple,ll", "allows no protocol"),
            ("^", "empty"),
        ] {
            let e = ProtoFilter::parse(bad).unwrap_err();
            assert!(e.contains(token), "{bad}: {e}");
        }
    }
}
