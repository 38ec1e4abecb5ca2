//! Runs one rank's part of an execution plan over a [`Transport`].
//!
//! The same loop as the in-process executor — every channel advances
//! round-robin, an instruction fires when its messages are there, its
//! outgoing links have room and its waits are met — but every message is
//! a copy: the value is reduced straight into the first outgoing
//! message's room (or into the destination when nothing is sent) and read
//! straight out of the incoming messages, so each byte is written once per
//! hop. Every message carries the call's header; the first one that
//! disagrees with this rank's call is a [`CommError::Mismatch`].
//!
//! Where the group may read each other's memory ([`crate::zero_copy`]), a
//! value the plan keeps stable in the sender's buffers ([`Source`]) goes
//! by reference instead: the message names where it lies, the receiver
//! reads it from there (into its output, or a block at a time into a
//! cached buffer it reduces from), and the sender returns only once every
//! such message was consumed.

use std::time::{Duration, Instant};

use ferrocoll_core::comm::CommError;
use ferrocoll_core::plan::{ExecutionPlan, Instruction, RankPlan, Region, Source, Walk};
use ferrocoll_core::{Rank, Reduce, ReduceOp};

use crate::direct::{self, Bases, Postables};
use crate::transport::shm::heap::Heaps;
use crate::transport::{Incoming, Transport};
use crate::wire::Header;
use crate::zero_copy::{self, PeerReader, Pieces};

/// Reductions at least this long stream their stores (as the in-process
/// executor does).
const STREAM_MIN_BYTES: usize = 256 << 10;

/// Bytes of bounce buffers a by-reference step reduces through at a time,
/// shared by its incoming references: small enough to stay in L2.
const BOUNCE_BYTES: usize = 512 << 10;

/// One rank's task in one call.
pub(crate) struct Task<'a> {
    pub plan: &'a ExecutionPlan,
    pub rank: Rank,
    /// Base addresses of the input, output and scratch buffers (in place,
    /// the output's).
    pub bases: [usize; 3],
    /// The call's number on this communicator.
    pub number: u64,
    /// What every message of the call carries in its header.
    pub signature: &'a str,
    pub timeout: Duration,
}

/// A contiguous run of a value in local memory: (offset into the value,
/// address, elements).
type Span = (usize, usize, usize);

impl Task<'_> {
    fn spans<T>(&self, region: &Region) -> Vec<Span> {
        let size = std::mem::size_of::<T>();
        let base = self.bases[region.buffer as usize];
        let mut offset = 0;
        region
            .pieces
            .iter()
            .map(|p| {
                let elems = p.bytes as usize / size;
                let span = (offset, base + p.offset as usize, elems);
                offset += elems;
                span
            })
            .collect()
    }

    fn rank_plan(&self) -> &RankPlan {
        &self.plan.ranks[self.rank as usize]
    }
}

/// Run the rank's part of the plan, then divide for `Avg`; returns how
/// many messages went by reference.
pub(crate) fn execute<T: Reduce>(t: &mut dyn Transport, task: &Task) -> Result<u64, CommError> {
    let heaps = t.heaps();
    let mut call = CallState {
        lent: Vec::new(),
        written: 0,
        bases: heaps.as_ref().map(|_| Bases::new(t, task.rank_plan())),
        postables: None,
    };
    if let (Some(heaps), Some(bases)) = (&heaps, &call.bases) {
        let pieces = |r: &Region| as_pieces::<T>(&task.spans::<T>(r));
        call.postables = Some(Postables::new(heaps, task.rank_plan(), bases, pieces));
    }
    let result = walk_plan::<T>(t, task, &mut call);
    if result.is_err()
        && let Some(bases) = &call.bases
    {
        direct::withdraw_posts(t, bases, task.timeout);
    }
    result
}

/// [`execute`]'s walk, drain and division.
fn walk_plan<T: Reduce>(
    t: &mut dyn Transport,
    task: &Task,
    call: &mut CallState,
) -> Result<u64, CommError> {
    let mut walk = Walk::new(task.rank_plan());
    let mut deadline = Instant::now() + task.timeout;
    loop {
        let seen = t.ticket();
        let mut progressed = false;
        for channel in 0..walk.channels() {
            while let Some((at, ins)) = walk.next(channel) {
                if let Some(postables) = &call.postables {
                    postables.post_ahead(t, channel, at);
                }
                if !walk.waits_met(ins) || !try_fire::<T>(t, task, channel as u32, ins, call)? {
                    break;
                }
                progressed = true;
                walk.advance(channel);
            }
        }
        if walk.done() {
            break;
        }
        if progressed {
            deadline = Instant::now() + task.timeout;
            continue;
        }
        t.check()?;
        find_mismatch(t, task, walk.channels() as u32)?;
        find_departed(t, task, &walk)?;
        if Instant::now() >= deadline {
            return Err(CommError::Timeout {
                rank: task.rank,
                timeout: task.timeout,
                what: walk.describe(),
            });
        }
        t.wait(seen, deadline);
    }
    let by_reference = call.lent.len() as u64 + call.written;
    drain(t, task, &mut call.lent)?;
    if let Some(region) = &task.rank_plan().divide {
        for (_, address, n) in task.spans::<T>(region) {
            // SAFETY: the region lies in this rank's output (plan
            // invariant), borrowed exclusively by the caller; the call is done.
            let out = unsafe { std::slice::from_raw_parts_mut(address as *mut T, n) };
            for x in out {
                *x = x.divide(task.plan.world_size);
            }
        }
    }
    Ok(by_reference)
}

