//! Runs one rank's part of an execution plan over a rank's [`Links`]:
//! the one host executor, for threads and processes alike.
//!
//! Every channel advances round-robin; an instruction fires when its
//! messages are there, its outgoing links have room and its waits are
//! met. A value is reduced straight into the first outgoing message's
//! room (or into the destination when nothing is sent) and read straight
//! out of the incoming messages, so each byte is written once per hop.
//! Every message carries the call's header; the first one that disagrees
//! with this rank's call is a [`CommError::Mismatch`].
//!
//! Where a value the plan keeps stable ([`Source`]) lies in the sender's
//! heap (`zero_copy`; on threads every buffer does), it goes by reference
//! instead: the message names where it lies, the receiver reads it from
//! there (into its output, reduced where it lies, or a block at a time
//! through a cached buffer), and the sender returns only once every such
//! message was consumed. Where the receiver posted its output
//! (`direct.rs`), the sender writes the value there itself. A step fires
//! by one `match` over which of these its inputs are (`Inputs`). Every
//! touch of a peer's memory lies between [`Links::begin_movement`] and
//! [`Links::end_movement`].

use std::time::{Duration, Instant};

use crate::comm::CommError;
use crate::kernels::Destination;
use crate::kernels::Reduce;
use crate::plan::{ExecutionPlan, Instruction, RankPlan, Region, Source, Walk};
use crate::types::{Rank, ReduceOp};

use super::Header;
use super::HeapMap;
use super::direct::{self, Bases, Postables};
use super::zero_copy::{self, Pieces};
use super::{Incoming, Links};

mod compute;
mod reference;
#[cfg(test)]
mod tests;

use compute::{Sink, compute, copy_long, scatter_from};
use reference::{Step, as_pieces, fire_by_reference, lend, protocol_error, reference, resolve};

/// One rank's task in one call.
pub struct Task<'a> {
    /// The call's plan (every rank's part; this rank runs its own).
    pub plan: &'a ExecutionPlan,
    /// This rank.
    pub rank: Rank,
    /// Base addresses of the input, output and scratch buffers (in place,
    /// the output's).
    pub bases: [usize; 3],
    /// The call's number on this communicator.
    pub number: u64,
    /// What every message of the call carries in its header.
    pub signature: &'a str,
    /// The longest this rank waits without progress before failing.
    pub timeout: Duration,
    /// The call's kernel variant: its stores by the call's bytes.
    pub kernels: crate::kernels::KernelChoice,
    /// Times the kernels of a watched call.
    pub meter: &'a crate::kernels::Meter,
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
/// many messages went by reference. On error, returns only once its posts
/// are withdrawn and the links gave up ([`Links::give_up`]).
///
/// # Safety
/// `task.bases` are the addresses of this rank's input, output and
/// scratch buffers, valid for the plan's sizes of each (input and output
/// the same buffer in place), exclusively the executor's for the call
/// except for the plan's own reads and writes by peers; `T` is the call's
/// element type; and `t` keeps the [`Links`] contract. The plan passed the
/// verifier, so every region lies inside its buffer.
pub unsafe fn execute<T: Reduce, L: Links + ?Sized>(
    t: &mut L,
    task: &Task,
) -> Result<u64, CommError> {
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
    let result = walk_plan::<T, _>(t, task, &mut call);
    if let Err(e) = &result {
        if let Some(bases) = &call.bases {
            direct::withdraw_posts(t, bases, task.timeout);
        }
        t.give_up(e);
    }
    result
}

