//! Setup waits — on the store, on TCP connections — that notice a peer
//! process exiting within about [`LOOK_EVERY`], instead of waiting out
//! the whole timeout for a key the dead rank will never set or a
//! connection it will never make.
//!
//! Each rank publishes its pid with the identity of its pid namespace
//! (the kernel's boot id and the namespace's inode): only peers in the
//! same namespace are watched, since a pid means nothing on another host
//! or in another container. Peers elsewhere are noticed by the store or
//! the connection timeout, as before.

use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_rendezvous::{Store, StoreError};

use super::SetupError;
use crate::transport::shm::liveness;

/// How often a waiting rank looks at its peers' processes.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// What the store says of a peer's process.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// Not published yet.
    Unknown,
    /// In another pid namespace: cannot be watched.
    Elsewhere,
    /// This pid, in our namespace.
    Pid(u32),
}

/// The peers' process ids as they appear in the store.
pub(super) struct Watch {
    rank: Rank,
    pids: Vec<Peer>,
    /// Our pid namespace's identity, `None` where it cannot be read (then
    /// nobody is watched).
    here: Option<String>,
    timeout: Duration,
    /// When the whole formation must be done: one timeout for all its
    /// waits, not one per wait.
    deadline: Instant,
    last_look: Option<Instant>,
}

impl Watch {
    /// Publish this process's id, then watch every peer's.
    pub fn start(
        store: &mut Store,
        rank: Rank,
        world_size: u32,
        timeout: Duration,
    ) -> Result<Watch, SetupError> {
        let here = namespace();
        let published = format!("{} {}", std::process::id(), here.as_deref().unwrap_or("-"));
        store.set(&pid_key(rank), published.as_bytes())?;
        Ok(Watch {
            rank,
            pids: vec![Peer::Unknown; world_size as usize],
            here,
            timeout,
            deadline: Instant::now() + timeout,
            last_look: None,
        })
    }

    /// When the formation must be done.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// `Err` once a peer that published its pid is no longer running
    /// (looking at most every [`LOOK_EVERY`]).
    pub fn check(&mut self, store: &mut Store, during: &str) -> Result<(), SetupError> {
        if self.last_look.is_some_and(|t| t.elapsed() < LOOK_EVERY) {
            return Ok(());
        }
        self.last_look = Some(Instant::now());
        for peer in (0..self.pids.len() as Rank).filter(|&p| p != self.rank) {
            if self.pids[peer as usize] == Peer::Unknown
                && let Some(v) = store.get(&pid_key(peer))?
            {
                self.pids[peer as usize] = self.parse(&v);
            }
            if let Peer::Pid(pid) = self.pids[peer as usize]
                && !liveness::alive(pid)
            {
                let (rank, pid) = self.first_exit(store, peer, pid);
                return Err(SetupError::PeerExited {
                    rank,
                    pid,
                    during: during.to_owned(),
                });
            }
        }
        Ok(())
    }

    /// A peer's published "pid namespace", as something to watch.
    fn parse(&self, v: &[u8]) -> Peer {
        let text = String::from_utf8_lossy(v);
        let (pid, ns) = text.split_once(' ').unwrap_or((&text, ""));
        match (pid.parse(), self.here.as_deref()) {
            (Ok(pid), Some(here)) if ns == here => Peer::Pid(pid),
            _ => Peer::Elsewhere,
        }
    }

    /// The rank whose exit started it all: a peer that gave up because
    /// another exited says so in the store before it exits, so every
    /// survivor names the same, first culprit rather than whichever exit
    /// it happened to see first.
    fn first_exit(&self, store: &mut Store, mut rank: Rank, mut pid: u32) -> (Rank, u32) {
        for _ in 0..self.pids.len() {
            let cause = store
                .get(&cause_key(rank))
                .ok()
                .flatten()
                .and_then(|v| v.try_into().ok().map(u64::from_le_bytes));
            let Some(cause) = cause else { break };
            let (next, next_pid) = ((cause >> 32) as Rank, cause as u32);
            if next == self.rank || next as usize >= self.pids.len() {
                break;
            }
            (rank, pid) = (next, next_pid);
        }
        (rank, pid)
    }

    /// The root cause of a failed setup: a peer that removed the group's
    /// segments because another rank exited makes this rank's open fail
    /// with "no such file", and the exit is what the user needs to read.
    pub fn explain(&mut self, store: &mut Store, err: SetupError) -> SetupError {
        // A refusal every rank reaches alike is its own cause: peers that
        // exited after it did so for the same reason.
        if matches!(
            err,
            SetupError::PeerExited { .. } | SetupError::NotOneHost { .. }
        ) {
            return err;
        }
        self.last_look = None;
        match self.check(store, "while this rank formed the group") {
            Err(exited @ SetupError::PeerExited { .. }) => exited,
            _ => err,
        }
    }

    /// Tell the peers that this rank gives up because `err`'s peer exited.
    pub fn record_cause(&self, store: &mut Store, err: &SetupError) {
        if let SetupError::PeerExited { rank, pid, .. } = err {
            let cause = (u64::from(*rank) << 32) | u64::from(*pid);
            let _ = store.set(&cause_key(self.rank), &cause.to_le_bytes());
        }
    }

    /// The value of `key`, waiting for it while every peer still runs.
    pub fn wait(&mut self, store: &mut Store, key: &str) -> Result<Vec<u8>, SetupError> {
        self.until(store, &format!("waiting for `{key}`"), key, |s| s.get(key))
    }

    /// Wait until every rank has called `barrier(name)`.
    pub fn barrier(&mut self, store: &mut Store, name: &str) -> Result<(), SetupError> {
        let key = format!("barrier/{name}");
        store.add(&key, 1)?;
        let n = self.pids.len() as i64;
        self.until(store, &format!("at barrier `{name}`"), &key, |s| {
            Ok((s.add(&key, 0)? >= n).then(Vec::new))
        })
        .map(|_| ())
    }

    fn until(
        &mut self,
        store: &mut Store,
        during: &str,
        key: &str,
        mut ready: impl FnMut(&mut Store) -> Result<Option<Vec<u8>>, StoreError>,
    ) -> Result<Vec<u8>, SetupError> {
        let deadline = self.deadline;
        let mut pause = Duration::from_micros(200);
        loop {
            if let Some(v) = ready(store)? {
                return Ok(v);
            }
            if let Err(exited) = self.check(store, during) {
                // A peer may have passed this point and exited between our
                // look at the store and at its process (a rank preempted
                // that long on a busy host): what it left behind counts;
                // its exit is then the first call's business.
                return match ready(store)? {
                    Some(v) => Ok(v),
                    None => Err(exited),
                };
            }
            if Instant::now() >= deadline {
                return Err(SetupError::Store(StoreError::Timeout {
                    key: key.to_owned(),
                    timeout: self.timeout,
                }));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }
}

/// This process's pid namespace: the boot id (one per running kernel) and
/// the namespace's inode; `None` where either cannot be read.
fn namespace() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some(format!("{}/{}", boot.trim(), ns.display()).replace(' ', "_"))
}

fn cause_key(rank: Rank) -> String {
    format!("pg/exit-cause/{rank}")
}

fn pid_key(rank: Rank) -> String {
    format!("pg/pid/{rank}")
}
