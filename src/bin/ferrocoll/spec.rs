//! Parsing of what the commands share: the algorithm spec (`--algo`),
//! collectives, rank ranges, sizes and counts.

use std::path::PathBuf;

use ferrocoll::{Algorithm, CollectiveKind};

/// What `--algo` names, for `bench`, `sim`, `verify` and `plan` alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AlgoSpec {
    /// Let the selector decide per call (`auto`).
    Auto,
    /// Every built-in algorithm (`all`).
    All,
    /// Some built-in algorithms (`ring`, `ring,tree`, ...).
    Builtin(Vec<Algorithm>),
    /// A schedule file (`FILE.json`, or MSCCL's `FILE.xml`).
    File(PathBuf),
}

/// `auto`, `all`, a comma-separated list of algorithms, or a schedule file.
pub(crate) fn parse_algo(s: &str) -> Result<AlgoSpec, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(AlgoSpec::All);
    }
    if s.eq_ignore_ascii_case("auto") {
        return Ok(AlgoSpec::Auto);
    }
    let path = PathBuf::from(s);
    if s.ends_with(".json") || s.ends_with(".xml") || path.is_file() {
        return Ok(AlgoSpec::File(path));
    }
    s.split(',')
        .map(|a| a.trim().parse::<Algorithm>().map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()
        .map(AlgoSpec::Builtin)
}

impl AlgoSpec {
    /// The built-in algorithms named (`auto` and a file name none).
    pub(crate) fn builtins(&self) -> Vec<Algorithm> {
        match self {
            AlgoSpec::All => Algorithm::ALL.to_vec(),
            AlgoSpec::Builtin(list) => list.clone(),
            AlgoSpec::Auto | AlgoSpec::File(_) => Vec::new(),
        }
    }

    /// The schedule file, if one is named.
    pub(crate) fn file(&self) -> Option<&PathBuf> {
        match self {
            AlgoSpec::File(p) => Some(p),
            _ => None,
        }
    }
}

impl std::fmt::Display for AlgoSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AlgoSpec::Auto => f.write_str("auto"),
            AlgoSpec::All => f.write_str("all"),
            AlgoSpec::Builtin(list) => {
                let names: Vec<&str> = list.iter().map(|a| a.name()).collect();
                f.write_str(&names.join(","))
            }
            AlgoSpec::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A size or count, for every command: `4096`; `4K`, `64M`, `1G` (binary
/// multiples, as nccl-tests; either case); `512KiB`, `10GiB` (binary);
/// `1.5MB`, `10GB` (decimal, as the seed article's 10 GB of gradients).
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    const UNITS: [(&str, u64); 10] = [
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("KB", 1_000),
        ("kB", 1_000),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    let bad = || format!("`{s}` is not a size (e.g. 4096, 4K, 64M, 512KiB, 10GB)");
    let t = s.trim();
    let (number, scale) = UNITS
        .iter()
        .find_map(|&(u, k)| {
            t.strip_suffix(u)
                .or_else(|| {
                    (u.len() == 1)
                        .then(|| t.strip_suffix(&u.to_lowercase()))
                        .flatten()
                })
                .map(|n| (n, k))
        })
        .or_else(|| t.strip_suffix('B').map(|n| (n, 1)))
        .unwrap_or((t, 1));
    let number = number.trim();
    if let Ok(whole) = number.parse::<u64>() {
        return whole
            .checked_mul(scale)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(bad);
    }
    let v: f64 = number.parse().map_err(|_| bad())?;
    let bytes = v * scale as f64;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < usize::MAX as f64) {
        return Err(bad());
    }
    Ok(bytes.round() as usize)
}

/// `min, min·factor, …` up to `max`, stopping before an overflow.
pub(crate) fn sizes(min: usize, max: usize, factor: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = Some(min.max(1));
    while let Some(size) = s.filter(|&v| v <= max) {
        out.push(size);
        s = size.checked_mul(factor);
    }
    out
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

/// Most world sizes one `--ranks` list may name: a range is expanded, so
/// `1..4294967295` must be refused, not allocated.
pub(crate) const MAX_LISTED_WORLD_SIZES: usize = 4096;

/// World sizes: `8`, `1..64` or `1..=64` (both inclusive), or a
/// comma-separated mix such as `1..8,16,32`; at most
/// [`MAX_LISTED_WORLD_SIZES`] of them.
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
            let listed = (hi - lo) as usize + 1;
            if out.len().saturating_add(listed) > MAX_LISTED_WORLD_SIZES {
                return Err(format!(
                    "--ranks `{s}` names more than {MAX_LISTED_WORLD_SIZES} world sizes"
                ));
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
        let err = parse_ranks("1..4294967295").unwrap_err();
        assert!(err.contains("more than 4096"), "{err}");
        assert_eq!(parse_ranks("1..4096").unwrap().0.len(), 4096);
    }

    #[test]
    fn algorithms_and_ops_parse() {
        assert!(matches!(parse_algo("all").unwrap(), AlgoSpec::All));
        assert_eq!(parse_algo("AUTO").unwrap(), AlgoSpec::Auto);
        assert_eq!(parse_algo("ring,tree").unwrap().to_string(), "ring,tree");
        assert!(matches!(parse_algo("my.json").unwrap(), AlgoSpec::File(_)));
        assert_eq!(parse_algo("ring,hd").unwrap().builtins().len(), 2);
        assert!(parse_algo("rung").unwrap_err().contains("ring"));
        assert_eq!(parse_ops("all").unwrap().0.len(), CollectiveKind::ALL.len());
        assert_eq!(parse_ops("all-reduce,broadcast").unwrap().0.len(), 2);
    }

    #[test]
    fn sizes_parse_and_step() {
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("64m").unwrap(), 64 << 20);
        assert!(parse_size("lots").is_err());
        assert_eq!(sizes(4096, 16384, 2), vec![4096, 8192, 16384]);
        assert_eq!(sizes(1 << 62, usize::MAX, 2).len(), 2);
        assert!(parse_size("99999999999999999G").is_err());
        assert_eq!(parse_size("10GB").unwrap(), 10_000_000_000);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5MB").unwrap(), 1_500_000);
        assert_eq!(parse_size("512B").unwrap(), 512);
        assert!(parse_size("-1GB").is_err());
        assert!(parse_size("1e400GB").is_err());
    }
}
