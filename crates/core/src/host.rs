//! Facts about this host that every crate must name alike: a dump, a log
//! file, a host key and a launcher's card all say the same host name.

/// This host's name (the UTS namespace's, `/proc/sys/kernel/hostname`,
/// what `hostname` prints); `localhost` where the system gives none.
pub fn name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
