//! Runs one rank's part of an execution plan on host memory.
//!
//! Every channel of the rank advances in one thread, round-robin: an
//! instruction fires when its messages are there, its outgoing links have
//! a free slot and its waits are met — the model of [`crate::plan`]. How a
//! message travels is decided per message, cheapest first:
//! 1. **direct write** — the receiver waits to copy the message into its
//!    output and has posted where (the plan's [`Instruction::direct`]); the
//!    sender writes the value there itself;
//! 2. **pointer** — the value sits in the sender's memory and no later
//!    instruction changes it before every receiver has read it (the plan's
//!    [`Source`]); the receiver reads it in place;
//! 3. **slot** — otherwise the sender writes it into the link's slot
//!    [`Message::slot`].
//!
//! A rank returns only when every message it sent has been consumed, so no
//! peer is left holding a pointer into a buffer its owner may reuse.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::data::{combine, divide};
use super::group::{Extents, Group, LinkQueue, Msg};
use crate::comm::CommError;
use crate::kernels::Reduce;
use crate::plan::{ExecutionPlan, Instruction, Message, RankPlan, Region, Source, Walk};
use crate::types::Rank;

/// Instructions a channel looks ahead to post direct-write destinations.
const POST_LOOKAHEAD: usize = 64;

/// One rank's task in one call.
pub(crate) struct Task<'a> {
    pub group: &'a Group,
    pub plan: &'a ExecutionPlan,
    pub rank: Rank,
    /// Base addresses of the input, output and scratch buffers (in place,
    /// the output's).
    pub bases: [usize; 3],
    pub timeout: Duration,
    /// The kernel variant of the call: its stores by the call's bytes.
    pub kernels: crate::kernels::KernelChoice,
    /// Times the kernels of a watched call.
    pub meter: &'a crate::kernels::Meter,
}

/// The links of a rank in one call, looked up once.
struct Links {
    /// Incoming: the queue and how many messages it had delivered before
    /// this call (message `k` of the call is number `base + k` on it).
    incoming: HashMap<(Rank, u32), (Arc<LinkQueue>, u64)>,
    outgoing: HashMap<(Rank, u32), Arc<LinkQueue>>,
}

impl Links {
    fn new(group: &Group, rank: Rank, plan: &RankPlan) -> Links {
        let (mut incoming, mut outgoing) = (HashMap::new(), HashMap::new());
        for (c, list) in plan.channels.iter().enumerate() {
            let c = c as u32;
            for ins in list {
                for m in &ins.recv {
                    incoming.entry((m.peer, c)).or_insert_with(|| {
                        let q = group.link(m.peer, rank, c);
                        // Every earlier call's messages were consumed by this
                        // rank before it returned from that call.
                        let base = group.lock_link(&q).popped;
                        (q, base)
                    });
                }
                for m in &ins.send {
                    outgoing.entry((m.peer, c)).or_insert_with(|| {
                        let q = group.link(rank, m.peer, c);
                        // The slot numbering of the plan relies on it.
                        debug_assert!(group.lock_link(&q).queue.is_empty(), "drained last call");
                        q
                    });
                }
            }
        }
        Links { incoming, outgoing }
    }

    fn incoming(&self, m: &Message, channel: u32) -> &(Arc<LinkQueue>, u64) {
        &self.incoming[&(m.peer, channel)]
    }

    fn outgoing(&self, m: &Message, channel: u32) -> &Arc<LinkQueue> {
        &self.outgoing[&(m.peer, channel)]
    }
}

impl Task<'_> {
    fn extents(&self, region: &Region) -> Extents {
        let base = self.bases[region.buffer as usize];
        region
            .pieces
            .iter()
            .map(|p| (base + p.offset as usize, p.bytes as usize))
            .collect()
    }

    fn rank_plan(&self) -> &RankPlan {
        &self.plan.ranks[self.rank as usize]
    }
}

/// Run the rank's part of the plan, then divide for `Avg`. On error,
/// returns only once no peer can still be reading or writing this rank's
/// memory.
pub(crate) fn execute<T: Reduce>(task: &Task) -> Result<(), CommError> {
    let links = Links::new(task.group, task.rank, task.rank_plan());
    let result = run::<T>(task, &links);
    if let Err(e) = &result {
        task.group.quiesce(task.rank, e);
        return result;
    }
    if let Some(region) = &task.rank_plan().divide {
        // SAFETY: the region lies in this rank's output (plan invariant),
        // which the caller borrowed exclusively; every channel has finished.
        unsafe { divide::<T>(&task.extents(region), task.plan.world_size) };
    }
    Ok(())
}

