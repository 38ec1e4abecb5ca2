//! Runs one rank's share of a verified schedule on host memory.
//!
//! Every channel of the rank advances in one thread, round-robin: a step
//! fires when its messages are there, its outgoing links have a free slot
//! and its `after` steps are done — the buffering model the verifier proved.
//! How a message travels is decided per message, cheapest first:
//! 1. **direct write** — the receiver is waiting to copy the message into
//!    its output and has posted where; the sender writes the value there
//!    itself (no copy on the receiving side);
//! 2. **pointer** — the value sits in the sender's memory and no later step
//!    of the sender changes it; the receiver reads it in place;
//! 3. **slot** — otherwise the sender writes it into the link's slot buffer.
//!
//! A rank returns only when every message it sent has been consumed, so no
//! peer is left holding a pointer into a buffer its owner may reuse.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::group::{Group, Link, Msg, Pieces};
use super::kernels::{self, Reduce};
use super::plan::{Plan, Stable};
use crate::comm::CommError;
use crate::schedule::layout::Layout;
use crate::schedule::progress::{Cursor, Progress};
use crate::schedule::{Slice, Step};
use crate::types::{Rank, ReduceOp};

/// Elements reduced into the first destination before it is copied to the
/// others: small enough that the copies read from L1/L2.
const FAN_OUT_BLOCK: usize = 4096;

/// One rank's view of one collective call.
pub(crate) struct Call<'a> {
    pub group: &'a Group,
    pub plan: &'a Plan,
    pub rank: Rank,
    pub in_place: bool,
    pub layout: Layout,
    pub op: ReduceOp,
    /// Base addresses of the physical input, output and scratch buffers.
    pub bases: [usize; 3],
    pub timeout: Duration,
}

impl Call<'_> {
    fn pieces<T>(&self, segment: u32, slice: Slice, chunks: u32) -> Pieces {
        let s = self.plan.verified.schedule();
        let (buffer, chunk) = s.physical(self.in_place, self.rank, slice.buffer, slice.chunk);
        let base = self.bases[buffer as usize];
        let size = std::mem::size_of::<T>();
        self.layout
            .slice_ranges(segment, chunk, chunks)
            .into_iter()
            .map(|r| (base + r.start * size, r.len() * size))
            .collect()
    }

    fn link(&self, from: Rank, to: Rank, channel: u32) -> Arc<Link> {
        self.group.link(from, to, channel)
    }
}

/// Run every segment of the schedule for `call.rank`. On error, returns
/// only once no peer can still be reading or writing this rank's memory.
pub(crate) fn execute<T: Reduce>(call: &Call) -> Result<(), CommError> {
    let result = run_segments::<T>(call);
    if let Err(e) = &result {
        call.group.quiesce(call.rank, e);
    }
    result
}

fn run_segments<T: Reduce>(call: &Call) -> Result<(), CommError> {
    let schedule = call.plan.verified.schedule();
    let program = &schedule.ranks[call.rank as usize];
    let mut progress = Progress::new(program, call.layout.segments());
    let mut deadline = Instant::now() + call.timeout;
    loop {
        let seen = call.group.generation(call.rank);
        call.group.check()?;
        let mut progressed = false;
        for channel in 0..progress.channels() {
            while let Some((at, step)) = progress.next(channel) {
                post_ahead::<T>(call, channel as u32, &program.channels[channel], at);
                if !progress.after_done(step, at) || !try_fire::<T>(call, channel as u32, step, at)?
                {
                    break;
                }
                progressed = true;
                progress.advance(channel);
            }
        }
        if progress.done() {
            break;
        }
        if progressed {
            deadline = Instant::now() + call.timeout;
        } else {
            let what = || progress.describe();
            call.group
                .wait(call.rank, seen, deadline, what, call.timeout)?;
        }
    }
    drain(call, deadline)
}

