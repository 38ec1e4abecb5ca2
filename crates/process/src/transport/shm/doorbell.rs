//! Sleeping on a word of shared memory until another process changes it.
//!
//! On Linux this is a futex on the shared mapping (not the private kind,
//! which works only within one process), so a waiter costs no CPU and
//! wakes within microseconds of a ring. Elsewhere the waiter naps briefly.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A doorbell word and the count of processes asleep on it.
pub(crate) struct Bell<'a> {
    pub word: &'a AtomicU32,
    pub sleepers: &'a AtomicU32,
}

/// Ring: bump the word and wake every process sleeping on it. A sleeper
/// counts itself before it looks at the word and the ringer bumps the word
/// before it looks at the count (both sequentially consistent), so either
/// the ringer sees the sleeper or the sleeper sees the new value: no wake
/// is lost, and a ring nobody sleeps through costs no system call.
pub(crate) fn ring(bell: Bell<'_>) {
    bell.word.fetch_add(1, Ordering::SeqCst);
    if bell.sleepers.load(Ordering::SeqCst) > 0 {
        wake(bell.word);
    }
}

/// Sleep while the word still reads `seen`, at most `limit`.
pub(crate) fn sleep(bell: Bell<'_>, seen: u32, limit: Duration) {
    bell.sleepers.fetch_add(1, Ordering::SeqCst);
    if bell.word.load(Ordering::SeqCst) == seen {
        wait(bell.word, seen, limit);
    }
    bell.sleepers.fetch_sub(1, Ordering::SeqCst);
}

#[cfg(target_os = "linux")]
fn wait(word: &AtomicU32, seen: u32, limit: Duration) {
    let ts = libc::timespec {
        tv_sec: limit.as_secs() as libc::time_t,
        tv_nsec: limit.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 32-bit word; FUTEX_WAIT only reads
    // it and returns at once if it no longer holds `seen`. Spurious
    // returns (EINTR, EAGAIN, ETIMEDOUT) are fine: callers re-check.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(target_os = "linux")]
fn wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live, aligned word touches no memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn wait(_word: &AtomicU32, _seen: u32, limit: Duration) {
    std::thread::sleep(limit.min(Duration::from_micros(50)));
}

#[cfg(not(target_os = "linux"))]
fn wake(_word: &AtomicU32) {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Two threads hand a turn back and forth through each other's bell,
    /// each sleeping (no spinning) until its own rings. A lost wake-up
    /// would leave one asleep until its limit: every hand-off must come
    /// far sooner.
    #[test]
    fn no_ring_is_lost_between_a_sleeper_counting_itself_and_a_ringer() {
        const ROUNDS: u32 = 20_000;
        const LIMIT: Duration = Duration::from_secs(2);
        let words: [AtomicU32; 4] = Default::default();
        let bell = |i: usize| Bell {
            word: &words[2 * i],
            sleepers: &words[2 * i + 1],
        };
        let worst = std::thread::scope(|s| {
            let side = |me: usize| {
                let (bell, words) = (&bell, &words);
                s.spawn(move || {
                    let mut worst = Duration::ZERO;
                    for round in 0..ROUNDS {
                        if (round % 2 == 0) == (me == 0) {
                            ring(bell(1 - me));
                            continue;
                        }
                        let t = Instant::now();
                        // The peer rang once in every round before this
                        // one that was its turn, and now.
                        let rung = round / 2 + 1;
                        // One load serves as both the check and the
                        // ticket to sleep on, as the transport takes its
                        // ticket before it looks: a second load could
                        // see the ring the first missed and sleep past it.
                        loop {
                            let ticket = words[2 * me].load(Ordering::SeqCst);
                            if ticket >= rung {
                                break;
                            }
                            sleep(bell(me), ticket, LIMIT);
                        }
                        worst = worst.max(t.elapsed());
                    }
                    worst
                })
            };
            let (a, b) = (side(0), side(1));
            a.join().unwrap().max(b.join().unwrap())
        });
        assert!(worst < LIMIT / 2, "a hand-off waited {worst:?}");
        assert_eq!(words[1].load(Ordering::SeqCst), 0, "sleepers counted out");
        assert_eq!(words[3].load(Ordering::SeqCst), 0, "sleepers counted out");
    }
}
