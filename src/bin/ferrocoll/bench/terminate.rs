//! A rank of a group an MPI launcher started ends with a typed error when
//! the launcher ends the job. `mpirun` sends SIGTERM to every rank once
//! one has died or failed, and SIGKILL a moment later (a second, by
//! default) to any still running; a rank that catches the SIGTERM aborts
//! its group — its pending call returns the error, which the bench
//! prints — and exits at once, instead of dying mid-call without a word
//! or waiting in MPI's teardown for a peer that is gone.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use ferrocoll::process::AbortHandle;

/// The write end of the pipe the handler wakes the watcher through.
static WAKE: AtomicI32 = AtomicI32::new(-1);
/// The signal that came (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// How long the watcher gives the calling thread to report the error
/// before it reports it itself and ends the process: the thread may be
/// outside any call, or held inside MPI (OpenMPI's TCP transport, on a
/// peer that hung up, runs its own error path before returning).
const GRACE: Duration = Duration::from_millis(700);

#[cfg(unix)]
extern "C" fn on_signal(signal: libc::c_int) {
    // Only atomics and write(2): async-signal-safe.
    SIGNAL.store(signal, Ordering::SeqCst);
    let fd = WAKE.load(Ordering::SeqCst);
    if fd >= 0 {
        let byte = 1u8;
        // SAFETY: writing one byte from a live local to the pipe this
        // module opened and never closes.
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    }
}

/// The signal that ended the job, if one came.
pub(crate) fn terminated() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Abort the group of `rank` through `abort` when SIGTERM, SIGINT or
/// SIGHUP comes.
#[cfg(unix)]
pub(crate) fn abort_on_termination(rank: u32, abort: AbortHandle) -> Result<(), String> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe writes two descriptors into the array we own.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!(
            "a pipe for signals: {}",
            std::io::Error::last_os_error()
        ));
    }
    WAKE.store(fds[1], Ordering::SeqCst);
    let read_end = fds[0];
    std::thread::Builder::new()
        .name("ferrocoll-terminate".into())
        .spawn(move || watch(read_end, rank, abort))
        .map_err(|e| format!("a thread for signals: {e}"))?;
    crate::launch::signals::handle(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP], on_signal)?;
    Ok(())
}

#[cfg(not(unix))]
pub(crate) fn abort_on_termination(_rank: u32, _abort: AbortHandle) -> Result<(), String> {
    Ok(())
}

/// Wait for a signal, abort the group, and end the process if the calling
/// thread has not within [`GRACE`].
#[cfg(unix)]
fn watch(read_end: libc::c_int, rank: u32, abort: AbortHandle) {
    let mut byte = 0u8;
    loop {
        // SAFETY: reading one byte into a live local from the pipe's read
        // end, which only this thread uses.
        let n = unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            break;
        }
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return;
    }
    let signal = SIGNAL.load(Ordering::SeqCst);
    let reason = format!(
        "{} from the launcher, which ends every rank once one has failed or was killed \
         (mpirun does): this rank's call was cut short",
        name(signal)
    );
    abort.abort_because(&reason);
    std::thread::sleep(GRACE);
    // The calling thread did not report it in time: the same error, said here.
    eprintln!(
        "error: rank {rank}: rank {rank} failed: {reason} (reported by its signal watcher: the \
         rank was between calls, or held inside MPI, for {} ms)",
        GRACE.as_millis()
    );
    // `_exit`: the calling thread may be inside MPI, and exit handlers
    // running beside it could take its locks.
    // SAFETY: ends the process at once; nothing after it runs.
    unsafe { libc::_exit(128 + signal) };
}

fn name(signal: i32) -> &'static str {
    match signal {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}
