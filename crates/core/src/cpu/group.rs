//! State shared by the ranks of one CPU group: link queues with bounded
//! slots and traffic counters, per-rank doorbells, the failure flag, the
//! call board and the group's planner.

use std::cell::UnsafeCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::Instant;

use crate::comm::CommError;
use crate::flow::Link;
use crate::plan::{CallShape, LinkLoad, Planned, Planner};
use crate::types::Rank;

/// Byte ranges of some rank's memory: (address, length).
pub(crate) type Extents = Vec<(usize, usize)>;

/// A message on a link.
#[derive(Debug, Clone)]
pub(crate) enum Msg {
    /// The value sits in the sender's memory, which stays unchanged until
    /// the message is popped.
    Pointer(Extents),
    /// The value sits in this link's slot buffer `index`.
    Slot { index: usize, bytes: usize },
    /// The sender wrote the value straight into the receiver's posted destination.
    Written,
}

#[derive(Debug, Default)]
pub(crate) struct LinkState {
    pub queue: VecDeque<Msg>,
    /// Messages ever pushed. Within a call, the plan's message `k` of the
    /// link uses slot buffer `k % slots`: every sender drains its links
    /// before its call returns, so a call starts with the link empty.
    pub pushed: u64,
    /// Messages ever consumed by the receiver.
    pub popped: u64,
    /// Where the receiver wants message number `.0` written: the sender of
    /// exactly that message may write the value there itself.
    pub posted: Option<(u64, Extents)>,
    /// Messages and bytes moved over the link, counted where the data
    /// moves; `None` until the first message.
    pub traffic: Option<LinkLoad>,
}

/// A slot buffer. Written only by the link's sender while the slot is free,
/// read only by its receiver while the message that names it is queued.
/// Backed by `u64`s so it is aligned for every element type.
pub(crate) struct SlotBuffer(UnsafeCell<Vec<u64>>);

// SAFETY: access follows the slot protocol above: the sender writes a slot
// only when fewer than `slots` messages are queued, and those are the
// call's messages numbered just below it (the link was empty when the call
// began), so no queued message names that slot; the receiver reads a slot
// only while its message is queued; the link mutex orders the two.
unsafe impl Sync for SlotBuffer {}

impl SlotBuffer {
    /// # Safety
    /// The caller is the link's sender and the slot is free (see the type's docs).
    pub(crate) unsafe fn prepare(&self, bytes: usize) -> usize {
        // SAFETY: exclusive by the caller's contract.
        let v = unsafe { &mut *self.0.get() };
        let words = bytes.div_ceil(8);
        if v.len() < words {
            v.resize(words, 0);
        }
        v.as_mut_ptr() as usize
    }

    pub(crate) fn address(&self) -> usize {
        // SAFETY: reading the pointer value only; the vector is not resized
        // while a message names this slot.
        unsafe { (*self.0.get()).as_ptr() as usize }
    }
}

/// One link's queue and slot buffers.
pub(crate) struct LinkQueue {
    /// Which link it is.
    pub link: Link,
    pub state: Mutex<LinkState>,
    pub slots: Vec<SlotBuffer>,
}

impl LinkState {
    /// Count a message of `bytes` moved over the link.
    pub fn count(&mut self, link: Link, bytes: usize) {
        self.traffic
            .get_or_insert(LinkLoad::new(link))
            .count(bytes as u64);
    }
}

struct Bell {
    generation: Mutex<u64>,
    /// A copy of `generation` for waiters that spin before they sleep.
    ticks: AtomicU64,
    changed: Condvar,
}

/// How long a waiter spins before sleeping, when every rank has a core of
/// its own: a wake-up through the kernel costs tens of microseconds, which
/// dominates small collectives.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

#[derive(Debug, Clone)]
struct Failure {
    rank: Rank,
    reason: String,
}

/// What each rank called, per call number, to catch mismatches.
#[derive(Default)]
struct CallBoard {
    calls: HashMap<u64, (Rank, String, u32)>,
}

