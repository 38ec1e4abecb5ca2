//! State shared by the ranks of one CPU group: link queues with bounded
//! slots and traffic counters, per-rank doorbells, the failure flag, the
//! call board and the group's planner.

use std::cell::UnsafeCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::Instant;

use super::board::Board;
use crate::aligned::{CacheLine, LINE_BYTES};
use crate::comm::{CommError, Planned, Planner};
use crate::link::{Header, HeapMap};
use crate::plan::{LinkLoad, OneShotRule};
use crate::types::{CallShape, DataType, Link, Rank};

/// A message on a link.
#[derive(Debug, Clone)]
pub(crate) enum Msg {
    /// A message of a plan: its header, and the slot buffer its payload
    /// (the value, or where the value lies) is in.
    Plan { header: Header, slot: usize },
    /// A point-to-point send: the bytes sit in the sender's memory, which
    /// stays unchanged until the message is popped.
    Send {
        address: usize,
        bytes: usize,
        dtype: DataType,
    },
}

/// A receiver's post on a link: where it wants one message written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Post {
    /// The message's number over the link's life.
    pub seq: u64,
    pub address: usize,
    pub len: usize,
    /// The sender claimed it and writes there (until it sends the message).
    pub taken: bool,
}

#[derive(Debug, Default)]
pub(crate) struct LinkState {
    pub queue: VecDeque<Msg>,
    /// Messages ever pushed; message `k` of the link uses slot buffer
    /// `k % slots`, free once fewer than `slots` messages are queued.
    pub pushed: u64,
    /// Messages ever consumed by the receiver.
    pub popped: u64,
    /// The receiver's post for a message not sent yet, if any.
    pub post: Option<Post>,
    /// Messages and bytes moved over the link, a message's value counted
    /// once when it is sent (copied, lent or written to a post alike);
    /// `None` until the first message.
    pub traffic: Option<LinkLoad>,
}

/// A slot buffer. Written only by the link's sender while the slot is free,
/// read only by its receiver while the message that names it is queued.
/// Backed by cache lines, so it is aligned for every element type and
/// sits at the offset the caller's line-aligned buffers do
/// ([`crate::aligned`]).
pub(crate) struct SlotBuffer(UnsafeCell<Vec<CacheLine>>);

// SAFETY: access follows the slot protocol above: the sender writes slot
// `pushed % slots` only when fewer than `slots` messages are queued, and
// those are numbered just below `pushed`, so none names that slot; the
// receiver reads a slot only while its message is queued; the link mutex
// orders the two.
unsafe impl Sync for SlotBuffer {}

impl SlotBuffer {
    /// # Safety
    /// The caller is the link's sender and the slot is free (see the type's docs).
    pub(crate) unsafe fn prepare(&self, bytes: usize) -> usize {
        // SAFETY: exclusive by the caller's contract.
        let v = unsafe { &mut *self.0.get() };
        let lines = bytes.div_ceil(LINE_BYTES);
        if v.len() < lines {
            v.resize(lines, CacheLine::ZERO);
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
    /// Rings so far. Waiters spin on it, then sleep.
    ticks: AtomicU64,
    /// Waiters asleep (or about to be) on `changed`: a ring takes the lock
    /// and wakes them only when there are some, so the common ring — the
    /// peer is spinning — is one atomic add, not a system call.
    sleepers: AtomicU32,
    lock: Mutex<()>,
    changed: Condvar,
}

/// How long a waiter spins before sleeping, when every rank has a core of
/// its own: a wake-up through the kernel costs tens of microseconds, which
/// dominates small collectives.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// How long a spinning waiter goes before it also yields between spins: a
/// peer on another core answers sooner than this.
const YIELD_AFTER: std::time::Duration = std::time::Duration::from_micros(5);

#[derive(Debug, Clone)]
struct Failure {
    rank: Rank,
    reason: String,
}

/// What each rank called, per call number: the agreement every call
/// passes before any data moves.
#[derive(Default)]
struct CallBoard {
    calls: HashMap<u64, Entry>,
    /// Every call below this number was agreed by every rank.
    agreed: u64,
}

/// One call number on the board.
struct Entry {
    /// The first rank to arrive, and its description of the call.
    first: Rank,
    what: String,
    arrived: Vec<bool>,
    count: u32,
    /// A rank that described the call differently, and how.
    conflict: Option<(Rank, String)>,
}

/// Where a rank stands in a call's agreement.
pub(crate) enum Agreement {
    /// Every rank made the same call.
    Agreed,
    /// These ranks have not arrived yet.
    Waiting(Vec<Rank>),
}

/// A split's call number and a color of it.
type SplitKey = (u64, u32);

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
    /// Where every call is announced first (lock-free), and one-shot
    /// calls publish their inputs; the call board above only hears of a
    /// call whose announcements disagree, to name the difference.
    pub posts: Board,
    /// Which calls take the one-shot protocol.
    pub one_shot: OneShotRule,
    /// The group's one planner: the first rank to need a plan builds it,
    /// the others wait for that (finite) computation rather than repeat it.
    planner: Mutex<Planner>,
    /// Ranks whose communicator was dropped: they make no further calls.
    departed: Vec<AtomicBool>,
    /// Each rank's map of the group's heaps: threads share one address
    /// space, so every rank's heap is all of it and a value's offset in
    /// it is its address.
    pub heaps: Vec<Arc<HeapMap>>,
    /// Held for reading while a rank touches another rank's memory (pointer
    /// reads, direct writes); a rank that gives up takes it for writing
    /// once, after failing the group, so no peer is still inside its
    /// buffers when it returns.
    movement: RwLock<()>,
    /// Groups a split is forming, by the split's call number and color,
    /// with how many of their members have yet to take them.
    splits: Mutex<HashMap<SplitKey, (Arc<Group>, u32)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking rank never holds these locks across user code, and the
    // data stays consistent; keep going with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Group {
    pub fn new(n: u32, slots: usize, planner: Planner) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let one_shot = planner.settings().one_shot_rule(n);
        Group {
            posts: Board::new(n, one_shot.staging_bytes(n)),
            one_shot,
            n,
            slots,
            spin: n as usize <= cores,
            bells: (0..n)
                .map(|_| Bell {
                    ticks: AtomicU64::new(0),
                    sleepers: AtomicU32::new(0),
                    lock: Mutex::new(()),
                    changed: Condvar::new(),
                })
                .collect(),
            links: Mutex::new(HashMap::new()),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            board: Mutex::new(CallBoard::default()),
            planner: Mutex::new(planner),
            departed: (0..n).map(|_| AtomicBool::new(false)).collect(),
            heaps: {
                let everything: Arc<[(usize, usize)]> = vec![(0, usize::MAX); n as usize].into();
                (0..n)
                    .map(|r| Arc::new(HeapMap::new(r, everything.clone())))
                    .collect()
            },
            movement: RwLock::new(()),
            splits: Mutex::new(HashMap::new()),
        }
    }