/// [`execute`]'s walk, drain and division.
fn walk_plan<T: Reduce, L: Links + ?Sized>(
    t: &mut L,
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
                if !walk.waits_met(ins) || !try_fire::<T, _>(t, task, channel as u32, ins, call)? {
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
fn drain<L: Links + ?Sized>(
    t: &mut L,
    task: &Task,
    lent: &mut Vec<(Rank, u32)>,
) -> Result<(), CommError> {
    lent.sort_unstable();
    lent.dedup();
    let deadline = Instant::now() + task.timeout;
    loop {
        let seen = t.ticket();
        lent.retain(|&(peer, channel)| t.unconsumed(peer, channel) > 0);
        let Some(&(peer, channel)) = lent.first() else {
            return Ok(());
        };
        t.check()?;
        // Look again once it is seen gone: a peer consumes, then leaves,
        // and may have done both since the look above.
        if t.departed(peer) && t.unconsumed(peer, channel) > 0 {
            return Err(CommError::PeerFailed {
                rank: peer,
                reason: format!(
                    "{} before reading call #{}'s data ({})",
                    t.farewell(peer),
                    task.number,
                    task.signature
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
fn find_mismatch<L: Links + ?Sized>(
    t: &mut L,
    task: &Task,
    channels: u32,
) -> Result<(), CommError> {
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

/// A peer this rank is blocked on that is gone (left the group, or its
/// process was lost): it will never send or consume again, so waiting out
/// the timeout would only delay the error.
fn find_departed<L: Links + ?Sized>(t: &mut L, task: &Task, walk: &Walk) -> Result<(), CommError> {
    for channel in 0..walk.channels() {
        let Some((_, ins)) = walk.next(channel) else {
            continue;
        };
        let recv = ins.recv.iter().map(|m| (m.peer, true));
        for (peer, receiving) in recv.chain(ins.send.iter().map(|m| (m.peer, false))) {
            let waiting = !receiving || t.peek(peer, channel as u32)?.is_none();
            // Look again once it is seen gone: a peer sends, then leaves,
            // and may have done both since the look above.
            if waiting
                && t.departed(peer)
                && (!receiving || t.peek(peer, channel as u32)?.is_none())
            {
                return Err(CommError::PeerFailed {
                    rank: peer,
                    reason: format!(
                        "{} before call #{} ({}) finished",
                        t.farewell(peer),
                        task.number,
                        task.signature
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
fn try_fire<T: Reduce, L: Links + ?Sized>(
    t: &mut L,
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
    let heaps = t.heaps();
    let arrived = receive::<T, _>(t, task, channel, ins, &incoming, call, heaps.as_deref())?;
    let read = ins.read.as_ref().map(|r| task.spans::<T>(r));
    let write = ins.write.as_ref().map(|w| task.spans::<T>(w));
    // A reference must fit a slot (a value of many pieces may not).
    let slot = t.max_message().unwrap_or(0);
    let lending = lend::<T>(
        ins,
        bytes,
        read.as_deref(),
        write.as_deref(),
        heaps.as_deref(),
    )
    .filter(|p| zero_copy::reference_bytes(p.len()) <= slot)
    // Only peers that map this rank's heap can read a reference.
    .filter(|_| ins.send.iter().all(|m| t.heap_peer(m.peer)));
    let room = lending
        .as_ref()
        .map_or(bytes, |p| zero_copy::reference_bytes(p.len()));
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
        read: read.as_deref(),
        write: write.as_deref(),
        rooms: &rooms,
        // Slots are read by their receiver right away; a peer's posted
        // destination is its output.
        to: Sink {
            kernels: task.kernels,
            to: if direct_to.iter().any(Option::is_some) {
                Destination::Output
            } else {
                Destination::Handoff
            },
        },
        len: bytes / std::mem::size_of::<T>(),
    };
    // What the kernels read and write: every input, the write, every room.
    let values = step.incoming.len() + usize::from(step.read.is_some());
    let moved =
        (values + usize::from(step.write.is_some()) + step.rooms.len()) as u64 * bytes as u64;
    let moving = t.begin_movement().and_then(|()| {
        let done = task.meter.time(moved, || value(t, &step, arrived.inputs));
        // Streaming stores must land before the counters that publish
        // them, and before a peer that gives up may take its memory back.
        crate::kernels::stream_fence();
        t.end_movement();
        done
    });
    if let Err(e) = moving {
        for (d, m) in direct_to.iter().zip(&ins.send) {
            if d.is_some() {
                t.give_back_post(m.peer, channel);
            }
        }
        return Err(e);
    }
    let sent = Sent {
        channel,
        lending: lending.as_ref(),
        outgoing: &outgoing,
        direct_to: &direct_to,
    };
    publish(t, task, ins, &sent, call)?;
    Ok(true)
}

/// Where a step's inputs are: the one data source decides how it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inputs {
    /// The sender wrote the value where this rank posted (its output).
    Landed,
    /// At least one message names where its value lies in a peer's
    /// mapped shared heap.
    References,
    /// Every message carries its value in its slot (or there is none).
    Slots,
}

/// What arrived for a step: each message's reference, if it is one, and
/// where the inputs are.
struct Arrived {
    references: Vec<Option<Pieces>>,
    inputs: Inputs,
}

/// Check every incoming message's header against this call, and what
/// each carries: a copy, a reference, or word that the sender wrote the
/// value where this rank posted.
fn receive<T, L: Links + ?Sized>(
    t: &mut L,
    task: &Task,
    channel: u32,
    ins: &Instruction,
    incoming: &[Incoming],
    call: &CallState,
    heaps: Option<&HeapMap>,
) -> Result<Arrived, CommError> {
    let bytes = ins.bytes as usize;
    let mut arrived = Arrived {
        references: Vec::with_capacity(incoming.len()),
        inputs: Inputs::Slots,
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
            arrived.inputs = Inputs::Landed;
            arrived.references.push(None);
            continue;
        }
        arrived.references.push(if header.by_reference() {
            if heaps.is_none() {
                return Err(protocol_error(
                    m.peer,
                    "a message by reference in a group that copies".into(),
                ));
            }
            let pieces = reference(t, msg, m.peer, bytes)?;
            if arrived.inputs == Inputs::Slots {
                arrived.inputs = Inputs::References;
            }
            Some(resolve(
                &header,
                pieces,
                m.peer,
                (heaps, std::mem::size_of::<T>()),
            )?)
        } else {
            None
        });
    }
    Ok(arrived)
}

/// Compute the step's value into its rooms and write, by where its inputs
/// are: the write itself when the sender already put the value there,
/// peers' mapped heaps, or the messages' slots.
fn value<T: Reduce, L: Links + ?Sized>(
    t: &mut L,
    step: &Step<'_, T>,
    inputs: Inputs,
) -> Result<(), CommError> {
    match inputs {
        Inputs::Landed => {
            let write = step.write.expect("a direct receive writes");
            for &room in step.rooms {
                // SAFETY: the value lies in this rank's write (posted as one
                // piece of `len` elements); rooms are slots or peers' posted
                // destinations, apart from it.
                unsafe { scatter_from(write, room, step.len, step.to) };
            }
        }
        Inputs::References => {
            // SAFETY: as for `compute` below; references were checked to
            // describe exactly the step's bytes inside a peer's heap.
            unsafe { fire_by_reference(step) };
            // A sender that failed may have handed its buffers back to its
            // caller before this read: its failure, not what was read,
            // counts.
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            t.check()?;
        }
        Inputs::Slots if step.len == 0 => {}
        Inputs::Slots => {
            let sources: Vec<*const T> = step
                .incoming
                .iter()
                .map(|m| m.payload as *const T)
                .collect();
            // SAFETY: incoming payloads hold `len` elements (checked) and
            // stay put until released; rooms hold `len` elements and are
            // this rank's alone until committed (or a peer's posted
            // destination, which its owner leaves alone until the message
            // arrives); local spans lie in the caller's buffers, which hold
            // the plan's buffer sizes.
            unsafe {
                compute(
                    step.op, &sources, step.read, step.write, step.rooms, step.to, step.len,
                )
            };
        }
    }
    Ok(())
}

/// How a step's value leaves: its channel, the reference it lends (if
/// any), the reserved rooms, and which sends were written directly.
struct Sent<'a, T> {
    channel: u32,
    lending: Option<&'a Pieces>,
    outgoing: &'a [*mut T],
    direct_to: &'a [Option<*mut T>],
}

/// Commit every send — written directly, by reference, or as a copy —
/// then release every message consumed (and spend its post).
fn publish<T, L: Links + ?Sized>(
    t: &mut L,
    task: &Task,
    ins: &Instruction,
    sent: &Sent<'_, T>,
    call: &mut CallState,
) -> Result<(), CommError> {
    let channel = sent.channel;
    let plain = Header::new(task.number, ins.bytes as usize, task.signature);
    let mut header = plain.clone();
    if let Some(pieces) = sent.lending {
        header = header.referring_to_heap();
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