/// What one call keeps across its instructions.
struct CallState {
    /// Links this rank sent a value by reference on: drained before return.
    lent: Vec<(Rank, u32)>,
    /// Values this rank wrote straight into a peer's posted destination.
    written: u64,
    /// Link numbering of incoming messages, where posts are possible.
    bases: Option<Bases>,
    /// The direct receives this rank may post for.
    postables: Option<Postables>,
}

/// Wait until every message this rank sent by reference was consumed: its
/// buffers may change once it returns.
fn drain(t: &mut dyn Transport, task: &Task, lent: &mut Vec<(Rank, u32)>) -> Result<(), CommError> {
    lent.sort_unstable();
    lent.dedup();
    let deadline = Instant::now() + task.timeout;
    loop {
        let seen = t.ticket();
        lent.retain(|&(peer, channel)| t.unconsumed(peer, channel) > 0);
        let Some(&(peer, _)) = lent.first() else {
            return Ok(());
        };
        t.check()?;
        if t.departed(peer) {
            return Err(CommError::PeerFailed {
                rank: peer,
                reason: format!(
                    "left the group (its communicator was dropped) before reading call #{}'s data ({})",
                    task.number, task.signature
                ),
            });
        }
        if Instant::now() >= deadline {
            return Err(CommError::Timeout {
                rank: task.rank,
                timeout: task.timeout,
                what: format!(
                    "rank {peer} to read this rank's data of call #{}",
                    task.number
                ),
            });
        }
        t.wait(seen, deadline);
    }
}

/// A peer's message for this very call that describes it differently.
fn find_mismatch(t: &mut dyn Transport, task: &Task, channels: u32) -> Result<(), CommError> {
    let n = task.plan.world_size;
    let channels = t.max_channel().map_or(channels, |m| m.max(channels));
    for peer in (0..n).filter(|&p| p != task.rank) {
        for channel in 0..channels {
            if let Some(h) = t.peek_header(peer, channel) {
                check_header(&h, peer, task)?;
            }
        }
    }
    Ok(())
}

/// A peer this rank is blocked on that has left the group: it will never
/// send or consume again, so waiting out the timeout would only delay the error.
fn find_departed(t: &mut dyn Transport, task: &Task, walk: &Walk) -> Result<(), CommError> {
    for channel in 0..walk.channels() {
        let Some((_, ins)) = walk.next(channel) else {
            continue;
        };
        let recv = ins.recv.iter().map(|m| (m.peer, true));
        for (peer, receiving) in recv.chain(ins.send.iter().map(|m| (m.peer, false))) {
            let waiting = !receiving || t.peek(peer, channel as u32)?.is_none();
            if waiting && t.departed(peer) {
                return Err(CommError::PeerFailed {
                    rank: peer,
                    reason: format!(
                        "left the group (its communicator was dropped) before call #{} ({}) finished",
                        task.number, task.signature
                    ),
                });
            }
        }
    }
    Ok(())
}

fn check_header(h: &Header, peer: Rank, task: &Task) -> Result<(), CommError> {
    if h.call == task.number && !h.same_call(task.number, task.signature) {
        return Err(CommError::Mismatch {
            call: task.number,
            rank: task.rank,
            other: peer,
            expected: h.signature().to_owned(),
            got: task.signature.to_owned(),
        });
    }
    Ok(())
}