    /// The group of color `color` formed by split call `call`: the first
    /// member to ask makes it with `make`, the others share it, and the
    /// last one to take it clears the entry.
    pub fn split_group(
        &self,
        call: u64,
        color: u32,
        members: u32,
        make: impl FnOnce() -> Group,
    ) -> Arc<Group> {
        let mut splits = lock(&self.splits);
        let entry = splits
            .entry((call, color))
            .or_insert_with(|| (Arc::new(make()), members));
        let group = entry.0.clone();
        entry.1 -= 1;
        if entry.1 == 0 {
            splits.remove(&(call, color));
        }
        group
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
        // SeqCst pairs with the waiter's: either it sees this tick before
        // it sleeps, or this sees it counted as a sleeper and wakes it
        // (under the lock, which it holds from its last look until asleep).
        bell.ticks.fetch_add(1, Ordering::SeqCst);
        if bell.sleepers.load(Ordering::SeqCst) != 0 {
            drop(lock(&bell.lock));
            bell.changed.notify_all();
        }
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
        let result = match self.sleep(rank, seen, deadline) {
            _ if self.generation(rank) != seen => Ok(()),
            Err(e) => Err(e),
            Ok(()) => Err(CommError::Timeout {
                rank,
                timeout,
                what: what(),
            }),
        };
        if let Err(e @ CommError::Timeout { .. }) = &result {
            self.fail(rank, e);
        }
        result
    }

