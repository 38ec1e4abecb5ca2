//! How every GPU backend waits on the host for the device: spin first,
//! then sleep. A call that ends within the spin is seen the moment it
//! ends; only a long wait sleeps, so no timing reads a sleep's slack
//! (a poller that sleeps from the start — 10 µs doubling to 1 ms — made
//! calls of 0.5–5 ms read 10–40 % slow).

use std::time::{Duration, Instant};

/// Waits between polls of one wait.
#[derive(Debug, Clone)]
pub struct Poller {
    started: Instant,
    spin: Duration,
    sleep: Duration,
}

/// How a poller paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// Stayed on the CPU (the spin).
    Spun,
    /// Slept (past the spin).
    Slept,
}

impl Poller {
    /// How long a wait spins before it sleeps: longer than most calls a
    /// training step or a benchmark makes, short enough not to hold a
    /// core through long ones.
    pub const SPIN: Duration = Duration::from_millis(2);
    /// How long it sleeps between polls past the spin (NCCL's own wait
    /// polls at this period).
    pub const SLEEP: Duration = Duration::from_micros(20);

    /// A wait starting now.
    pub fn new() -> Poller {
        Poller::with(Poller::SPIN, Poller::SLEEP)
    }

    /// A wait with its own spin and sleep.
    pub fn with(spin: Duration, sleep: Duration) -> Poller {
        Poller {
            started: Instant::now(),
            spin,
            sleep,
        }
    }

    /// Pause before the next poll.
    pub fn pause(&mut self) -> Pause {
        if self.started.elapsed() < self.spin {
            std::hint::spin_loop();
            Pause::Spun
        } else {
            std::thread::sleep(self.sleep);
            Pause::Slept
        }
    }
}

impl Default for Poller {
    fn default() -> Self {
        Poller::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_spins_first_and_sleeps_only_past_the_spin() {
        let mut p = Poller::with(Duration::from_secs(3600), Duration::from_secs(3600));
        let t = Instant::now();
        assert!((0..1000).all(|_| p.pause() == Pause::Spun));
        assert!(t.elapsed() < Duration::from_secs(60), "it slept");
        let mut p = Poller::with(Duration::ZERO, Duration::from_millis(5));
        let t = Instant::now();
        assert_eq!(p.pause(), Pause::Slept);
        assert!(t.elapsed() >= Duration::from_millis(5));
        let mut p = Poller::with(Duration::from_millis(20), Duration::from_millis(1));
        let t = Instant::now();
        while p.pause() == Pause::Spun {}
        assert!(t.elapsed() >= Duration::from_millis(20));
    }
}