/// Fire `ins` if it can fire now.
fn try_fire<T: Reduce>(
    t: &mut dyn Transport,
    task: &Task,
    channel: u32,
    ins: &Instruction,
    call: &mut CallState,
) -> Result<bool, CommError> {
    let mut incoming: Vec<Incoming> = Vec::with_capacity(ins.recv.len());
    for m in &ins.recv {
        match t.peek(m.peer, channel)? {
            Some(msg) => incoming.push(msg),
            None => return Ok(false),
        }
    }
    let bytes = ins.bytes as usize;
    let reader = t.peer_reader();
    let heaps = t.heaps();
    let arrived = receive::<T>(
        t,
        task,
        channel,
        ins,
        &incoming,
        call,
        (reader.is_some(), heaps.as_deref()),
    )?;
    let read = ins.read.as_ref().map(|r| task.spans::<T>(r));
    let write = ins.write.as_ref().map(|w| task.spans::<T>(w));
    // A reference must fit a slot (a value of many pieces may not).
    let slot = t.max_message().unwrap_or(0);
    let lending = lend::<T>(
        ins,
        bytes,
        read.as_deref(),
        write.as_deref(),
        reader.is_some(),
        heaps.as_deref(),
    )
    .filter(|(_, p)| zero_copy::reference_bytes(p.len()) <= slot);
    let room = lending
        .as_ref()
        .map_or(bytes, |(_, p)| zero_copy::reference_bytes(p.len()));
    let mut outgoing: Vec<*mut T> = Vec::with_capacity(ins.send.len());
    for m in &ins.send {
        match t.reserve(m.peer, channel, room)? {
            Some(room) => outgoing.push(room as *mut T),
            None => return Ok(false),
        }
    }
    // Peers that posted where this value goes get it written there.
    let mut direct_to: Vec<Option<*mut T>> = vec![None; ins.send.len()];
    if heaps.is_some() && bytes > 0 {
        for (d, m) in direct_to.iter_mut().zip(&ins.send) {
            *d = t.take_post(m.peer, channel, bytes).map(|p| p as *mut T);
            // A post from another process is checked like anything else.
            if d.is_some_and(|p| !p.is_aligned()) {
                t.give_back_post(m.peer, channel);
                *d = None;
            }
        }
    }
    let mut rooms: Vec<*mut T> = direct_to.iter().flatten().copied().collect();
    if lending.is_none() {
        rooms.extend(
            outgoing
                .iter()
                .zip(&direct_to)
                .filter(|(_, d)| d.is_none())
                .map(|(&r, _)| r),
        );
    }
    let step = Step {
        op: task.plan.op,
        incoming: &incoming,
        references: &arrived.references,
        peers: &ins.recv.iter().map(|m| m.peer).collect::<Vec<_>>(),
        read: read.as_deref(),
        write: write.as_deref(),
        rooms: &rooms,
        len: bytes / std::mem::size_of::<T>(),
    };
    if let Err(e) = value(t, &step, arrived.landed, reader.as_deref()) {
        for (d, m) in direct_to.iter().zip(&ins.send) {
            if d.is_some() {
                t.give_back_post(m.peer, channel);
            }
        }
        return Err(e);
    }
    // Streaming stores must land before the counters that publish them.
    ferrocoll_core::kernels::stream_fence();
    let sent = Sent {
        channel,
        lending: lending.as_ref(),
        outgoing: &outgoing,
        direct_to: &direct_to,
    };
    publish(t, task, ins, &sent, call)?;
    Ok(true)
}

/// What arrived for a step: references to resolve, and whether the
/// value was written into this rank's output by its sender.
struct Arrived {
    references: Vec<Option<Ref>>,
    landed: bool,
}

/// Check every incoming message's header against this call, and what
/// each carries: a copy, a reference, or word that the sender wrote the
/// value where this rank posted.
fn receive<T>(
    t: &mut dyn Transport,
    task: &Task,
    channel: u32,
    ins: &Instruction,
    incoming: &[Incoming],
    call: &CallState,
    (reading, heaps): (bool, Option<&Heaps>),
) -> Result<Arrived, CommError> {
    let bytes = ins.bytes as usize;
    let mut arrived = Arrived {
        references: Vec::with_capacity(incoming.len()),
        landed: false,
    };
    for (msg, m) in incoming.iter().zip(&ins.recv) {
        let header = t.peek_header(m.peer, channel).expect("peeked above");
        check_header(&header, m.peer, task)?;
        if msg.call != task.number || msg.len != bytes {
            return Err(CommError::Mismatch {
                call: task.number,
                rank: task.rank,
                other: m.peer,
                expected: format!(
                    "{} (call #{}, {} bytes in this message)",
                    header.signature(),
                    msg.call,
                    msg.len
                ),
                got: format!("{} ({bytes} bytes expected)", task.signature),
            });
        }
        if header.was_written() {
            let posted = ins.direct.is_some() && ins.recv.len() == 1 && ins.read.is_none();
            let seq = call.bases.as_ref().map(|b| b.seq(m.peer, channel, m.index));
            if !(posted && seq.is_some_and(|seq| t.post_taken(m.peer, channel, seq))) {
                return Err(protocol_error(
                    m.peer,
                    "a value written into this rank's memory without its post".into(),
                ));
            }
            arrived.landed = true;
            arrived.references.push(None);
            continue;
        }
        arrived.references.push(if header.by_reference() {
            if !reading && heaps.is_none() {
                return Err(protocol_error(
                    m.peer,
                    "a message by reference in a group that copies".into(),
                ));
            }
            let pieces = reference(t, msg, m.peer, bytes)?;
            let shown = (reading, heaps, std::mem::size_of::<T>());
            Some(resolve(&header, pieces, m.peer, shown)?)
        } else {
            None
        });
    }
    Ok(arrived)
}

