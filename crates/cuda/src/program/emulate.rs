//! The device protocol on CPU threads: one thread per (rank, channel)
//! stands in for a thread block, each rank's inbox and counters are plain
//! memory every thread may reach (as peer-mapped device memory is), and
//! each block walks its records exactly as the kernel does — wait for its
//! `after`s, for every message it receives to be posted and every slot it
//! sends into to be free; check the peer's hello before its first store to
//! it; combine; write; store into the peers' inboxes; publish. Counters
//! live in a [`Fabric`] that outlasts calls, as the device's do.
//!
//! It is a test rig, not an executor: it exists so that offsets, slot
//! reuse across calls, the counters and the agreement check are exercised
//! on every machine, and a change to the protocol is caught here before it
//! reaches a GPU.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;
use ferrocoll_core::types::Reduce;

use super::{DeviceProgram, Layout, Local, Op, Protocol, RankProgram, State, Window};

mod ll;
mod memory;

pub(crate) use memory::Arena;
use memory::{Memory, bytes_of, divide};

fn words(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

/// One rank's window: the memory peers reach, laid out by
/// [`Layout::window`] as on the device.
struct Peer {
    window: Arena,
    at: Window,
}

impl Peer {
    /// The word `index` of the counters at byte `at` of the window.
    fn word(&self, at: u64, index: usize) -> &AtomicU64 {
        debug_assert!(at + 8 * index as u64 + 8 <= self.at.bytes);
        // SAFETY: the window is 8-byte aligned (a `u64` allocation) and
        // `Layout::window` places every counter array at a multiple of 16
        // inside it, clear of the inbox; counter words are only ever
        // accessed atomically.
        unsafe {
            &*self
                .window
                .ptr()
                .add(at as usize + 8 * index)
                .cast::<AtomicU64>()
        }
    }

    /// By (channel, sender): messages stored into this inbox, ever.
    fn posted(&self, word: usize) -> &AtomicU64 {
        self.word(self.at.posted, word)
    }

    /// By (channel, receiver): this rank's messages the receiver has
    /// read, ever.
    fn consumed(&self, word: usize) -> &AtomicU64 {
        self.word(self.at.consumed, word)
    }

    /// By channel: (call << 32) | the program's agreement, low half.
    fn hello(&self, channel: u32) -> &AtomicU64 {
        self.word(self.at.hello, channel as usize)
    }
}

/// The memory of a group of emulated devices, kept across calls.
pub struct Fabric {
    layout: Layout,
    peers: Vec<Peer>,
    /// Each rank's private state, laid out by [`Layout::state`].
    states: Vec<Box<[AtomicU64]>>,
    abort: AtomicBool,
    failure: Mutex<Option<(Rank, String)>>,
    timeout: Duration,
}

/// One rank's buffers for a call, in the element type of the call.
pub struct Buffers<'a, T> {
    /// The input (empty in place).
    pub input: &'a [T],
    /// The output (in place: the one buffer).
    pub output: &'a mut [T],
}

/// Why `buffers` cannot hold `program`'s call: another element type, or
/// a length other than the program's (an in-place call has no input).
pub(crate) fn buffer_problem<T: Reduce>(
    program: &DeviceProgram,
    buffers: &Buffers<'_, T>,
) -> Option<CommError> {
    if T::DATA_TYPE != program.dtype {
        return Some(CommError::DtypeMismatch {
            input: T::DATA_TYPE,
            output: program.dtype,
        });
    }
    let size = std::mem::size_of::<T>() as u64;
    [
        ("input", buffers.input.len(), program.input_bytes),
        ("output", buffers.output.len(), program.output_bytes),
    ]
    .into_iter()
    .find(|&(_, got, needed)| got as u64 * size != needed)
    .map(|(what, got, needed)| CommError::BufferSize {
        what,
        got,
        needed: (needed / size) as usize,
    })
}

/// `f(rank, its buffers)` for every rank at once, a thread each; what
/// each returned, or its panic.
pub(crate) fn on_rank_threads<'a, T: Send + Sync, R: Send>(
    buffers: Vec<Buffers<'a, T>>,
    f: impl Fn(usize, Buffers<'a, T>) -> R + Sync,
) -> Vec<std::thread::Result<R>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = buffers
            .into_iter()
            .enumerate()
            .map(|(r, b)| {
                let f = &f;
                scope.spawn(move || f(r, b))
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    })
}