/// Post the destinations of the direct targets this channel may accept
/// now, each for the exact message number it will receive on its link.
fn post_ahead<T>(call: &Call, channel: u32, steps: &[Step], at: Cursor) {
    const LOOKAHEAD: usize = 64;
    let start = at.index as usize;
    for (offset, step) in steps[start..].iter().enumerate().take(LOOKAHEAD) {
        let index = (start + offset) as u32;
        let sp = call.plan.step(call.in_place, call.rank, channel, index);
        if !sp.direct_target || sp.post_from > at.index {
            continue;
        }
        let peer = step.recv_from[0];
        // Receives from the same peer still ahead of this one on the channel.
        let before = steps[start..start + offset]
            .iter()
            .filter(|s| s.recv_from.contains(&peer))
            .count() as u64;
        let link = call.link(peer, call.rank, channel);
        let mut st = call.group.lock_link(&link);
        let seq = st.popped + before;
        if st.posted.is_none() && st.pushed <= seq {
            let w = step.write.expect("direct targets write");
            st.posted = Some((seq, call.pieces::<T>(at.segment, w, step.chunks)));
        }
    }
}

/// Fire the step at `at` if it can fire now.
fn try_fire<T: Reduce>(
    call: &Call,
    channel: u32,
    step: &Step,
    at: Cursor,
) -> Result<bool, CommError> {
    let group = call.group;
    let recv_links: Vec<Arc<Link>> = step
        .recv_from
        .iter()
        .map(|&p| call.link(p, call.rank, channel))
        .collect();
    let send_links: Vec<Arc<Link>> = step
        .send_to
        .iter()
        .map(|&p| call.link(call.rank, p, channel))
        .collect();
    if recv_links
        .iter()
        .any(|l| group.lock_link(l).queue.is_empty())
    {
        return Ok(false);
    }
    if send_links
        .iter()
        .any(|l| group.lock_link(l).queue.len() >= group.slots)
    {
        return Ok(false);
    }
    let sp = call.plan.step(call.in_place, call.rank, channel, at.index);
    let _moving = group.begin_movement()?;

    // Sources: the messages, then the local read.
    let mut srcs: Vec<Pieces> = Vec::with_capacity(step.input_count());
    let mut already_written = false;
    for link in &recv_links {
        let st = group.lock_link(link);
        match st.queue.front().expect("checked non-empty") {
            Msg::Pointer(p) => srcs.push(p.clone()),
            Msg::Slot { index, bytes } => srcs.push(vec![(link.slots[*index].address(), *bytes)]),
            Msg::Written => already_written = true,
        }
    }
    if let Some(r) = step.read {
        srcs.push(call.pieces::<T>(at.segment, r, step.chunks));
    }

    // Destinations: the local write, then whatever each send needs.
    let own = step
        .write
        .map(|w| call.pieces::<T>(at.segment, w, step.chunks));
    // The value's length: a message's or a slice's (a step that only
    // forwards has no slice of its own).
    let bytes: usize = srcs
        .first()
        .or(own.as_ref())
        .map_or(0, |p| p.iter().map(|&(_, len)| len).sum());
    let mut dsts: Vec<Pieces> = Vec::new();
    if let Some(p) = &own
        && !already_written
    {
        dsts.push(p.clone());
    }
    let mut outgoing: Vec<Msg> = Vec::with_capacity(send_links.len());
    for link in &send_links {
        let mut st = group.lock_link(link);
        if st.posted.as_ref().is_some_and(|(seq, _)| *seq == st.pushed) {
            let (_, posted) = st.posted.take().expect("checked");
            dsts.push(posted);
            outgoing.push(Msg::Written);
            continue;
        }
        let msg = match sp.stable {
            Stable::Written => Msg::Pointer(own.clone().expect("stable writes exist")),
            Stable::Read => Msg::Pointer(srcs.last().cloned().expect("stable reads exist")),
            Stable::No => {
                let index = (st.pushed % group.slots as u64) as usize;
                // SAFETY: this rank is the link's only sender and fewer than
                // `slots` messages are queued, so slot `index` is free.
                let address = unsafe { link.slots[index].prepare(bytes) };
                dsts.push(vec![(address, bytes)]);
                Msg::Slot { index, bytes }
            }
        };
        outgoing.push(msg);
    }
    if already_written {
        // The sender wrote the value into our output; forward it from there.
        srcs = vec![own.clone().expect("direct targets write")];
    }
    if !dsts.is_empty() {
        combine::<T>(call.op, &srcs, &dsts);
    }

    for (link, (msg, &peer)) in send_links
        .iter()
        .zip(outgoing.into_iter().zip(&step.send_to))
    {
        {
            let mut st = group.lock_link(link);
            st.queue.push_back(msg);
            st.pushed += 1;
        }
        group.ring(peer);
    }
    for (link, &peer) in recv_links.iter().zip(&step.recv_from) {
        {
            let mut st = group.lock_link(link);
            st.queue.pop_front();
            let consumed = st.popped;
            st.popped += 1;
            // A post for this message that its sender did not use is stale.
            if st.posted.as_ref().is_some_and(|(seq, _)| *seq <= consumed) {
                st.posted = None;
            }
        }
        group.ring(peer);
    }
    Ok(true)
}

