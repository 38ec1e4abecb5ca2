//! The ring of a communicator's last calls.

use super::call::{CallRecord, CallState, Entry, Identity, QueuedRecord, now_us};
use super::dump::Dump;
use crate::comm::{CallQueue, CallQueueRef, CommError};
use crate::types::CallShape;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

struct Ring {
    identity: Identity,
    /// Where dumps go, if anywhere.
    dir: Option<PathBuf>,
    capacity: usize,
    calls: VecDeque<Entry>,
    /// Records that fell out of the ring.
    dropped: u64,
    /// Calls an `AsyncCommunicator` queued and has not started: token,
    /// description, when.
    queued: VecDeque<(u64, String, u64)>,
    /// The next queue token.
    tokens: u64,
    /// When the call the progress thread is starting was queued: the
    /// next recorded call's.
    starting: Option<u64>,
}

impl Ring {
    fn dump(&self, reason: &str) -> Dump {
        let calls: Vec<CallRecord> = self.calls.iter().map(Entry::record).collect();
        let queued = self
            .queued
            .iter()
            .map(|(_, what, at)| QueuedRecord {
                what: what.clone(),
                queued_us: *at,
            })
            .collect();
        Dump::of(&self.identity, self.dropped, &calls, queued, reason)
    }
}

/// Past this many queued calls the oldest are no longer listed: a
/// program that starts calls and never waits would otherwise grow the
/// list without bound.
const MAX_QUEUED: usize = 4096;

/// The ring's side of an `AsyncCommunicator`'s queue.
struct RingQueue(Arc<Mutex<Ring>>);

impl CallQueue for RingQueue {
    fn queued(&self, what: String) -> u64 {
        let mut ring = self.0.lock().unwrap_or_else(|e| e.into_inner());
        ring.tokens += 1;
        let token = ring.tokens;
        if ring.capacity > 0 {
            if ring.queued.len() == MAX_QUEUED {
                ring.queued.pop_front();
            }
            ring.queued.push_back((token, what, now_us()));
        }
        token
    }

    fn started(&self, token: Option<u64>) {
        let mut ring = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let at = token.and_then(|t| {
            let i = ring.queued.iter().position(|q| q.0 == t)?;
            ring.queued.remove(i).map(|q| q.2)
        });
        ring.starting = at;
    }
}

impl super::signal::Dumps for Mutex<Ring> {
    fn dump_now(&self, reason: &str) {
        let ring = self.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dir) = &ring.dir {
            ring.dump(reason).write_into(dir);
        }
    }
}

/// A communicator's flight recorder (see the module's documentation).
/// Cheap when off: a capacity of 0 records nothing.
pub struct FlightRecorder {
    ring: Arc<Mutex<Ring>>,
    dir: Option<PathBuf>,
    summarize: bool,
}

impl std::fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl FlightRecorder {
    /// A recorder for `identity`, sized and placed by the environment
    /// (`FERROCOLL_TRACE_BUFFER`, `FERROCOLL_TRACE_DIR`).
    pub fn new(identity: Identity) -> FlightRecorder {
        let settings = crate::settings::trace_settings();
        FlightRecorder::with(identity, settings.capacity, settings.dir)
    }

    /// A recorder keeping `capacity` calls, dumping into `dir` if set.
    pub fn with(identity: Identity, capacity: usize, dir: Option<PathBuf>) -> FlightRecorder {
        let recorder = FlightRecorder {
            ring: Arc::new(Mutex::new(Ring {
                identity,
                dir: dir.clone(),
                capacity,
                calls: VecDeque::with_capacity(capacity.min(64)),
                dropped: 0,
                queued: VecDeque::new(),
                tokens: 0,
                starting: None,
            })),
            dir,
            summarize: false,
        };
        if recorder.dir.is_some() {
            let ring: Arc<dyn super::signal::Dumps> = recorder.ring.clone();
            super::signal::register(&ring);
        }
        recorder
    }

    /// The recorder of a group split from this one by its call number
    /// `call` with `color`, where this rank is `rank` of `world_size`:
    /// named after this group, the call and the color, the same on every
    /// rank of the new group.
    pub fn split(&self, call: u64, color: u32, rank: u32, world_size: u32) -> FlightRecorder {
        let (identity, capacity) = {
            let ring = self.lock();
            let identity = Identity {
                group: format!("{}.s{call}c{color}", ring.identity.group),
                rank,
                world_size,
                executor: ring.identity.executor,
            };
            (identity, ring.capacity)
        };
        FlightRecorder::with(identity, capacity, self.dir.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Call `call` starts: `shape`, or a barrier for `None`.
    pub fn begin(&self, call: u64, shape: Option<&CallShape>) {
        let mut ring = self.lock();
        if ring.capacity == 0 {
            return;
        }
        if ring.calls.len() == ring.capacity {
            ring.calls.pop_front();
            ring.dropped += 1;
        }
        let queued_us = ring.starting.take();
        let record = Entry {
            call,
            shape: shape.copied(),
            algorithm: None,
            plan: None,
            queued_us,
            started_us: now_us(),
            ended_us: None,
            state: CallState::Running,
        };
        ring.calls.push_back(record);
    }

    /// Where an `AsyncCommunicator` reports the calls it queued.
    pub fn queue(&self) -> CallQueueRef {
        Arc::new(RingQueue(self.ring.clone()))
    }

    /// What call `call` runs.
    pub fn planned(&self, call: u64, algorithm: &str, plan: Option<u64>) {
        let mut ring = self.lock();
        if let Some(r) = ring.calls.back_mut().filter(|r| r.call == call) {
            r.algorithm = Some(algorithm.into());
            r.plan = plan;
        }
    }

    /// Call `call` returned `result`; a failure is dumped where dumps go.
    pub fn end(&self, call: u64, result: &Result<(), CommError>) {
        {
            let mut ring = self.lock();
            if let Some(r) = ring.calls.back_mut().filter(|r| r.call == call) {
                r.ended_us = Some(now_us());
                r.state = match result {
                    Ok(()) => CallState::Done,
                    Err(e) => CallState::Failed(e.to_string()),
                };
            }
        }
        if let Err(e) = result {
            self.dump(&format!("call #{call} failed: {e}"));
        }
    }

    /// Per collective and size, the calls the ring holds: count, latency
    /// percentiles, bus bandwidth ([`super::SummaryRow`]).
    pub fn summary(&self) -> Vec<super::SummaryRow> {
        let ring = self.lock();
        super::summary::rows(ring.calls.iter(), ring.identity.world_size)
    }

    /// Print the summary on stderr when this recorder is dropped (rank 0
    /// only: `FERROCOLL_SUMMARY=1`).
    pub fn summarize_on_drop(&mut self, on: bool) {
        self.summarize = on && self.lock().identity.rank == 0;
    }

    /// The recorded calls, oldest first.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.lock().calls.iter().map(Entry::record).collect()
    }

    /// Write the ring where dumps go (if anywhere), saying why; returns
    /// the file written.
    pub fn dump(&self, reason: &str) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        self.lock().dump(reason).write_into(dir)
    }
}

impl Drop for FlightRecorder {
    fn drop(&mut self) {
        if self.summarize {
            let rows = self.summary();
            if !rows.is_empty() {
                let group = self.lock().identity.group.clone();
                eprint!(
                    "# ferrocoll: calls of group {group} seen by rank 0\n{}",
                    super::summary::render(&rows)
                );
            }
        }
        if self.dir.is_some() && !self.lock().calls.is_empty() {
            self.dump("the communicator was dropped");
        }
    }
}