impl Fabric {
    /// Inboxes and counters for `layout`; every wait gives up after
    /// `timeout`. A layout no device could be set up with is refused.
    pub fn new(layout: Layout, timeout: Duration) -> Result<Self, super::ProgramError> {
        layout.check()?;
        let at = layout.window();
        Ok(Fabric {
            layout,
            peers: (0..layout.world_size)
                .map(|_| Peer {
                    window: Arena::new(at.bytes),
                    at,
                })
                .collect(),
            states: (0..layout.world_size)
                .map(|_| words(layout.state().words))
                .collect(),
            abort: AtomicBool::new(false),
            failure: Mutex::new(None),
            timeout,
        })
    }

    /// Every rank's every channel as if `call` calls had run, the last
    /// of some plan (tests of the call number's wrap at 2³²).
    pub fn start_after(&self, call: u64) {
        let at = self.layout.state();
        for (state, peer) in self.states.iter().zip(&self.peers) {
            for c in 0..self.layout.max_channels {
                state[at.calls + c as usize].store(call, Ordering::Release);
                peer.hello(c).store(call << 32, Ordering::Release);
            }
        }
    }

    /// Run one call: rank `r` runs its part of `programs[r]` (the same
    /// program on every rank, unless a test makes them disagree) on
    /// `buffers[r]`. A failed call fails the fabric: its counters no longer
    /// match between ranks, as a device's would not.
    pub fn call<T: Reduce>(
        &self,
        programs: &[&DeviceProgram],
        buffers: Vec<Buffers<'_, T>>,
    ) -> Vec<Result<(), CommError>> {
        let n = self.layout.world_size as usize;
        // The walk trusts every index and length of the records: check
        // them (their fields are public) before any thread starts.
        let problem = if programs.len() != n || buffers.len() != n {
            Some((
                0,
                format!(
                    "{} programs and {} buffers for {n} ranks",
                    programs.len(),
                    buffers.len()
                ),
            ))
        } else {
            programs.iter().enumerate().find_map(|(r, p)| {
                let why = if p.layout != self.layout {
                    Some("a program lowered for another layout".to_owned())
                } else {
                    p.validate().err().map(|e| e.to_string())
                };
                why.map(|w| (r as Rank, format!("rank {r}: {w}")))
            })
        };
        if let Some((rank, why)) = problem {
            self.fail(rank, why);
        }
        if let Some((rank, reason)) = self.failed() {
            return (0..n)
                .map(|_| {
                    Err(CommError::PeerFailed {
                        rank,
                        reason: reason.clone(),
                    })
                })
                .collect();
        }
        on_rank_threads(buffers, |r, b| self.rank_call(r as Rank, programs[r], b))
            .into_iter()
            .map(|x| x.unwrap_or_else(|_| Err(self.fail(0, "a block panicked".into()))))
            .collect()
    }

    fn failed(&self) -> Option<(Rank, String)> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Record the first failure and stop every block.
    fn fail(&self, rank: Rank, reason: String) -> CommError {
        let mut first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert((rank, reason.clone()));
        self.abort.store(true, Ordering::Release);
        CommError::PeerFailed { rank, reason }
    }

    fn rank_call<T: Reduce>(
        &self,
        rank: Rank,
        program: &DeviceProgram,
        buffers: Buffers<'_, T>,
    ) -> Result<(), CommError> {
        let me = &program.ranks[rank as usize];
        if let Some(e) = buffer_problem(program, &buffers) {
            // Peers must not wait out the timeout for this rank.
            self.fail(rank, e.to_string());
            return Err(e);
        }
        let scratch = Arena::new(program.scratch_bytes);
        let memory = Memory {
            input: buffers.input.as_ptr().cast(),
            output: buffers.output.as_mut_ptr().cast(),
            scratch: scratch.ptr(),
        };
        // As the kernel's blocks: one per channel of the plan, each
        // reading and advancing its own words of the rank's state.
        let results: Vec<Result<(), CommError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..me.channels.len() as u32)
                .map(|channel| {
                    let block = Block::new(self, program, rank, channel, &memory);
                    scope.spawn(move || block.run::<T>())
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(self.fail(rank, "a block panicked".into())))
                })
                .collect()
        });
        results.into_iter().collect::<Result<(), CommError>>()?;
        if let Some(d) = &me.divide {
            // SAFETY: every block of this rank has finished; the region is
            // inside the caller's output (the plan was checked against it).
            unsafe { divide::<T>(&memory, me, d, program.layout.world_size) };
        }
        Ok(())
    }
}