/// Compute the step's value into its rooms and write: from the write
/// itself when the sender already put it there, through references, or
/// from the messages' slots.
fn value<T: Reduce>(
    t: &mut dyn Transport,
    step: &Step<'_, T>,
    landed: bool,
    reader: Option<&PeerReader>,
) -> Result<(), CommError> {
    if landed {
        let write = step.write.expect("a direct receive writes");
        for &room in step.rooms {
            // SAFETY: the value lies in this rank's write (posted as one
            // piece of `len` elements); rooms are slots or peers' posted
            // destinations, apart from it.
            unsafe { scatter_from(write, room, step.len) };
        }
    } else if step.references.iter().any(Option::is_some) {
        // SAFETY: as for `compute` below; references were checked to
        // describe exactly the step's bytes.
        unsafe { fire_by_reference(reader, step)? };
        // A sender that failed may have handed its buffers back to its
        // caller before this read: its failure, not what was read, counts.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        t.check()?;
    } else if step.len > 0 {
        let sources: Vec<*const T> = step
            .incoming
            .iter()
            .map(|m| m.payload as *const T)
            .collect();
        // SAFETY: incoming payloads hold `len` elements (checked) and stay
        // put until released; rooms hold `len` elements and are this rank's
        // alone until committed (or a peer's posted destination, which its
        // owner leaves alone until the message arrives); local spans lie in
        // the caller's buffers, which hold the plan's buffer sizes.
        unsafe {
            compute(
                step.op, &sources, step.read, step.write, step.rooms, step.len,
            )
        };
    }
    Ok(())
}

/// How a step's value leaves: its channel, the reference it lends (if
/// any), the reserved rooms, and which sends were written directly.
struct Sent<'a, T> {
    channel: u32,
    lending: Option<&'a (bool, Pieces)>,
    outgoing: &'a [*mut T],
    direct_to: &'a [Option<*mut T>],
}

/// Commit every send — written directly, by reference, or as a copy —
/// then release every message consumed (and spend its post).
fn publish<T>(
    t: &mut dyn Transport,
    task: &Task,
    ins: &Instruction,
    sent: &Sent<'_, T>,
    call: &mut CallState,
) -> Result<(), CommError> {
    let channel = sent.channel;
    let plain = Header::new(task.number, ins.bytes as usize, task.signature);
    let mut header = plain.clone();
    if let Some((in_heap, pieces)) = sent.lending {
        header = if *in_heap {
            header.referring_to_heap()
        } else {
            header.referring()
        };
        for ((&room, m), d) in sent.outgoing.iter().zip(&ins.send).zip(sent.direct_to) {
            if d.is_none() {
                // SAFETY: the room was reserved for exactly this reference.
                unsafe { zero_copy::write_reference(room.cast(), pieces) };
                call.lent.push((m.peer, channel));
            }
        }
    }
    for (m, d) in ins.send.iter().zip(sent.direct_to) {
        if d.is_some() {
            call.written += 1;
            t.commit(m.peer, channel, &plain.clone().written())?;
        } else {
            t.commit(m.peer, channel, &header)?;
        }
    }
    for m in &ins.recv {
        t.release(m.peer, channel)?;
        if let Some(bases) = &call.bases {
            t.clear_post(m.peer, channel, bases.seq(m.peer, channel, m.index));
        }
    }
    Ok(())
}

/// The pieces of a message sent by reference, checked: only a group
/// that reads peers' memory sends them, and they must name the message's
/// length exactly.
fn reference(
    t: &mut dyn Transport,
    msg: &Incoming,
    peer: Rank,
    bytes: usize,
) -> Result<Pieces, CommError> {
    let protocol = |e: String| protocol_error(peer, e);
    // Only shared memory lends, and its slots hold at least 64 bytes.
    let Some(room) = t.max_message().filter(|&r| r >= 64) else {
        return Err(protocol(
            "a message by reference over a transport without slots".into(),
        ));
    };
    // SAFETY: the payload sits in a slot of `room` bytes, 8-aligned.
    unsafe { zero_copy::read_reference(msg.payload, room, bytes) }.map_err(protocol)
}

fn protocol_error(peer: Rank, e: String) -> CommError {
    CommError::PeerFailed {
        rank: peer,
        reason: format!("protocol error: {e}"),
    }
}

