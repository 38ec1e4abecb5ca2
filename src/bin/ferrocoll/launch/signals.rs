//! The signals the launcher forwards to its ranks: SIGINT, SIGTERM and
//! SIGHUP. A handler only records the signal; the supervising loop reads
//! it and forwards it to every rank's process group (the ranks lead their
//! own groups, so a terminal's Ctrl-C reaches only the launcher).

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// The last signal received (0: none yet).
static LAST: AtomicI32 = AtomicI32::new(0);
/// Signals received so far: a second Ctrl-C kills at once.
static COUNT: AtomicU32 = AtomicU32::new(0);

#[cfg(unix)]
extern "C" fn record(signal: libc::c_int) {
    // Only atomics: async-signal-safe.
    LAST.store(signal, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
}

/// Install the handlers (before any rank starts, so no signal is lost).
pub(crate) fn install() -> Result<(), String> {
    #[cfg(unix)]
    handle(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP], record)?;
    Ok(())
}

/// Replace the disposition of `signals` by `handler`, which must be
/// async-signal-safe (atomics, `write(2)`).
#[cfg(unix)]
pub(crate) fn handle(signals: &[i32], handler: extern "C" fn(libc::c_int)) -> Result<(), String> {
    for &signal in signals {
        // SAFETY: a zeroed sigaction with a handler the caller vouches is
        // async-signal-safe, for signals whose default it replaces on purpose.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(format!(
                "cannot handle signal {signal}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// The last signal received and how many arrived, if any did.
pub(crate) fn received() -> Option<(i32, u32)> {
    match LAST.load(Ordering::SeqCst) {
        0 => None,
        s => Some((s, COUNT.load(Ordering::SeqCst))),
    }
}

/// A signal's name, for messages.
pub(crate) fn name(signal: i32) -> String {
    #[cfg(unix)]
    match signal {
        libc::SIGINT => return "SIGINT".into(),
        libc::SIGTERM => return "SIGTERM".into(),
        libc::SIGHUP => return "SIGHUP".into(),
        libc::SIGKILL => return "SIGKILL".into(),
        _ => {}
    }
    format!("signal {signal}")
}

/// Send `signal` to process `pid` alone (a rank, not what it started).
pub(crate) fn send(pid: u32, signal: i32) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: signalling a child this launcher started and has not
        // reaped yet (so the pid is still its); no memory is involved.
        unsafe {
            libc::kill(pid, signal);
        }
    }
    #[cfg(not(unix))]
    let _ = (pid, signal);
}

/// Send `signal` to the process group `pid` leads (and to `pid` itself).
pub(crate) fn send_group(pid: u32, signal: i32) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: signalling a process group this launcher created for its
        // child (the child's pid is the group id); no memory is involved.
        unsafe {
            libc::kill(-pid, signal);
            libc::kill(pid, signal);
        }
    }
    #[cfg(not(unix))]
    let _ = (pid, signal);
}
