//! What a report says of the host it ran on: its name, system, CPU and
//! memory (`ferrocoll info` prints them; `bench -J` records them).

use std::collections::BTreeMap;

/// Name, system, CPU and memory, for a report.
pub(crate) fn summary() -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("name", ferrocoll::host::name()),
        ("os", os()),
        ("cpu", cpu()),
        ("memory", memory_total()),
    ])
}

/// The kernel's name and release.
pub(crate) fn os() -> String {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_owned());
    match (
        read("/proc/sys/kernel/ostype"),
        read("/proc/sys/kernel/osrelease"),
    ) {
        (Ok(t), Ok(r)) => format!("{t} {r}"),
        _ => std::env::consts::OS.to_owned(),
    }
}

/// The CPU's model, logical CPUs, and the vector extensions the host
/// kernels choose from.
pub(crate) fn cpu() -> String {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    };
    let model = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let logical = text.lines().filter(|l| l.starts_with("processor")).count();
    let flags = field("flags").unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let vector: Vec<&str> = ["avx512f", "avx2", "neon"]
        .into_iter()
        .filter(|f| has(f))
        .collect();
    format!(
        "{model}, {logical} logical CPUs{}",
        if vector.is_empty() {
            String::new()
        } else {
            format!(", {}", vector.join(" "))
        }
    )
}

/// Installed memory, GiB.
pub(crate) fn memory_total() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            let kb: f64 = t
                .lines()
                .find(|l| l.starts_with("MemTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(format!("{:.1} GiB", kb / f64::from(1u32 << 20)))
        })
        .unwrap_or_else(|| "size unknown".to_owned())
}