pub(crate) struct Group {
    pub n: u32,
    pub slots: usize,
    /// Spin before sleeping (only when ranks do not outnumber cores).
    spin: bool,
    bells: Vec<Bell>,
    links: Mutex<HashMap<Link, Arc<LinkQueue>>>,
    failed: AtomicBool,
    failure: Mutex<Option<Failure>>,
    board: Mutex<CallBoard>,
    /// The group's one planner: the first rank to need a plan builds it,
    /// the others wait for that (finite) computation rather than repeat it.
    planner: Mutex<Planner>,
    barrier: Mutex<(u64, u32)>,
    /// Held for reading while a rank touches another rank's memory (pointer
    /// reads, direct writes); a rank that gives up takes it for writing
    /// once, after failing the group, so no peer is still inside its
    /// buffers when it returns.
    movement: RwLock<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking rank never holds these locks across user code, and the
    // data stays consistent; keep going with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Group {
    pub fn new(n: u32, slots: usize, planner: Planner) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        Group {
            n,
            slots,
            spin: n as usize <= cores,
            bells: (0..n)
                .map(|_| Bell {
                    generation: Mutex::new(0),
                    ticks: AtomicU64::new(0),
                    changed: Condvar::new(),
                })
                .collect(),
            links: Mutex::new(HashMap::new()),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            board: Mutex::new(CallBoard::default()),
            planner: Mutex::new(planner),
            barrier: Mutex::new((0, 0)),
            movement: RwLock::new(()),
        }
    }

    /// The plan of a call, shared by every rank.
    pub fn plan(&self, shape: &CallShape) -> Result<Planned, CommError> {
        lock(&self.planner).plan(shape)
    }

    /// Every link that carried a message, with what it carried.
    pub fn traffic(&self) -> Vec<LinkLoad> {
        let mut out: Vec<LinkLoad> = lock(&self.links)
            .values()
            .filter_map(|q| lock(&q.state).traffic)
            .collect();
        out.sort_by_key(|l| l.link);
        out
    }

    pub fn link(&self, from: Rank, to: Rank, channel: u32) -> Arc<LinkQueue> {
        let slots = self.slots;
        lock(&self.links)
            .entry(Link { from, to, channel })
            .or_insert_with(|| {
                Arc::new(LinkQueue {
                    link: Link { from, to, channel },
                    state: Mutex::new(LinkState::default()),
                    slots: (0..slots)
                        .map(|_| SlotBuffer(UnsafeCell::new(Vec::new())))
                        .collect(),
                })
            })
            .clone()
    }

    pub fn lock_link<'a>(&self, link: &'a LinkQueue) -> MutexGuard<'a, LinkState> {
        lock(&link.state)
    }

    pub fn generation(&self, rank: Rank) -> u64 {
        self.bells[rank as usize].ticks.load(Ordering::Acquire)
    }

    pub fn ring(&self, rank: Rank) {
        let bell = &self.bells[rank as usize];
        {
            let mut g = lock(&bell.generation);
            *g += 1;
            bell.ticks.store(*g, Ordering::Release);
        }
        bell.changed.notify_all();
    }

    /// Sleep until `rank`'s bell rings past `seen`, the group fails, or `deadline`.
    pub fn wait(
        &self,
        rank: Rank,
        seen: u64,
        deadline: Instant,
        what: impl Fn() -> String,
        timeout: std::time::Duration,
    ) -> Result<(), CommError> {
        let bell = &self.bells[rank as usize];
        let until = Instant::now() + SPIN;
        let mut spins = 0u32;
        while bell.ticks.load(Ordering::Acquire) == seen {
            if self.spin {
                std::hint::spin_loop();
            } else {
                // More ranks than cores: hand the core to a peer that can
                // make progress instead of burning it.
                std::thread::yield_now();
            }
            spins += 1;
            if spins % 64 == 0 && Instant::now() >= until {
                break;
            }
        }
        let mut generation = lock(&bell.generation);
        while *generation == seen {
            self.check()?;
            let now = Instant::now();
            if now >= deadline {
                drop(generation);
                let err = CommError::Timeout {
                    rank,
                    timeout,
                    what: what(),
                };
                self.fail(rank, &err);
                return Err(err);
            }
            generation = bell
                .changed
                .wait_timeout(generation, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// Mark the group failed (first failure wins) and wake every rank.
    pub fn fail(&self, rank: Rank, err: &dyn std::fmt::Display) {
        {
            let mut f = lock(&self.failure);
            if f.is_none() {
                *f = Some(Failure {
                    rank,
                    reason: err.to_string(),
                });
            }
        }
        self.failed.store(true, Ordering::SeqCst);
        for r in 0..self.n {
            self.ring(r);
        }
    }

    /// Enter a stretch of work on shared memory; `Err` if the group has
    /// failed (then nothing may be touched).
    pub fn begin_movement(&self) -> Result<RwLockReadGuard<'_, ()>, CommError> {
        let guard = self.movement.read().unwrap_or_else(|e| e.into_inner());
        self.check()?;
        Ok(guard)
    }

    /// After this rank failed the group (or saw it failed): wait until no
    /// rank is inside a stretch of work that could still touch this
    /// rank's memory. Later stretches see the failure and touch nothing.
    pub fn quiesce(&self, rank: Rank, err: &dyn std::fmt::Display) {
        self.fail(rank, err);
        drop(self.movement.write().unwrap_or_else(|e| e.into_inner()));
    }

    /// `Err` once any rank has failed.
    pub fn check(&self) -> Result<(), CommError> {
        if !self.failed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let f = lock(&self.failure)
            .clone()
            .expect("failed implies a failure record");
        Err(CommError::PeerFailed {
            rank: f.rank,
            reason: f.reason,
        })
    }

    /// Record that `rank` makes call number `call` described by `what`;
    /// `Err` if an earlier rank described it differently.
    pub fn register_call(&self, call: u64, rank: Rank, what: &str) -> Result<(), CommError> {
        let mut board = lock(&self.board);
        let n = self.n;
        let entry = board
            .calls
            .entry(call)
            .or_insert_with(|| (rank, what.to_owned(), 0));
        if entry.1 != what {
            return Err(CommError::Mismatch {
                call,
                rank,
                other: entry.0,
                expected: entry.1.clone(),
                got: what.to_owned(),
            });
        }
        entry.2 += 1;
        if entry.2 == n {
            board.calls.remove(&call);
        }
        Ok(())
    }

    /// Arrive at the barrier; returns the generation to wait past.
    pub fn arrive(&self) -> (u64, bool) {
        let mut b = lock(&self.barrier);
        let generation = b.0;
        b.1 += 1;
        if b.1 == self.n {
            b.0 += 1;
            b.1 = 0;
            drop(b);
            for r in 0..self.n {
                self.ring(r);
            }
            return (generation, true);
        }
        (generation, false)
    }

    pub fn barrier_generation(&self) -> u64 {
        lock(&self.barrier).0
    }
}