    /// Sleep until `rank`'s bell rings past `seen`, or `until`: `Err` when
    /// the group failed meanwhile. Spins first where ranks have cores of
    /// their own.
    pub fn sleep(&self, rank: Rank, seen: u64, until: Instant) -> Result<(), CommError> {
        let bell = &self.bells[rank as usize];
        let started = Instant::now();
        let spin_until = started + SPIN;
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
            if spins % 64 == 0 {
                let now = Instant::now();
                if now >= spin_until.min(until) {
                    break;
                }
                // A wait this long may mean the OS put the peer we wait for
                // on this core (it does, for a while, after other threads
                // ran): give it the core now and then, or every such wait
                // costs the whole spin. With the peer elsewhere this
                // returns at once.
                if self.spin && now - started >= YIELD_AFTER {
                    std::thread::yield_now();
                }
            }
        }
        let mut guard = lock(&bell.lock);
        bell.sleepers.fetch_add(1, Ordering::SeqCst);
        let result = loop {
            if bell.ticks.load(Ordering::SeqCst) != seen {
                break Ok(());
            }
            if let Err(e) = self.check() {
                break Err(e);
            }
            let now = Instant::now();
            if now >= until {
                break Ok(());
            }
            guard = bell
                .changed
                .wait_timeout(guard, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        bell.sleepers.fetch_sub(1, Ordering::SeqCst);
        drop(guard);
        result
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

    /// Fail the group on `err`, which `rank` returned: a peer's failure
    /// keeps naming that peer, so every rank blames the one that started it.
    pub fn fail_on(&self, rank: Rank, err: &CommError) {
        match err {
            CommError::PeerFailed {
                rank: culprit,
                reason,
            } => self.fail(*culprit, reason),
            other => self.fail(rank, other),
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

    /// Record that `rank` makes call number `call` described by `what`.
    /// `Err(Mismatch)` if a rank described it differently; the mismatch
    /// stays on the board so every rank of the call reports it.
    pub fn register_call(&self, call: u64, rank: Rank, what: &str) -> Result<(), CommError> {
        let mut board = lock(&self.board);
        let n = self.n;
        let entry = board.calls.entry(call).or_insert_with(|| Entry {
            first: rank,
            what: what.to_owned(),
            arrived: vec![false; n as usize],
            count: 0,
            conflict: None,
        });
        entry.arrived[rank as usize] = true;
        entry.count += 1;
        if entry.what != what {
            entry.conflict.get_or_insert((rank, what.to_owned()));
        }
        let result = mismatch(call, rank, what, entry);
        if entry.count == n && entry.conflict.is_none() {
            board.calls.remove(&call);
            board.agreed = board.agreed.max(call + 1);
            drop(board);
            for r in 0..n {
                self.ring(r);
            }
        }
        result
    }

    /// Whether every rank has agreed on call `call`, as `rank` sees it;
    /// `Err` on a mismatch.
    pub fn agreement(&self, call: u64, rank: Rank) -> Result<Agreement, CommError> {
        let board = lock(&self.board);
        if board.agreed > call {
            return Ok(Agreement::Agreed);
        }
        let Some(entry) = board.calls.get(&call) else {
            return Ok(Agreement::Waiting((0..self.n).collect()));
        };
        mismatch(call, rank, &entry_what(entry, rank), entry)?;
        let missing: Vec<Rank> = (0..self.n)
            .filter(|&r| !entry.arrived[r as usize])
            .collect();
        Ok(Agreement::Waiting(missing))
    }

    /// `Err` when one of `missing` (ranks that had not made call `call`)
    /// left the group: its communicator was dropped, so it never will.
    /// `still_missing` asks again after the departure was seen: a rank
    /// may have made the call, finished it and left since `missing` was
    /// taken, and then it did not leave *before* the call.
    pub fn departed_among(
        &self,
        missing: &[Rank],
        call: u64,
        what: &str,
        still_missing: impl Fn(Rank) -> bool,
    ) -> Result<(), CommError> {
        match missing
            .iter()
            .find(|&&r| self.departed[r as usize].load(Ordering::SeqCst) && still_missing(r))
        {
            Some(&gone) => Err(CommError::PeerFailed {
                rank: gone,
                reason: format!(
                    "left the group (its communicator was dropped) before call #{call} ({what})"
                ),
            }),
            None => Ok(()),
        }
    }

    /// Whether `rank` has registered call `call` on the call board (or
    /// every rank had and the entry is gone).
    pub fn registered(&self, call: u64, rank: Rank) -> bool {
        let board = lock(&self.board);
        board.agreed > call
            || board
                .calls
                .get(&call)
                .is_some_and(|e| e.arrived[rank as usize])
    }

    /// [`check`](Self::check) for a rank about to make call `call`, except
    /// that a failure caused by that very call's mismatch lets the rank go
    /// on to register, so it reports the mismatch like every other rank.
    pub fn check_before(&self, call: u64) -> Result<(), CommError> {
        let failed = self.check();
        if failed.is_err() && self.has_conflict(call) {
            return Ok(());
        }
        failed
    }

    /// Whether some rank described call `call` differently on the board.
    pub fn has_conflict(&self, call: u64) -> bool {
        lock(&self.board)
            .calls
            .get(&call)
            .is_some_and(|e| e.conflict.is_some())
    }

    /// Whether `rank`'s communicator was dropped.
    pub fn has_departed(&self, rank: Rank) -> bool {
        self.departed[rank as usize].load(Ordering::SeqCst)
    }

    /// `rank`'s communicator is gone: wake everyone waiting for it.
    pub fn depart(&self, rank: Rank) {
        self.departed[rank as usize].store(true, Ordering::SeqCst);
        for r in 0..self.n {
            self.ring(r);
        }
    }
}

/// How `rank` described the call, if the board knows (it registered).
fn entry_what(entry: &Entry, rank: Rank) -> String {
    match &entry.conflict {
        Some((r, what)) if *r == rank => what.clone(),
        _ => entry.what.clone(),
    }
}

/// The call's mismatch as `rank` (which described it as `what`) reports it.
fn mismatch(call: u64, rank: Rank, what: &str, entry: &Entry) -> Result<(), CommError> {
    let Some((other, theirs)) = &entry.conflict else {
        return Ok(());
    };
    let (other, expected) = if what == theirs {
        (entry.first, entry.what.clone())
    } else {
        (*other, theirs.clone())
    };
    Err(CommError::Mismatch {
        call,
        rank,
        other,
        expected,
        got: what.to_owned(),
    })
}
