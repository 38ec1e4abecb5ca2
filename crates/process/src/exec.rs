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

use std::time::{Duration, Instant};

use ferrocoll_core::comm::CommError;
use ferrocoll_core::plan::{ExecutionPlan, Instruction, RankPlan, Region, Walk};
use ferrocoll_core::{Rank, Reduce, ReduceOp};

use crate::transport::{Incoming, Transport};
use crate::wire::Header;

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

/// Run the rank's part of the plan, then divide for `Avg`.
pub(crate) fn execute<T: Reduce>(t: &mut dyn Transport, task: &Task) -> Result<(), CommError> {
    let mut walk = Walk::new(task.rank_plan());
    let mut deadline = Instant::now() + task.timeout;
    loop {
        let seen = t.ticket();
        let mut progressed = false;
        for channel in 0..walk.channels() {
            while let Some((_, ins)) = walk.ready(channel) {
                if !try_fire::<T>(t, task, channel as u32, ins)? {
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
    Ok(())
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
) -> Result<bool, CommError> {
    let mut incoming: Vec<Incoming> = Vec::with_capacity(ins.recv.len());
    for m in &ins.recv {
        match t.peek(m.peer, channel)? {
            Some(msg) => incoming.push(msg),
            None => return Ok(false),
        }
    }
    let bytes = ins.bytes as usize;
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
    }
    let mut outgoing: Vec<*mut T> = Vec::with_capacity(ins.send.len());
    for m in &ins.send {
        match t.reserve(m.peer, channel, bytes)? {
            Some(room) => outgoing.push(room as *mut T),
            None => return Ok(false),
        }
    }
    let sources: Vec<*const T> = incoming.iter().map(|m| m.payload as *const T).collect();
    let read = ins.read.as_ref().map(|r| task.spans::<T>(r));
    let write = ins.write.as_ref().map(|w| task.spans::<T>(w));
    let len = bytes / std::mem::size_of::<T>();
    if len > 0 {
        // SAFETY: incoming payloads hold `len` elements (checked above) and
        // stay put until released below; reserved rooms hold `len` elements
        // and are this rank's alone until committed; local spans lie in
        // the caller's buffers, which hold the plan's buffer sizes (the
        // communicator checked the call's shape).
        unsafe {
            compute(
                task.plan.op,
                &sources,
                read.as_deref(),
                write.as_deref(),
                &outgoing,
                len,
            )
        };
    }
    let header = Header::new(task.number, bytes, task.signature);
    for m in &ins.send {
        t.commit(m.peer, channel, &header)?;
    }
    for m in &ins.recv {
        t.release(m.peer, channel)?;
    }
    Ok(true)
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
            // Read and write differ: stage, since they may overlap.
            Some(read) => {
                let mut value: Vec<T> = Vec::with_capacity(len);
                combine(op, messages, Some(read), value.as_mut_ptr(), len);
                value.set_len(len);
                scatter(value.as_ptr(), write);
            }
        }
    }
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

/// Reduce `srcs` into `dst`, or copy a single source.
unsafe fn put<T: Reduce>(op: ReduceOp, srcs: &[*const T], dst: *mut T, n: usize) {
    // SAFETY: forwarded; `dst` overlaps no source here.
    unsafe {
        match srcs {
            [] => {}
            [one] => std::ptr::copy_nonoverlapping(*one, dst, n),
            _ => T::reduce(op, srcs, dst, n),
        }
    }
}

/// Copy a contiguous value out to the write pieces.
unsafe fn scatter<T>(value: *const T, write: &[Span]) {
    for &(offset, address, n) in write {
        // SAFETY: forwarded; the value is a message room or a staging
        // vector, never the destination.
        unsafe { std::ptr::copy_nonoverlapping(value.add(offset), address as *mut T, n) };
    }
}