struct Block<'a> {
    fabric: &'a Fabric,
    program: &'a DeviceProgram,
    me: &'a RankProgram,
    rank: Rank,
    channel: u32,
    memory: &'a Memory,
    /// The rank's private state.
    state: &'a [AtomicU64],
    at: State,
    /// This call's number (it wraps), and the hello word it makes.
    call: u32,
    hello: u64,
}

impl<'a> Block<'a> {
    fn new(
        fabric: &'a Fabric,
        program: &'a DeviceProgram,
        rank: Rank,
        channel: u32,
        memory: &'a Memory,
    ) -> Self {
        let state = &fabric.states[rank as usize];
        let at = fabric.layout.state();
        // The previous call of the rank has finished (its blocks joined).
        let call =
            (state[at.calls + channel as usize].load(Ordering::Acquire) as u32).wrapping_add(1);
        Block {
            fabric,
            program,
            me: &program.ranks[rank as usize],
            rank,
            channel,
            memory,
            state,
            at,
            call,
            hello: (u64::from(call) << 32) | (program.agreement() & 0xffff_ffff),
        }
    }

    fn layout(&self) -> &Layout {
        &self.fabric.layout
    }

    fn done(&self, channel: u32) -> &AtomicU64 {
        &self.state[self.at.done + channel as usize]
    }

    fn run<T: Reduce>(&self) -> Result<(), CommError> {
        // A call behind a failure does nothing, as the kernel's blocks.
        if let Some((rank, reason)) = self.fabric.failed() {
            return Err(CommError::PeerFailed { rank, reason });
        }
        let mine = &self.fabric.peers[self.rank as usize];
        let channels = self.me.channels.len() as u32;
        // Hello first: this channel's, and block 0 the idle channels', so
        // a peer whose plan uses them still finds this call's.
        mine.hello(self.channel)
            .store(self.hello, Ordering::Release);
        if self.channel == 0 {
            for k in channels..self.layout().max_channels {
                mine.hello(k).store(self.hello, Ordering::Release);
            }
        }
        let span = self.me.channels[self.channel as usize];
        // Per peer: greeted before waiting on it, before storing into it.
        let mut greeted = vec![[false; 2]; self.layout().world_size as usize];
        for i in 0..span.count {
            let op = &self.me.ops[(span.first + i) as usize];
            self.fire::<T>(op, &mut greeted)?;
            self.done(self.channel).store(
                (u64::from(self.call) << 32) | u64::from(i + 1),
                Ordering::Release,
            );
        }
        self.finish(channels);
        Ok(())
    }

    /// The channel's links count this call's messages for the next, and
    /// the channel (block 0: the idle ones too) its call.
    fn finish(&self, channels: u32) {
        let layout = *self.layout();
        let mine = |w: u64| w as usize / layout.world_size as usize == self.channel as usize;
        for c in self.me.sent.iter().filter(|c| mine(c.word)) {
            self.state[self.at.sent + c.word as usize].fetch_add(c.count, Ordering::Relaxed);
        }
        for c in self.me.received.iter().filter(|c| mine(c.word)) {
            self.state[self.at.received + c.word as usize].fetch_add(c.count, Ordering::Relaxed);
        }
        let call = u64::from(self.call);
        self.state[self.at.calls + self.channel as usize].store(call, Ordering::Release);
        if self.channel == 0 {
            for k in channels..layout.max_channels {
                self.state[self.at.calls + k as usize].store(call, Ordering::Release);
            }
        }
    }

    fn base_sent(&self, word: usize) -> u64 {
        self.state[self.at.sent + word].load(Ordering::Relaxed)
    }

    fn base_received(&self, word: usize) -> u64 {
        self.state[self.at.received + word].load(Ordering::Relaxed)
    }