/// Where a referenced value can be read from.
enum Ref {
    /// Pieces of the sender's shared heap, mapped here: plain loads.
    Mapped(Pieces),
    /// Addresses in the sender's process: cross-memory attach.
    Remote(Pieces),
}

/// A checked reference as something this rank can read: heap offsets
/// inside the sender's heap, or addresses when the group reads peers'
/// memory.
fn resolve(
    header: &Header,
    pieces: Pieces,
    peer: Rank,
    (reading, heaps, element): (bool, Option<&Heaps>, usize),
) -> Result<Ref, CommError> {
    // Kernels read whole, aligned elements; an honest sender's pieces are.
    if let Some(&(at, n)) = pieces
        .iter()
        .find(|&&(at, n)| at % element != 0 || n % element != 0)
    {
        return Err(protocol_error(
            peer,
            format!("a reference to [{at:#x}, +{n}) is not whole {element}-byte elements"),
        ));
    }
    if header.in_heap() {
        let heaps = heaps.ok_or_else(|| {
            protocol_error(
                peer,
                "a shared-heap reference in a group without heaps".into(),
            )
        })?;
        let mapped = heaps
            .translate(peer, &pieces)
            .map_err(|e| protocol_error(peer, e))?;
        return Ok(Ref::Mapped(mapped));
    }
    if !reading {
        return Err(protocol_error(
            peer,
            "a message by reference in a group that copies".into(),
        ));
    }
    Ok(Ref::Remote(pieces))
}

/// How this step sends its value, when not as a copy: `(true, offsets)`
/// when the value lies in this rank's shared heap, `(false, addresses)`
/// when the group reads peers' memory — and only where the plan keeps the
/// value stable until every receiver has read it.
fn lend<T>(
    ins: &Instruction,
    bytes: usize,
    read: Option<&[Span]>,
    write: Option<&[Span]>,
    reading: bool,
    heaps: Option<&Heaps>,
) -> Option<(bool, Pieces)> {
    if bytes == 0 || ins.send.is_empty() {
        return None;
    }
    let pieces = match ins.source {
        Source::Write => as_pieces::<T>(write?),
        Source::Read => as_pieces::<T>(read?),
        Source::Slot => return None,
    };
    if let Some(offsets) = heaps.and_then(|h| h.own.offsets(&pieces)) {
        return Some((true, offsets));
    }
    reading.then_some((false, pieces))
}

/// Local spans as (address, bytes) pieces.
fn as_pieces<T>(spans: &[Span]) -> Pieces {
    let size = std::mem::size_of::<T>();
    spans.iter().map(|&(_, a, n)| (a, n * size)).collect()
}

/// One step whose incoming messages include references.
struct Step<'a, T> {
    op: ReduceOp,
    incoming: &'a [Incoming],
    references: &'a [Option<Ref>],
    peers: &'a [Rank],
    read: Option<&'a [Span]>,
    write: Option<&'a [Span]>,
    rooms: &'a [*mut T],
    len: usize,
}

