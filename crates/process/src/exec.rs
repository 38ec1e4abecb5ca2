//! Runs one rank's share of a verified schedule over a [`Transport`].
//!
//! The same loop as the in-process executor — every channel advances
//! round-robin, a step fires when its messages are there, its outgoing
//! links have room and its `after` steps are done — but every message is
//! a copy: the step's value is reduced straight into the first outgoing
//! message's room (or into the destination when nothing is sent) and read
//! straight out of the incoming messages, so each byte is written once per
//! hop. Every message carries the call's header; the first one that
//! disagrees with this rank's call is a [`CommError::Mismatch`].

use std::time::{Duration, Instant};

use ferrocoll_core::comm::CommError;
use ferrocoll_core::cpu::Reduce;
use ferrocoll_core::schedule::layout::Layout;
use ferrocoll_core::schedule::progress::{Cursor, Progress};
use ferrocoll_core::schedule::{Schedule, Slice, Step};
use ferrocoll_core::{Rank, ReduceOp};

use crate::transport::{Incoming, Transport};
use crate::wire::Header;

/// One rank's view of one collective call.
pub(crate) struct Call<'a> {
    pub schedule: &'a Schedule,
    pub rank: Rank,
    pub in_place: bool,
    pub layout: Layout,
    pub op: ReduceOp,
    /// Base addresses of the physical input, output and scratch buffers.
    pub bases: [usize; 3],
    pub call: u64,
    pub signature: &'a str,
    pub timeout: Duration,
}

/// A contiguous run of a step's value in local memory: (offset into the
/// value, address, elements).
type Piece = (usize, usize, usize);

impl Call<'_> {
    fn pieces<T>(&self, segment: u32, slice: Slice, chunks: u32) -> Vec<Piece> {
        let (buffer, chunk) =
            self.schedule
                .physical(self.in_place, self.rank, slice.buffer, slice.chunk);
        let base = self.bases[buffer as usize];
        let size = std::mem::size_of::<T>();
        let mut offset = 0;
        self.layout
            .slice_ranges(segment, chunk, chunks)
            .into_iter()
            .map(|r| {
                let piece = (offset, base + r.start * size, r.len());
                offset += r.len();
                piece
            })
            .collect()
    }
}

/// Run every segment of the schedule for `call.rank`.
pub(crate) fn execute<T: Reduce>(t: &mut dyn Transport, call: &Call) -> Result<(), CommError> {
    let program = &call.schedule.ranks[call.rank as usize];
    let mut progress = Progress::new(program, call.layout.segments());
    let mut deadline = Instant::now() + call.timeout;
    loop {
        let seen = t.ticket();
        let mut progressed = false;
        for channel in 0..progress.channels() {
            while let Some((at, step)) = progress.next(channel) {
                if !progress.after_done(step, at)
                    || !try_fire::<T>(t, call, channel as u32, step, at)?
                {
                    break;
                }
                progressed = true;
                progress.advance(channel);
            }
        }
        if progress.done() {
            return Ok(());
        }
        if progressed {
            deadline = Instant::now() + call.timeout;
            continue;
        }
        t.check()?;
        find_mismatch(t, call, program.channels.len() as u32)?;
        find_departed(t, call, &progress)?;
        if Instant::now() >= deadline {
            return Err(CommError::Timeout {
                rank: call.rank,
                timeout: call.timeout,
                what: progress.describe(),
            });
        }
        t.wait(seen, deadline);
    }
}

/// A peer's message for this very call that describes it differently.
fn find_mismatch(t: &mut dyn Transport, call: &Call, channels: u32) -> Result<(), CommError> {
    let n = call.schedule.world_size;
    let channels = t.max_channel().map_or(channels, |m| m.max(channels));
    for peer in (0..n).filter(|&p| p != call.rank) {
        for channel in 0..channels {
            if let Some(h) = t.peek_header(peer, channel) {
                check_header(&h, peer, call)?;
            }
        }
    }
    Ok(())
}