    fn fire<T: Reduce>(&self, op: &Op, greeted: &mut [[bool; 2]]) -> Result<(), CommError> {
        let layout = *self.layout();
        let slots = u64::from(layout.slots);
        for a in self.span(&self.me.afters, op.after) {
            self.wait(
                || {
                    // The same call (its number wraps), past the instruction.
                    let d = self.done(a.channel).load(Ordering::Acquire);
                    (d >> 32) as u32 == self.call && d as u32 > a.index
                },
                "an earlier instruction of another channel",
            )?;
        }
        let recv: Vec<(u32, u64)> = self
            .span(&self.me.ends, op.recv)
            .map(|e| {
                (
                    e.peer,
                    self.base_received(layout.link_word(self.channel, e.peer)) + e.index,
                )
            })
            .collect();
        let send: Vec<(u32, u64)> = self
            .span(&self.me.ends, op.send)
            .map(|e| {
                (
                    e.peer,
                    self.base_sent(layout.link_word(self.channel, e.peer)) + e.index,
                )
            })
            .collect();
        let mine = &self.fabric.peers[self.rank as usize];
        for &(p, g) in &recv {
            // A sender that called another plan may never post: its hello
            // says so sooner than a timeout would.
            if !greeted[p as usize][0] {
                self.greet(p, false)?;
                greeted[p as usize][0] = true;
            }
            // LL lines carry their own flags: the reads below wait.
            if self.program.protocol == Protocol::Simple {
                let posted = mine.posted(layout.link_word(self.channel, p));
                self.wait(
                    || posted.load(Ordering::Acquire) > g,
                    "a message to be posted",
                )?;
            }
        }
        for &(q, g) in &send {
            let consumed = mine.consumed(layout.link_word(self.channel, q));
            self.wait(
                || consumed.load(Ordering::Acquire) + slots > g,
                "a free slot",
            )?;
            if !greeted[q as usize][1] {
                self.greet(q, true)?;
                greeted[q as usize][1] = true;
            }
        }
        let inputs = match self.program.protocol {
            Protocol::Simple => self.slots_read::<T>(op, &recv),
            Protocol::Ll => self.ll_read::<T>(op, &recv)?,
        };
        let value = self.value::<T>(op, inputs);
        // Tests widen the window between the data and its announcement, so
        // an announcement made too early shows as wrong data.
        #[cfg(test)]
        std::thread::yield_now();
        for &(p, g) in &recv {
            self.fabric.peers[p as usize]
                .consumed(layout.link_word(self.channel, self.rank))
                .store(g + 1, Ordering::Release);
        }
        let bytes = op.bytes as usize;
        if let Some(w) = op.write.get() {
            // SAFETY: the region lies in this rank's buffer (the plan was
            // compiled for these lengths); `value` is a separate vector.
            unsafe { self.scatter(w, value.as_ptr().cast(), bytes) };
        }
        for &(q, g) in &send {
            let peer = &self.fabric.peers[q as usize];
            if self.program.protocol == Protocol::Ll {
                self.ll_write(peer, g, bytes_of(&value));
                peer.posted(layout.link_word(self.channel, self.rank))
                    .store(g + 1, Ordering::Release);
                continue;
            }
            let at =
                peer.at.inbox + layout.slot_offset(self.channel, self.rank, (g % slots) as u32);
            // SAFETY: the slot is inside the peer's inbox (offsets come from
            // the layout the plan was checked against) and free: its
            // previous message was consumed (acquired above).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    value.as_ptr().cast::<u8>(),
                    peer.window.ptr().add(at as usize),
                    bytes,
                );
            }
            #[cfg(test)]
            std::thread::yield_now();
            peer.posted(layout.link_word(self.channel, self.rank))
                .store(g + 1, Ordering::Release);
        }
        Ok(())
    }

    /// The peer's hello for this channel must be this call's, with this
    /// plan's hash, before any of this rank's data lands in its memory.
    ///
    /// Before a wait on the peer (not `sending`), a peer already past this
    /// call passes too: it finished this call, so whatever it sent here it
    /// sent after checking this rank's hello itself — a sender never passes
    /// a receiver that is ahead — and if it sent nothing, the wait times
    /// out rather than takes another call's data.
    fn greet(&self, peer: u32, sending: bool) -> Result<(), CommError> {
        let word = self.fabric.peers[peer as usize].hello(self.channel);
        let seq = self.call;
        // Call numbers wrap; a peer ahead of this call ran another one.
        let reached =
            || ((word.load(Ordering::Acquire) >> 32) as u32).wrapping_sub(seq) as i32 >= 0;
        self.wait(reached, "the peer to start the call")?;
        let theirs = word.load(Ordering::Acquire);
        if theirs == self.hello || (!sending && (theirs >> 32) as u32 != seq) {
            return Ok(());
        }
        let show = |h: u64| format!("call {} of plan {:08x}", h >> 32, h & 0xffff_ffff);
        // The device counts calls from 1; errors number them from 0.
        let e = CommError::Mismatch {
            call: u64::from(seq).saturating_sub(1),
            rank: self.rank,
            other: peer,
            expected: show(theirs),
            got: show(self.hello),
        };
        self.fabric.fail(self.rank, e.to_string());
        Err(e)
    }

    /// The received messages, from the inbox's slots (each posted).
    fn slots_read<T: Reduce>(&self, op: &Op, recv: &[(u32, u64)]) -> Vec<Vec<T>> {
        let layout = self.layout();
        let len = op.bytes as usize / std::mem::size_of::<T>();
        let mine = &self.fabric.peers[self.rank as usize];
        recv.iter()
            .map(|&(p, g)| {
                let at = mine.at.inbox
                    + layout.slot_offset(self.channel, p, (g % u64::from(layout.slots)) as u32);
                // SAFETY: the message was posted (acquired) and its slot is
                // not rewritten before this rank publishes `consumed`; slots
                // are 16-byte aligned and hold `op.bytes` bytes.
                unsafe {
                    std::slice::from_raw_parts(mine.window.ptr().add(at as usize).cast::<T>(), len)
                        .to_vec()
                }
            })
            .collect()
    }

    /// The combined value: the received messages in order, then the read.
    fn value<T: Reduce>(&self, op: &Op, mut inputs: Vec<Vec<T>>) -> Vec<T> {
        let len = op.bytes as usize / std::mem::size_of::<T>();
        if let Some(r) = op.read.get() {
            let mut local: Vec<T> = Vec::with_capacity(len);
            // SAFETY: the region lies in this rank's buffer and holds
            // `op.bytes` bytes; `local` has room for them.
            unsafe {
                self.gather(r, local.as_mut_ptr().cast(), op.bytes as usize);
                local.set_len(len);
            }
            inputs.push(local);
        }
        let mut value = inputs.remove(0);
        if !inputs.is_empty() {
            let mut srcs: Vec<*const T> = vec![value.as_ptr()];
            srcs.extend(inputs.iter().map(|v| v.as_ptr()));
            // SAFETY: every source holds `len` elements; the destination
            // is the first source exactly, as `reduce` allows.
            unsafe { T::reduce(self.program.op, &srcs, value.as_mut_ptr(), len) };
        }
        value
    }

    /// Copy a region's pieces, in order, to `dst`.
    ///
    /// # Safety
    /// The region is inside this rank's buffers; `dst` has `bytes` bytes.
    unsafe fn gather(&self, r: &Local, dst: *mut u8, bytes: usize) {
        let base = self.memory.base(r.buffer);
        let mut at = 0;
        for p in self.span(&self.me.pieces, r.pieces) {
            debug_assert!(at + p.bytes as usize <= bytes);
            // SAFETY: forwarded from the caller.
            unsafe { std::ptr::copy(base.add(p.offset as usize), dst.add(at), p.bytes as usize) };
            at += p.bytes as usize;
        }
    }

    /// Copy `src` into a region's pieces, in order.
    ///
    /// # Safety
    /// As [`Block::gather`].
    unsafe fn scatter(&self, r: &Local, src: *const u8, bytes: usize) {
        let base = self.memory.base(r.buffer);
        let mut at = 0;
        for p in self.span(&self.me.pieces, r.pieces) {
            debug_assert!(at + p.bytes as usize <= bytes);
            // SAFETY: forwarded from the caller.
            unsafe { std::ptr::copy(src.add(at), base.add(p.offset as usize), p.bytes as usize) };
            at += p.bytes as usize;
        }
    }

    fn span<'t, R>(&self, table: &'t [R], s: super::Span) -> impl Iterator<Item = &'t R> {
        table[s.first as usize..(s.first + s.count) as usize].iter()
    }

    /// Spin until `ready`, as a block polls a flag: giving up when another
    /// block failed, or after the fabric's timeout.
    fn wait(&self, ready: impl Fn() -> bool, what: &str) -> Result<(), CommError> {
        let started = Instant::now();
        let mut spins = 0u32;
        while !ready() {
            if self.fabric.abort.load(Ordering::Acquire) {
                let (rank, reason) = self
                    .fabric
                    .failed()
                    .unwrap_or((self.rank, "aborted".into()));
                return Err(CommError::PeerFailed { rank, reason });
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                std::thread::yield_now();
                if started.elapsed() > self.fabric.timeout {
                    let what = format!("{what} on channel {}", self.channel);
                    self.fabric
                        .fail(self.rank, format!("timed out waiting for {what}"));
                    return Err(CommError::Timeout {
                        rank: self.rank,
                        timeout: self.fabric.timeout,
                        what,
                    });
                }
            }
            std::hint::spin_loop();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