/// Run a step with values read by reference: one reference with nothing
/// else to do is copied straight into the output; references into
/// mapped heaps, each one piece, are reduced from where they lie; the rest
/// a block at a time through bounce buffers that stay in cache, each block
/// computed as [`compute`] would (whole, when read and write overlap in a
/// way blocks could break).
///
/// # Safety
/// As [`compute`]: spans, rooms and slot payloads are valid for the
/// step's length; mapped references were checked to lie in the sender's
/// heap.
unsafe fn fire_by_reference<T: Reduce>(
    reader: Option<&PeerReader>,
    s: &Step<'_, T>,
) -> Result<(), CommError> {
    let size = std::mem::size_of::<T>();
    let fetch = |i: usize, r: &Ref, from: usize, len: usize, to: &[(usize, usize)]| match r {
        Ref::Remote(p) => reader
            .expect("remote references are resolved only with a reader")
            .read(s.peers[i], &zero_copy::range(p, from, len), to),
        Ref::Mapped(p) => {
            for (src, dst, n) in zero_copy::pair_up(&zero_copy::range(p, from, len), to) {
                // SAFETY: `src` lies in a peer's mapped heap (checked),
                // `dst` in this rank's output or bounce buffer.
                unsafe { copy_long(src as *const u8, dst as *mut u8, n) };
            }
            Ok(())
        }
    };
    if let ([Some(r)], None, Some(write), []) = (s.references, s.read, s.write, s.rooms) {
        return fetch(0, r, 0, s.len * size, &as_pieces::<T>(write));
    }
    let in_place: Option<Vec<*const T>> = s
        .references
        .iter()
        .zip(s.incoming)
        .map(|(r, msg)| match r {
            None => Some(msg.payload as *const T),
            Some(Ref::Mapped(p)) if p.len() == 1 => Some(p[0].0 as *const T),
            Some(_) => None,
        })
        .collect();
    if let Some(sources) = in_place {
        // SAFETY: every source covers `len` elements (a slot payload, or a
        // checked heap range of exactly the message's bytes).
        unsafe { compute(s.op, &sources, s.read, s.write, s.rooms, s.len) };
        return Ok(());
    }
    let lent = s.references.iter().filter(|r| r.is_some()).count().max(1);
    let blockwise = match (s.read, s.write) {
        (Some(r), Some(w)) => r == w || !overlap::<T>(r, w),
        _ => true,
    };
    let block = if blockwise {
        (BOUNCE_BYTES / lent / size).max(64)
    } else {
        s.len.max(1)
    };
    let mut bounces: Vec<Vec<u64>> = s
        .references
        .iter()
        .map(|r| match r {
            Some(_) => vec![0u64; (block.min(s.len) * size).div_ceil(8)],
            None => Vec::new(),
        })
        .collect();
    let mut start = 0;
    while start < s.len {
        let n = block.min(s.len - start);
        let mut sources: Vec<*const T> = Vec::with_capacity(s.references.len());
        for (i, r) in s.references.iter().enumerate() {
            match r {
                Some(r) => {
                    let bounce = bounces[i].as_mut_ptr() as usize;
                    fetch(i, r, start * size, n * size, &[(bounce, n * size)])?;
                    sources.push(bounce as *const T);
                }
                // SAFETY: the payload holds `len` elements.
                None => sources.push(unsafe { (s.incoming[i].payload as *const T).add(start) }),
            }
        }
        let read = s.read.map(|r| sub_spans::<T>(r, start, n));
        let write = s.write.map(|w| sub_spans::<T>(w, start, n));
        // SAFETY: rooms hold `len` elements.
        let rooms: Vec<*mut T> = s.rooms.iter().map(|p| unsafe { p.add(start) }).collect();
        // SAFETY: every pointer covers this block (the caller's contract,
        // cut to the block).
        unsafe { compute(s.op, &sources, read.as_deref(), write.as_deref(), &rooms, n) };
        start += n;
    }
    Ok(())
}

/// The spans of elements `[start, start + n)` of a value, re-based so the
/// block starts at offset 0.
fn sub_spans<T>(spans: &[Span], start: usize, n: usize) -> Vec<Span> {
    let size = std::mem::size_of::<T>();
    spans
        .iter()
        .filter_map(|&(offset, address, elems)| {
            let (lo, hi) = (offset.max(start), (offset + elems).min(start + n));
            (lo < hi).then(|| (lo - start, address + (lo - offset) * size, hi - lo))
        })
        .collect()
}

/// Whether any read span shares bytes with any write span.
fn overlap<T>(read: &[Span], write: &[Span]) -> bool {
    let size = std::mem::size_of::<T>();
    read.iter().any(|&(_, r, rn)| {
        write
            .iter()
            .any(|&(_, w, wn)| r < w + wn * size && w < r + rn * size)
    })
}

