//! `SIGUSR1` dumps every recorder of the process: a user who suspects a
//! hang asks each rank what it is doing without stopping it.
//!
//! The handler only writes a byte to a pipe (all a signal handler may
//! safely do); a thread reading the pipe writes the dumps. Installed the
//! first time a recorder with a dump directory is made, and only then:
//! a program that sets `FERROCOLL_TRACE_DIR` hands `SIGUSR1` to ferrocoll.

use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A recorder that can write its dump where its dumps go.
pub(super) trait Dumps: Send + Sync {
    /// Write the dump now, saying why.
    fn dump_now(&self, reason: &str);
}

/// The recorders alive in this process.
static RECORDERS: Mutex<Vec<Weak<dyn Dumps>>> = Mutex::new(Vec::new());

pub(super) fn register(ring: &Arc<dyn Dumps>) {
    let mut all = RECORDERS.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|w| w.strong_count() > 0);
    all.push(Arc::downgrade(ring));
    drop(all);
    install();
}

/// Dump every live recorder where its dumps go.
fn dump_all() {
    let live: Vec<_> = RECORDERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for ring in live {
        ring.dump_now("SIGUSR1");
    }
}

#[cfg(target_os = "linux")]
fn install() {
    use std::sync::atomic::{AtomicI32, Ordering};
    static WRITE_END: AtomicI32 = AtomicI32::new(-1);
    static INSTALLED: OnceLock<()> = OnceLock::new();

    extern "C" fn on_signal(_: libc::c_int) {
        let fd = WRITE_END.load(Ordering::Relaxed);
        if fd >= 0 {
            let byte = 1u8;
            // SAFETY: write(2) is async-signal-safe; one byte from a
            // local into the pipe's write end (a full pipe drops it).
            unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
        }
    }

    INSTALLED.get_or_init(|| {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two descriptors of the array we own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            tracing::warn!("flight recorder: no pipe for SIGUSR1");
            return;
        }
        // The reader blocks; only the handler's end must never block.
        // SAFETY: fcntl on a descriptor this function just opened.
        unsafe { libc::fcntl(fds[0], libc::F_SETFL, 0) };
        WRITE_END.store(fds[1], Ordering::Relaxed);
        let reader = fds[0];
        let spawned = std::thread::Builder::new()
            .name("ferrocoll-sigusr1".into())
            .spawn(move || {
                let mut byte = 0u8;
                // SAFETY: read(2) into a local byte from the pipe's read
                // end, which this thread alone reads.
                while unsafe { libc::read(reader, (&raw mut byte).cast(), 1) } > 0 {
                    dump_all();
                }
            });
        if spawned.is_err() {
            tracing::warn!("flight recorder: no thread for SIGUSR1");
            return;
        }
        // SAFETY: a zeroed sigaction with a handler that only calls
        // write(2); SA_RESTART keeps interrupted system calls going.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut());
        }
    });
}

#[cfg(not(target_os = "linux"))]
fn install() {}
