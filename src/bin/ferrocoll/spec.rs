//! Parsing of the command-line lists: algorithms, collectives, rank ranges.

use std::path::PathBuf;

use ferrocoll::{Algorithm, CollectiveKind};

/// What `--algo` names.
#[derive(Debug, Clone)]
pub(crate) enum AlgoSpec {
    /// Every built-in algorithm.
    All,
    /// Some built-in algorithms.
    Builtin(Vec<Algorithm>),
    /// A schedule file.
    File(PathBuf),
}

pub(crate) fn parse_algo(s: &str) -> Result<AlgoSpec, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(AlgoSpec::All);
    }
    let path = PathBuf::from(s);
    if s.ends_with(".json") || path.is_file() {
        return Ok(AlgoSpec::File(path));
    }
    s.split(',')
        .map(|a| a.trim().parse::<Algorithm>().map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()
        .map(AlgoSpec::Builtin)
}

impl AlgoSpec {
    pub(crate) fn builtins(&self) -> Vec<Algorithm> {
        match self {
            AlgoSpec::All => Algorithm::ALL.to_vec(),
            AlgoSpec::Builtin(list) => list.clone(),
            AlgoSpec::File(_) => Vec::new(),
        }
    }
}

/// Collectives named by `--op`.
#[derive(Debug, Clone)]
pub(crate) struct Ops(pub(crate) Vec<CollectiveKind>);

/// `all` or a comma-separated list of collectives.
pub(crate) fn parse_ops(s: &str) -> Result<Ops, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(Ops(CollectiveKind::ALL.to_vec()));
    }
    s.split(',')
        .map(|k| {
            k.trim()
                .parse::<CollectiveKind>()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()
        .map(Ops)
}

/// World sizes named by `--ranks`.
#[derive(Debug, Clone)]
pub(crate) struct Ranks(pub(crate) Vec<u32>);

/// World sizes: `8`, `1..64` or `1..=64` (both inclusive), or a
/// comma-separated mix such as `1..8,16,32`.
pub(crate) fn parse_ranks(s: &str) -> Result<Ranks, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let number = |t: &str| {
            t.trim()
                .parse::<u32>()
                .map_err(|_| format!("`{t}` in --ranks `{s}` is not a world size"))
        };
        if let Some((lo, hi)) = part.split_once("..") {
            let (lo, hi) = (number(lo)?, number(hi.trim_start_matches('='))?);
            if lo > hi {
                return Err(format!("empty range `{part}` in --ranks"));
            }
            out.extend(lo..=hi);
        } else {
            out.push(number(part)?);
        }
    }
    if out.contains(&0) {
        return Err("world size 0 has no ranks; start at 1".to_owned());
    }
    out.sort_unstable();
    out.dedup();
    Ok(Ranks(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_accept_ranges_and_lists() {
        assert_eq!(parse_ranks("1..4").unwrap().0, vec![1, 2, 3, 4]);
        assert_eq!(parse_ranks("1..=3,8, 2").unwrap().0, vec![1, 2, 3, 8]);
        assert!(parse_ranks("0..3").is_err());
        assert!(parse_ranks("5..3").is_err());
        assert!(parse_ranks("x").is_err());
    }

    #[test]
    fn algorithms_and_ops_parse() {
        assert!(matches!(parse_algo("all").unwrap(), AlgoSpec::All));
        assert!(matches!(parse_algo("my.json").unwrap(), AlgoSpec::File(_)));
        assert_eq!(parse_algo("ring,hd").unwrap().builtins().len(), 2);
        assert!(parse_algo("rung").unwrap_err().contains("ring"));
        assert_eq!(parse_ops("all").unwrap().0.len(), CollectiveKind::ALL.len());
        assert_eq!(parse_ops("all-reduce,broadcast").unwrap().0.len(), 2);
    }
}