fn run<T: Reduce>(task: &Task, links: &Links) -> Result<(), CommError> {
    let rp = task.rank_plan();
    let mut walk = Walk::new(rp);
    let mut deadline = Instant::now() + task.timeout;
    loop {
        let seen = task.group.generation(task.rank);
        task.group.check()?;
        let mut progressed = false;
        for channel in 0..walk.channels() {
            while let Some((index, ins)) = walk.next(channel) {
                post_ahead(task, links, channel, index);
                if !walk.waits_met(ins) || !try_fire::<T>(task, links, channel as u32, ins)? {
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
        } else {
            let what = || walk.describe();
            task.group
                .wait(task.rank, seen, deadline, what, task.timeout)?;
        }
    }
    drain(task, links, deadline)
}

/// Post the destinations of the direct receives this channel may accept
/// now, each for the exact message number it will receive on its link.
fn post_ahead(task: &Task, links: &Links, channel: usize, at: u32) {
    let list = &task.rank_plan().channels[channel];
    for ins in list[at as usize..].iter().take(POST_LOOKAHEAD) {
        let (Some(from), Some(write)) = (ins.direct, &ins.write) else {
            continue;
        };
        if from > at {
            continue;
        }
        let m = &ins.recv[0];
        let (queue, base) = links.incoming(m, channel as u32);
        let seq = base + m.index;
        let mut st = task.group.lock_link(queue);
        if st.posted.is_none() && st.pushed <= seq {
            st.posted = Some((seq, task.extents(write)));
        }
    }
}

/// Fire `ins` if it can fire now.
fn try_fire<T: Reduce>(
    task: &Task,
    links: &Links,
    channel: u32,
    ins: &Instruction,
) -> Result<bool, CommError> {
    let group = task.group;
    let incoming: Vec<&Arc<LinkQueue>> = ins
        .recv
        .iter()
        .map(|m| &links.incoming(m, channel).0)
        .collect();
    let outgoing: Vec<&Arc<LinkQueue>> = ins
        .send
        .iter()
        .map(|m| links.outgoing(m, channel))
        .collect();
    if incoming.iter().any(|q| group.lock_link(q).queue.is_empty())
        || outgoing
            .iter()
            .any(|q| group.lock_link(q).queue.len() >= group.slots)
    {
        return Ok(false);
    }
    let _moving = group.begin_movement()?;

    // Sources: the messages, then the local read.
    let mut srcs: Vec<Extents> = Vec::with_capacity(ins.inputs());
    let mut already_written = false;
    for q in &incoming {
        let mut st = group.lock_link(q);
        match st.queue.front().cloned().expect("checked non-empty") {
            Msg::Pointer(p) => {
                st.count(q.link, p.iter().map(|e| e.1).sum());
                srcs.push(p);
            }
            Msg::Slot { index, bytes } => srcs.push(vec![(q.slots[index].address(), bytes)]),
            Msg::Written => already_written = true,
            Msg::Send { .. } => unreachable!("point-to-point messages stay on their own channel"),
        }
    }
    if let Some(r) = &ins.read {
        srcs.push(task.extents(r));
    }

    // Destinations: the local write, then whatever each send needs.
    let own = ins.write.as_ref().map(|w| task.extents(w));
    let bytes = ins.bytes as usize;
    let mut dsts: Vec<Extents> = Vec::new();
    if let Some(p) = &own
        && !already_written
    {
        dsts.push(p.clone());
    }
    let mut outgoing_msgs: Vec<Msg> = Vec::with_capacity(outgoing.len());
    for (q, m) in outgoing.iter().zip(&ins.send) {
        let mut st = group.lock_link(q);
        if st.posted.as_ref().is_some_and(|(seq, _)| *seq == st.pushed) {
            let (_, posted) = st.posted.take().expect("checked");
            st.count(q.link, posted.iter().map(|e| e.1).sum());
            dsts.push(posted);
            outgoing_msgs.push(Msg::Written);
            continue;
        }
        let msg = match ins.source {
            Source::Write => Msg::Pointer(own.clone().expect("stable writes exist")),
            Source::Read => Msg::Pointer(srcs.last().cloned().expect("stable reads exist")),
            Source::Slot => {
                let index = m.slot as usize;
                // SAFETY: this rank is the link's only sender and fewer than
                // `slots` messages are queued, all of this call and numbered
                // just below this one, so slot `index % slots` is free.
                let address = unsafe { q.slots[index].prepare(bytes) };
                st.count(q.link, bytes);
                dsts.push(vec![(address, bytes)]);
                Msg::Slot { index, bytes }
            }
        };
        outgoing_msgs.push(msg);
    }
    if already_written {
        // The sender wrote the value into our output; forward it from there.
        srcs = vec![own.clone().expect("direct receives write")];
    }
    if !dsts.is_empty() {
        let moved = (srcs.len() + dsts.len()) as u64 * bytes as u64;
        task.meter.time(moved, || {
            combine::<T>(task.kernels, task.plan.op, &srcs, &dsts)
        });
    }
    publish(task, &outgoing, outgoing_msgs, ins);
    for (q, m) in incoming.iter().zip(&ins.recv) {
        {
            let mut st = group.lock_link(q);
            st.queue.pop_front();
            let consumed = st.popped;
            st.popped += 1;
            // A post for this message that its sender did not use is stale.
            if st.posted.as_ref().is_some_and(|(seq, _)| *seq <= consumed) {
                st.posted = None;
            }
        }
        group.ring(m.peer);
    }
    Ok(true)
}

/// Queue the sent messages and wake their receivers.
fn publish(task: &Task, outgoing: &[&Arc<LinkQueue>], msgs: Vec<Msg>, ins: &Instruction) {
    for ((q, msg), m) in outgoing.iter().zip(msgs).zip(&ins.send) {
        {
            let mut st = task.group.lock_link(q);
            st.queue.push_back(msg);
            st.pushed += 1;
        }
        task.group.ring(m.peer);
    }
}

/// Wait until every link this rank sends on is empty.
fn drain(task: &Task, links: &Links, mut deadline: Instant) -> Result<(), CommError> {
    loop {
        let seen = task.group.generation(task.rank);
        task.group.check()?;
        if links
            .outgoing
            .values()
            .all(|q| task.group.lock_link(q).queue.is_empty())
        {
            return Ok(());
        }
        let what = || "peers to consume this rank's last messages".to_owned();
        task.group
            .wait(task.rank, seen, deadline, what, task.timeout)?;
        deadline = deadline.max(Instant::now());
    }
}