/// The step's value — the reduction of the messages and the local read —
/// into the first outgoing room (or the write), then copied to the rest.
///
/// # Safety
/// See the call site: every pointer is valid for the stated lengths,
/// rooms overlap nothing else, and messages overlap no local memory.
unsafe fn compute<T: Reduce>(
    op: ReduceOp,
    messages: &[*const T],
    read: Option<&[Span]>,
    write: Option<&[Span]>,
    outgoing: &[*mut T],
    len: usize,
) {
    // SAFETY: as below; the fused path checks that no destination
    // overlaps a source.
    if unsafe { fused(op, messages, read, write, outgoing, len) } {
        return;
    }
    // A room may be the very bytes a message is read from (a peer lends a
    // block and posts the same block for the answer): only the fused
    // kernel may write over a source; here, stage the value first.
    let size = std::mem::size_of::<T>();
    let span = |p: usize, n: usize| p..p + n * size;
    let room_meets = |room: usize| {
        messages
            .iter()
            .any(|&m| ranges_meet(&span(room, len), &span(m as usize, len)))
            || read.is_some_and(|r| {
                r.iter()
                    .any(|&(_, a, n)| ranges_meet(&span(room, len), &span(a, n)))
            })
    };
    if outgoing.iter().any(|&r| room_meets(r as usize)) {
        let mut value: Vec<T> = Vec::with_capacity(len);
        // SAFETY: the staged value is fresh memory of `len` elements; the
        // sources are valid as the caller guarantees; every room and the
        // write then get a copy of it.
        unsafe {
            combine(op, messages, read, value.as_mut_ptr(), len);
            value.set_len(len);
            for &room in outgoing {
                copy_long(value.as_ptr().cast(), room.cast(), len * size);
            }
            if let Some(write) = write {
                scatter(value.as_ptr(), write);
            }
        }
        return;
    }
    // SAFETY: every pointer below is valid for the lengths used, as the
    // caller guarantees; the one in-place kernel call passes its
    // destination as exactly its first source, as `Reduce::reduce` allows.
    unsafe {
        if let Some((&first, rest)) = outgoing.split_first() {
            combine(op, messages, read, first, len);
            for &room in rest {
                std::ptr::copy_nonoverlapping(first, room, len);
            }
            if let Some(write) = write {
                scatter(first, write);
            }
            return;
        }
        let Some(write) = write else { return };
        match read {
            // The common in-place case (reduce into what was read): the
            // kernel may write over its first source element for element.
            Some(read) if read == write => {
                for &(offset, address, n) in write {
                    let mut srcs = vec![address as *const T];
                    srcs.extend(messages.iter().map(|m| m.add(offset)));
                    if srcs.len() > 1 {
                        T::reduce(op, &srcs, address as *mut T, n);
                    }
                }
            }
            None => {
                for &(offset, address, n) in write {
                    let srcs: Vec<*const T> = messages.iter().map(|m| m.add(offset)).collect();
                    put(op, &srcs, address as *mut T, n);
                }
            }
            // Read and write apart (out of place): reduce straight into the
            // write, piece by piece where the two regions' pieces meet.
            Some(read) if !overlap::<T>(read, write) => {
                let size = std::mem::size_of::<T>();
                for &(offset, address, n) in write {
                    for (at, from, m) in sub_spans::<T>(read, offset, n) {
                        let mut srcs = vec![from as *const T];
                        srcs.extend(messages.iter().map(|p| p.add(offset + at)));
                        put(op, &srcs, (address + at * size) as *mut T, m);
                    }
                }
            }
            // Read and write overlap without coinciding: stage.
            Some(read) => {
                let mut value: Vec<T> = Vec::with_capacity(len);
                combine(op, messages, Some(read), value.as_mut_ptr(), len);
                value.set_len(len);
                scatter(value.as_ptr(), write);
            }
        }
    }
}

/// The value reduced into every room and the write in one pass (the
/// fused streaming kernel: f32/f64 sums) — the pass that makes a direct
/// write cost nothing extra. Only for long values whose read and write are
/// each one whole span and whose destinations overlap no source; `false`
/// (having done nothing) otherwise.
///
/// # Safety
/// As [`compute`].
unsafe fn fused<T: Reduce>(
    op: ReduceOp,
    messages: &[*const T],
    read: Option<&[Span]>,
    write: Option<&[Span]>,
    outgoing: &[*mut T],
    len: usize,
) -> bool {
    let size = std::mem::size_of::<T>();
    let whole = |s: &[Span]| matches!(s, [(0, _, n)] if *n == len);
    if len * size < STREAM_MIN_BYTES
        || outgoing.is_empty()
        || !read.is_none_or(whole)
        || !write.is_none_or(whole)
    {
        return false;
    }
    let mut srcs: Vec<*const T> = messages.to_vec();
    srcs.extend(read.map(|r| r[0].1 as *const T));
    let mut dsts: Vec<*mut T> = outgoing.to_vec();
    dsts.extend(write.map(|w| w[0].1 as *mut T));
    let span = |p: usize| p..p + len * size;
    // In place the write is exactly the read: the kernel allows that.
    let apart = dsts.iter().all(|&d| {
        srcs.iter().all(|&s| {
            std::ptr::eq(d.cast_const(), s) || !ranges_meet(&span(d as usize), &span(s as usize))
        })
    });
    // Streaming over lines just loaded would evict each first: in place,
    // store through the cache.
    let aliased = dsts
        .iter()
        .any(|&d| srcs.iter().any(|&s| std::ptr::eq(d.cast_const(), s)));
    let choice = if aliased {
        ferrocoll_core::kernels::chosen().cached()
    } else {
        ferrocoll_core::kernels::chosen()
    };
    // SAFETY: every pointer covers `len` elements (the caller's contract);
    // destinations overlap no source but exactly (checked) and no other
    // destination (rooms, peers' posts and this rank's write are distinct
    // buffers).
    apart && srcs.len() > 1 && unsafe { T::reduce_stream_with(choice, op, &srcs, &dsts, len) }
}

