//! Which stores a long write takes, from how many bytes pass through the
//! cache before its destination is read again: cached while that fits a
//! share of the last-level cache (the reader finds the lines there),
//! non-temporal past it (the lines would be evicted unread, and streaming
//! them skips the read-for-ownership of every destination line, a third
//! of the traffic).
//!
//! The size of the cache is read from the system (Linux: sysfs), so the
//! rule is the same on every rank of a host and in every run — unlike a
//! timing of each kind of store on arrays that fit the cache, which can
//! pick cached stores there and lose at DRAM sizes (issue 31's runs A and
//! B, a minute apart, on one host).

use std::path::Path;
use std::sync::OnceLock;

use super::variant::Stores;

/// The share of the last-level cache a call's bytes may take and still
/// be read back from it: the caller's other data, the other ranks' and
/// the pages' tables compete for the rest, so a working set at the full
/// size is mostly evicted before it is read.
pub const LLC_SHARE: f64 = 0.5;

/// What the rule assumes when the system does not say (no sysfs, a
/// container that hides it): 8 MiB, the smallest last-level cache of a
/// current server core complex, so a large call still streams.
pub const ASSUMED_LLC_BYTES: u64 = 8 << 20;

/// The rule: stores by the bytes written before the destination is read
/// again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreRule {
    /// The last-level cache, bytes.
    pub llc_bytes: u64,
    /// Whether the system said so (false: [`ASSUMED_LLC_BYTES`]).
    pub measured: bool,
}

impl StoreRule {
    /// The rule for a last-level cache of `llc_bytes`.
    pub fn new(llc_bytes: u64) -> StoreRule {
        StoreRule {
            llc_bytes,
            measured: true,
        }
    }

    /// Past this many bytes, stores are non-temporal.
    pub fn threshold(&self) -> u64 {
        (self.llc_bytes as f64 * LLC_SHARE) as u64
    }

    /// The stores for a destination read again after `bytes` more bytes
    /// have passed through the cache.
    pub fn stores(&self, bytes: u64) -> Stores {
        if bytes > self.threshold() {
            Stores::NonTemporal
        } else {
            Stores::Cached
        }
    }

    /// This host's rule, read once.
    pub fn host() -> StoreRule {
        static RULE: OnceLock<StoreRule> = OnceLock::new();
        *RULE.get_or_init(|| {
            match last_level_cache(Path::new("/sys/devices/system/cpu/cpu0/cache")) {
                Some(bytes) => StoreRule::new(bytes),
                None => StoreRule {
                    llc_bytes: ASSUMED_LLC_BYTES,
                    measured: false,
                },
            }
        })
    }
}

impl std::fmt::Display for StoreRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        write!(
            f,
            "stores non-temporal past {:.0} MiB of a call's bytes ({:.0}% of the {:.0} MiB last-level cache{}), cached below",
            mib(self.threshold()),
            LLC_SHARE * 100.0,
            mib(self.llc_bytes),
            if self.measured {
                ""
            } else {
                ", assumed: the system does not say"
            }
        )
    }
}

/// The largest data or unified cache level under `dir` (sysfs's
/// `cpu0/cache`: `index*/{level,type,size}`), in bytes.
pub fn last_level_cache(dir: &Path) -> Option<u64> {
    let mut best: Option<(u32, u64)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |name: &str| std::fs::read_to_string(entry.path().join(name)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if kind.trim() == "Instruction" {
            continue;
        }
        let (Ok(level), Some(bytes)) = (level.trim().parse::<u32>(), parse_size(size.trim()))
        else {
            continue;
        };
        if best.is_none_or(|(l, b)| (level, bytes) > (l, b)) {
            best = Some((level, bytes));
        }
    }
    best.map(|(_, bytes)| bytes).filter(|&b| b > 0)
}

/// sysfs's `32768K`, `1024K`, `8M`.
fn parse_size(text: &str) -> Option<u64> {
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = digits.parse().ok()?;
    let scale = match unit.trim() {
        "" => 1,
        "K" | "KB" | "KiB" => 1 << 10,
        "M" | "MB" | "MiB" => 1 << 20,
        "G" | "GB" | "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule: a 32 MiB cache streams past 16 MiB of a call's bytes;
    /// an 8 MiB one past 4 MiB — the same call streams on one host and
    /// not on the other.
    #[test]
    fn stores_follow_the_working_set_against_the_cache() {
        let big = StoreRule::new(32 << 20);
        assert_eq!(big.threshold(), 16 << 20);
        assert_eq!(big.stores(16 << 20), Stores::Cached);
        assert_eq!(big.stores((16 << 20) + 1), Stores::NonTemporal);
        assert_eq!(big.stores(256 << 20), Stores::NonTemporal);
        assert_eq!(big.stores(4 << 10), Stores::Cached);
        let small = StoreRule::new(8 << 20);
        assert_eq!(small.stores(8 << 20), Stores::NonTemporal);
        assert_eq!(big.stores(8 << 20), Stores::Cached);
        assert!(big.to_string().contains("16 MiB"), "{big}");
    }

    #[test]
    fn the_last_level_cache_is_the_largest_data_level_in_sysfs() {
        let dir = std::env::temp_dir().join(format!("ferrocoll-llc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (i, (level, kind, size)) in [
            (1, "Data", "48K"),
            (1, "Instruction", "64M"),
            (2, "Unified", "1024K"),
            (3, "Unified", "32768K"),
        ]
        .into_iter()
        .enumerate()
        {
            let d = dir.join(format!("index{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        assert_eq!(last_level_cache(&dir), Some(32 << 20));
        std::fs::write(dir.join("index3/size"), "garbage").unwrap();
        assert_eq!(last_level_cache(&dir), Some(1 << 20));
        assert_eq!(last_level_cache(Path::new("/no/such/dir")), None);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(parse_size("8M"), Some(8 << 20));
        assert_eq!(parse_size("12"), Some(12));
        assert_eq!(parse_size("1T"), None);
        assert!(StoreRule::host().llc_bytes > 0);
    }
}