/// Stretches at least this long are written with non-temporal stores: they
/// will not be read again from cache, and skipping the write-allocate read
/// of every destination line saves a third of the memory traffic.
const STREAM_MIN_BYTES: usize = 256 << 10;

/// Reduce `srcs` into every destination. Short stretches reduce into the
/// first destination and copy from it while it is in cache; long ones
/// reduce a block at a time into a small buffer that stays in L1 and
/// stream it to every destination.
fn combine<T: Reduce>(op: ReduceOp, srcs: &[Pieces], dsts: &[Pieces]) {
    let size = std::mem::size_of::<T>();
    let lists: Vec<&Pieces> = srcs.iter().chain(dsts).collect();
    let mut streamed = false;
    walk(&lists, |addrs, bytes| {
        let (src_addrs, dst_addrs) = addrs.split_at(srcs.len());
        let stream = bytes >= STREAM_MIN_BYTES;
        streamed |= stream;
        if stream && fused::<T>(op, src_addrs, dst_addrs, bytes) {
            return;
        }
        let mut done = 0;
        while done < bytes {
            let n = (bytes - done).min(FAN_OUT_BLOCK * size);
            let len = n / size;
            let mut src: Vec<*const T> =
                src_addrs.iter().map(|&a| (a + done) as *const T).collect();
            if stream {
                stream_block::<T>(op, &src, dst_addrs, done, n);
            } else {
                let first = (dst_addrs[0] + done) as *mut T;
                // In place, the destination is one of the sources; the
                // kernel reads its first two sources before writing, so put
                // it first.
                if let Some(i) = src.iter().position(|&p| std::ptr::eq(p, first)) {
                    src.swap(0, i);
                }
                if !(src.len() == 1 && std::ptr::eq(src[0], first)) {
                    // SAFETY: the verifier proved every slice in bounds of
                    // its buffer (or of a slot sized for it), that a step's
                    // read and write coincide or do not overlap, and that no
                    // other step touches these bytes concurrently.
                    unsafe { T::reduce(op, &src, first, len) };
                }
                for &d in &dst_addrs[1..] {
                    let d = (d + done) as *mut T;
                    if d != first {
                        // SAFETY: as above; distinct destinations never overlap.
                        unsafe { std::ptr::copy_nonoverlapping(first as *const T, d, len) };
                    }
                }
            }
            done += n;
        }
    });
    if streamed {
        kernels::stream_fence();
    }
}

/// Try the element type's fused reduce-and-stream kernel for a whole
/// stretch; false when it has none or a destination is also a source
/// (in place, where ordinary stores into just-read lines are cheaper).
fn fused<T: Reduce>(op: ReduceOp, src_addrs: &[usize], dst_addrs: &[usize], bytes: usize) -> bool {
    if dst_addrs.iter().any(|d| src_addrs.contains(d)) {
        return false;
    }
    let srcs: Vec<*const T> = src_addrs.iter().map(|&a| a as *const T).collect();
    let dsts: Vec<*mut T> = dst_addrs.iter().map(|&a| a as *mut T).collect();
    // SAFETY: every address covers `bytes` bytes (verified slices or sized
    // slots); destinations are distinct from each other and, as checked
    // above, from every source.
    unsafe { T::reduce_stream(op, &srcs, &dsts, bytes / std::mem::size_of::<T>()) }
}

/// Bytes reduced at a time on the streaming path: small enough that the
/// stores to every destination interleave tightly with the loads (a large
/// staging block serialises the streams and loses a third of the rate).
const STREAM_BLOCK_BYTES: usize = 1024;