fn ranges_meet(a: &std::ops::Range<usize>, b: &std::ops::Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// `dst[..len]` = reduction of the messages and the read pieces.
unsafe fn combine<T: Reduce>(
    op: ReduceOp,
    messages: &[*const T],
    read: Option<&[Span]>,
    dst: *mut T,
    len: usize,
) {
    // SAFETY: forwarded from `compute`'s caller.
    unsafe {
        match read {
            Some(read) => {
                for &(offset, address, n) in read {
                    let mut srcs = vec![address as *const T];
                    srcs.extend(messages.iter().map(|m| m.add(offset)));
                    put(op, &srcs, dst.add(offset), n);
                }
            }
            None => put(op, messages, dst, len),
        }
    }
}

/// Reduce `srcs` into `dst`, or copy a single source. Long reductions
/// take the fused streaming kernel where the type and op have one (the
/// calibrated stores: no read-for-ownership of a destination that will not
/// be read again soon).
unsafe fn put<T: Reduce>(op: ReduceOp, srcs: &[*const T], dst: *mut T, n: usize) {
    // SAFETY: forwarded; `dst` overlaps no source here.
    unsafe {
        match srcs {
            [] => {}
            [one] => copy_long(one.cast(), dst.cast(), n * std::mem::size_of::<T>()),
            _ if n * std::mem::size_of::<T>() >= STREAM_MIN_BYTES
                && T::reduce_stream(op, srcs, &[dst], n) => {}
            _ => T::reduce(op, srcs, dst, n),
        }
    }
}

/// Copy `bytes`; long copies stream past the cache when the calibration
/// chose non-temporal stores (no read-for-ownership of each line).
///
/// # Safety
/// As `copy_nonoverlapping`.
unsafe fn copy_long(src: *const u8, dst: *mut u8, bytes: usize) {
    use ferrocoll_core::kernels::{Stores, chosen, stream_copy};
    // SAFETY: forwarded from the caller.
    unsafe {
        if bytes >= STREAM_MIN_BYTES && chosen().stores() == Stores::NonTemporal {
            stream_copy(src, dst, bytes);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, bytes);
        }
    }
}

/// Copy the value held by `write` (its spans, in value order) into one
/// contiguous room of `len` elements.
///
/// # Safety
/// The spans and the room are valid for the value's length and apart.
unsafe fn scatter_from<T>(write: &[Span], room: *mut T, len: usize) {
    let size = std::mem::size_of::<T>();
    for &(offset, address, n) in write {
        debug_assert!(offset + n <= len);
        // SAFETY: forwarded from the caller.
        unsafe { copy_long(address as *const u8, room.add(offset).cast(), n * size) };
    }
}

/// Copy a contiguous value out to the write pieces.
unsafe fn scatter<T>(value: *const T, write: &[Span]) {
    for &(offset, address, n) in write {
        // SAFETY: forwarded; the value is a message room or a staging
        // vector, never the destination.
        unsafe {
            copy_long(
                value.add(offset).cast(),
                address as *mut u8,
                n * std::mem::size_of::<T>(),
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_a_rank_cannot_honour_are_protocol_errors() {
        let header = Header::new(1, 64, "x");
        let refused = |h: &Header, pieces: Pieces, reading: bool| {
            matches!(
                resolve(h, pieces, 3, (reading, None, 4)),
                Err(CommError::PeerFailed { rank: 3, .. })
            )
        };
        // Heap offsets in a group without heaps; addresses where nobody
        // reads peers; pieces that are not whole, aligned elements.
        assert!(refused(
            &header.clone().referring_to_heap(),
            vec![(0, 64)],
            true
        ));
        assert!(refused(
            &header.clone().referring(),
            vec![(0x1000, 64)],
            false
        ));
        assert!(refused(
            &header.clone().referring(),
            vec![(0x1002, 64)],
            true
        ));
        assert!(refused(
            &header.clone().referring(),
            vec![(0x1000, 62)],
            true
        ));
        assert!(matches!(
            resolve(&header.referring(), vec![(0x1000, 64)], 3, (true, None, 4)),
            Ok(Ref::Remote(_))
        ));
    }

    #[test]
    fn blocks_of_spans_are_rebased_and_overlap_is_seen() {
        // Two pieces: elements 0..4 at 0x100, 4..10 at 0x900 (4-byte elements).
        let spans = [(0, 0x100, 4), (4, 0x900, 6)];
        assert_eq!(
            sub_spans::<u32>(&spans, 2, 4),
            [(0, 0x108, 2), (2, 0x900, 2)]
        );
        assert_eq!(sub_spans::<u32>(&spans, 8, 5), [(0, 0x910, 2)]);
        assert!(sub_spans::<u32>(&spans, 10, 3).is_empty());
        assert!(overlap::<u32>(&[(0, 0x100, 4)], &[(0, 0x10c, 4)]));
        assert!(!overlap::<u32>(&[(0, 0x100, 4)], &[(0, 0x110, 4)]));
    }
}