/// A peer this rank is blocked on that has left the group: it will never
/// send or consume again, so waiting out the timeout would only delay the error.
fn find_departed(t: &mut dyn Transport, call: &Call, progress: &Progress) -> Result<(), CommError> {
    for channel in 0..progress.channels() {
        let Some((_, step)) = progress.next(channel) else {
            continue;
        };
        for &peer in step.recv_from.iter().chain(&step.send_to) {
            let waiting = if step.recv_from.contains(&peer) {
                t.peek(peer, channel as u32)?.is_none()
            } else {
                true
            };
            if waiting && t.departed(peer) {
                return Err(CommError::PeerFailed {
                    rank: peer,
                    reason: format!(
                        "left the group (its communicator was dropped) before call #{} ({}) finished",
                        call.call, call.signature
                    ),
                });
            }
        }
    }
    Ok(())
}

fn check_header(h: &Header, peer: Rank, call: &Call) -> Result<(), CommError> {
    if h.call == call.call && !h.same_call(call.call, call.signature) {
        return Err(CommError::Mismatch {
            call: call.call,
            rank: call.rank,
            other: peer,
            expected: h.signature().to_owned(),
            got: call.signature.to_owned(),
        });
    }
    Ok(())
}

/// Fire the step at `at` if it can fire now.
fn try_fire<T: Reduce>(
    t: &mut dyn Transport,
    call: &Call,
    channel: u32,
    step: &Step,
    at: Cursor,
) -> Result<bool, CommError> {
    let mut incoming: Vec<Incoming> = Vec::with_capacity(step.recv_from.len());
    for &peer in &step.recv_from {
        match t.peek(peer, channel)? {
            Some(m) => incoming.push(m),
            None => return Ok(false),
        }
    }
    let size = std::mem::size_of::<T>();
    let len = match step.write.or(step.read) {
        Some(s) => call.layout.slice_len(at.segment, s.chunk, step.chunks),
        None => incoming.first().map_or(0, |m| m.len / size),
    };
    for (m, &peer) in incoming.iter().zip(&step.recv_from) {
        let header = t.peek_header(peer, channel).expect("peeked above");
        check_header(&header, peer, call)?;
        if m.call != call.call || m.len != len * size {
            return Err(CommError::Mismatch {
                call: call.call,
                rank: call.rank,
                other: peer,
                expected: format!(
                    "{} (call #{}, {} bytes in this message)",
                    header.signature(),
                    m.call,
                    m.len
                ),
                got: format!("{} ({} bytes expected)", call.signature, len * size),
            });
        }
    }
    let mut outgoing: Vec<*mut T> = Vec::with_capacity(step.send_to.len());
    for &peer in &step.send_to {
        match t.reserve(peer, channel, len * size)? {
            Some(room) => outgoing.push(room as *mut T),
            None => return Ok(false),
        }
    }
    let sources: Vec<*const T> = incoming.iter().map(|m| m.payload as *const T).collect();
    let read = step
        .read
        .map(|s| call.pieces::<T>(at.segment, s, step.chunks));
    let write = step
        .write
        .map(|s| call.pieces::<T>(at.segment, s, step.chunks));
    if len > 0 {
        // SAFETY: incoming payloads hold `len` elements (checked above) and
        // stay put until released below; reserved rooms hold `len` elements
        // and are this rank's alone until committed; local pieces lie in
        // the caller's buffers, which the communicator checked hold the
        // whole layout.
        unsafe {
            compute(
                call.op,
                &sources,
                read.as_deref(),
                write.as_deref(),
                &outgoing,
                len,
            )
        };
    }
    let header = Header::new(call.call, len * size, call.signature);
    for &peer in &step.send_to {
        t.commit(peer, channel, &header)?;
    }
    for &peer in &step.recv_from {
        t.release(peer, channel)?;
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
    read: Option<&[Piece]>,
    write: Option<&[Piece]>,
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
    read: Option<&[Piece]>,
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
unsafe fn scatter<T>(value: *const T, write: &[Piece]) {
    for &(offset, address, n) in write {
        // SAFETY: forwarded; the value is a message room or a staging
        // vector, never the destination.
        unsafe { std::ptr::copy_nonoverlapping(value.add(offset), address as *mut T, n) };
    }
}