/// Reduce `n` bytes of `src` and stream the result to every destination
/// (offset by `done`), one small block at a time.
fn stream_block<T: Reduce>(
    op: ReduceOp,
    src: &[*const T],
    dst_addrs: &[usize],
    done: usize,
    n: usize,
) {
    let size = std::mem::size_of::<T>();
    let mut staging = [0u64; STREAM_BLOCK_BYTES / 8];
    let staging_ptr = staging.as_mut_ptr() as *mut T;
    let mut ptrs: Vec<*const T> = src.to_vec();
    let mut off = 0;
    while off < n {
        let m = (n - off).min(STREAM_BLOCK_BYTES);
        let len = m / size;
        let from: *const u8 = if ptrs.len() == 1 {
            ptrs[0] as *const u8
        } else {
            // SAFETY: the staging block holds STREAM_BLOCK_BYTES ≥ m bytes,
            // is aligned for every element type (u64 alignment) and
            // overlaps no source.
            unsafe { T::reduce(op, &ptrs, staging_ptr, len) };
            staging_ptr as *const u8
        };
        for &d in dst_addrs {
            let d = (d + done + off) as *mut u8;
            if std::ptr::eq(d, from) {
                continue;
            }
            // A destination that is also a source (in place) was just read
            // into this core's cache: an ordinary store costs no extra
            // read there, and is cheaper than bypassing the cache.
            let just_read = ptrs.iter().any(|&p| std::ptr::eq(p as *const u8, d));
            // SAFETY: destinations are in bounds (verified) and overlap
            // neither the staging block nor each other; a destination that
            // is also a source was read into staging already.
            unsafe {
                if just_read {
                    std::ptr::copy_nonoverlapping(from, d, m);
                } else {
                    kernels::stream_copy(from, d, m);
                }
            }
        }
        for p in &mut ptrs {
            // SAFETY: stays within the stretch being reduced.
            *p = unsafe { p.add(len) };
        }
        off += m;
    }
}

/// Walk several lists of byte ranges of equal total length in lock step,
/// calling `f` with one address per list for each stretch that is
/// contiguous in all of them.
fn walk(lists: &[&Pieces], mut f: impl FnMut(&[usize], usize)) {
    let mut pos: Vec<(usize, usize)> = vec![(0, 0); lists.len()];
    let mut addrs = vec![0usize; lists.len()];
    loop {
        let mut step = usize::MAX;
        for (l, &(i, off)) in lists.iter().zip(&pos) {
            // Skip empty pieces.
            match l.get(i) {
                Some(&(_, len)) => step = step.min(len - off),
                None => return,
            }
        }
        if step == 0 {
            for (l, p) in lists.iter().zip(pos.iter_mut()) {
                if l[p.0].1 == p.1 {
                    *p = (p.0 + 1, 0);
                }
            }
            continue;
        }
        for ((l, &(i, off)), a) in lists.iter().zip(&pos).zip(addrs.iter_mut()) {
            *a = l[i].0 + off;
        }
        f(&addrs, step);
        for (l, p) in lists.iter().zip(pos.iter_mut()) {
            p.1 += step;
            if p.1 == l[p.0].1 {
                *p = (p.0 + 1, 0);
            }
        }
    }
}

/// Wait until every link this rank sends on is empty.
fn drain(call: &Call, mut deadline: Instant) -> Result<(), CommError> {
    let schedule = call.plan.verified.schedule();
    let mut links = Vec::new();
    for (c, steps) in schedule.ranks[call.rank as usize]
        .channels
        .iter()
        .enumerate()
    {
        for step in steps {
            for &to in &step.send_to {
                links.push(call.link(call.rank, to, c as u32));
            }
        }
    }
    links.dedup_by(|a, b| Arc::ptr_eq(a, b));
    loop {
        let seen = call.group.generation(call.rank);
        call.group.check()?;
        if links
            .iter()
            .all(|l| call.group.lock_link(l).queue.is_empty())
        {
            return Ok(());
        }
        let what = || "peers to consume this rank's last messages".to_owned();
        call.group
            .wait(call.rank, seen, deadline, what, call.timeout)?;
        deadline = deadline.max(Instant::now());
    }
}
