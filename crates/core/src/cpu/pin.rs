//! Pinning rank threads to distinct CPUs, when there are enough.
//!
//! Ranks that spin while they wait need a core each. The OS scheduler
//! usually spreads them, but after a burst of other threads it can leave
//! two ranks on one core for tens of milliseconds, and every small call
//! then costs a spin and a reschedule. [`cpu::run`](super::run) pins rank
//! `r` to the `r`-th CPU this process may use, only when every rank gets a
//! CPU of its own.

/// The CPUs this thread may run on, in order (`None` where unknown).
pub(crate) fn allowed_cpus() -> Option<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `cpu_set_t` is plain data; zeroed is an empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: pid 0 is this thread; the size is the set's own.
        let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
        if r != 0 {
            return None;
        }
        let max = 8 * std::mem::size_of_val(&set);
        // SAFETY: `c < CPU_SETSIZE` by construction of `max`.
        Some(
            (0..max)
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect(),
        )
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Pin the calling thread to `cpu`; false if the OS refused.
pub(crate) fn pin_to(cpu: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: as above.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` came from `allowed_cpus`, below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut set) };
        // SAFETY: pid 0 is this thread; the set is initialised.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        false
    }
}

/// The CPU rank `rank` of `n` gets, when every rank can have its own.
pub(crate) fn cpu_for(allowed: Option<&[usize]>, rank: u32, n: u32) -> Option<usize> {
    let allowed = allowed?;
    (n as usize <= allowed.len()).then(|| allowed[rank as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_distinct_cpus_only_when_there_are_enough() {
        let cpus = [2, 5, 7];
        assert_eq!(cpu_for(Some(&cpus), 1, 3), Some(5));
        assert_eq!(cpu_for(Some(&cpus), 0, 4), None);
        assert_eq!(cpu_for(None, 0, 1), None);
        if let Some(mine) = allowed_cpus() {
            assert!(!mine.is_empty());
        }
    }
}
