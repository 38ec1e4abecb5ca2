//! The buffering model, and an engine that steps a schedule through it.
//!
//! **The model.** A *link* is an ordered pair of ranks plus a channel. It is a
//! FIFO that holds at most `slots_per_link` messages in flight. A step fires
//! only when (1) every step it names in `after` has fired, (2) the head of
//! each link it receives from holds a message, and (3) each link it sends on
//! has a free slot; firing takes the received messages off their links and
//! puts one message on each outgoing link. Executors must provide at least
//! the slots a schedule was verified with (never fewer than 1).
//!
//! **Why one run decides.** Each link has one writer and one reader, and a
//! fired step never disables another ready step: a receive only removes from
//! its own links and a send only adds to its own. The system is therefore
//! confluent — every order of firing reaches the same final state — so if
//! one greedy run completes, no interleaving an executor might take can
//! deadlock, and if it stalls, every interleaving stalls.
//!
//! **Why one segment decides.** Executors run the schedule once per segment,
//! back to back on each channel. If one run completes with every link
//! drained, the segment-by-segment interleaving of the repeated schedule
//! completes too (each segment starts from empty links), and by confluence
//! so does every other interleaving: verifying one segment covers any number.

use crate::schedule::{Schedule, Step, StepAt, StepRef};
use crate::types::{Link, Rank};

/// Why a step could not fire when the engine stalled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// No message arrived from this rank.
    Message {
        /// The rank that was expected to send.
        from: Rank,
    },
    /// The link to this rank stayed full.
    Slot {
        /// The receiving rank.
        to: Rank,
    },
    /// A step on another channel of the same rank never fired.
    Step(StepRef),
}

/// A step that never fired, and what it waited for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stalled {
    pub at: StepAt,
    pub waits: Vec<Wait>,
}

/// What the data side of an execution does when a step fires.
pub(crate) trait Semantics {
    /// What a message carries.
    type Payload: Clone;

    /// Perform `step`, given the messages received from `step.recv_from` in
    /// order (drain them); return the value to send (`None` when the step
    /// sends nothing).
    fn fire(
        &mut self,
        at: StepAt,
        step: &Step,
        received: &mut Vec<Self::Payload>,
    ) -> Option<Self::Payload>;
}

/// The result of running a schedule through the buffering model.
#[derive(Debug, Default)]
pub(crate) struct FlowOutcome {
    /// Steps that never fired (empty when the schedule completed).
    pub stalled: Vec<Stalled>,
    /// Links left holding messages nobody received, with how many.
    pub leftover: Vec<(Link, usize)>,
    /// For each delivered message, (sending step, receiving step).
    pub deliveries: Vec<(StepAt, StepAt)>,
}

struct Message<P> {
    from: StepAt,
    payload: P,
}

/// Every link's FIFO. Only links some step sends on exist; each is a ring
/// of `slots` entries, since a send never fires onto a full link.
struct Links<P> {
    ends: Vec<Link>,
    slots: usize,
    ring: Vec<Option<Message<P>>>,
    head: Vec<usize>,
    len: Vec<usize>,
    /// Global id of each (rank, channel)'s first step.
    step_base: Vec<Vec<usize>>,
    /// For global step `g`, `peer_ids[peer_start[g]..peer_start[g + 1]]`
    /// are the links of its receives, then of its sends, resolved once.
    peer_start: Vec<usize>,
    peer_ids: Vec<Option<usize>>,
}

const NO_LINK: u32 = u32::MAX;

impl<P> Links<P> {
    fn new(schedule: &Schedule, slots: usize) -> Self {
        let n = schedule.ranks.len();
        let channels = schedule.channel_count().max(1);
        // (from, channel, to) → link id, dense: n²·channels words, built once.
        let mut table = vec![NO_LINK; n * n * channels];
        let key = |from: Rank, to: Rank, channel: u32| {
            (from as usize * channels + channel as usize) * n + to as usize
        };
        let mut ends = Vec::new();
        for (at, step) in schedule.steps() {
            for &to in &step.send_to {
                let k = key(at.rank, to, at.channel);
                if table[k] == NO_LINK {
                    table[k] = ends.len() as u32;
                    ends.push(Link {
                        from: at.rank,
                        to,
                        channel: at.channel,
                    });
                }
            }
        }
        let lookup = |from: Rank, to: Rank, channel: u32| {
            let id = table[key(from, to, channel)];
            (id != NO_LINK).then_some(id as usize)
        };
        let mut step_base = Vec::with_capacity(n);
        let mut next = 0;
        for prog in &schedule.ranks {
            let mut row = Vec::with_capacity(prog.channels.len());
            for steps in &prog.channels {
                row.push(next);
                next += steps.len();
            }
            step_base.push(row);
        }
        let mut peer_start = Vec::with_capacity(next + 1);
        peer_start.push(0);
        let mut peer_ids = Vec::new();
        for (at, step) in schedule.steps() {
            peer_ids.extend(
                step.recv_from
                    .iter()
                    .map(|&from| lookup(from, at.rank, at.channel)),
            );
            peer_ids.extend(
                step.send_to
                    .iter()
                    .map(|&to| lookup(at.rank, to, at.channel)),
            );
            peer_start.push(peer_ids.len());
        }
        let mut ring = Vec::new();
        ring.resize_with(ends.len() * slots, || None);
        Links {
            slots,
            ring,
            head: vec![0; ends.len()],
            len: vec![0; ends.len()],
            ends,
            step_base,
            peer_start,
            peer_ids,
        }
    }

    /// The links of the step at `at`: receives first, then sends.
    fn of_step(&self, at: StepAt) -> &[Option<usize>] {
        let g = self.step_base[at.rank as usize][at.channel as usize] + at.index as usize;
        &self.peer_ids[self.peer_start[g]..self.peer_start[g + 1]]
    }

    fn queued(&self, id: Option<usize>) -> usize {
        id.map_or(0, |id| self.len[id])
    }

    fn push(&mut self, id: Option<usize>, msg: Message<P>) {
        let id = id.expect("links exist for every send");
        debug_assert!(self.len[id] < self.slots);
        let slot = (self.head[id] + self.len[id]) % self.slots;
        self.ring[id * self.slots + slot] = Some(msg);
        self.len[id] += 1;
    }

    fn pop(&mut self, id: Option<usize>) -> Option<Message<P>> {
        let id = id?;
        if self.len[id] == 0 {
            return None;
        }
        let msg = self.ring[id * self.slots + self.head[id]].take();
        self.head[id] = (self.head[id] + 1) % self.slots;
        self.len[id] -= 1;
        msg
    }
}

/// Run `schedule` greedily under `slots_per_link`, calling `semantics` for
/// every fired step. The schedule must have passed the structural checks
/// (peers, channels and `after` references in range). With
/// `record_deliveries`, the outcome lists which step received each message.
pub(crate) fn run<S: Semantics>(
    schedule: &Schedule,
    slots_per_link: u32,
    semantics: &mut S,
    record_deliveries: bool,
) -> FlowOutcome {
    let slots = slots_per_link.max(1) as usize;
    let mut links: Links<S::Payload> = Links::new(schedule, slots);
    let mut pc: Vec<Vec<u32>> = schedule
        .ranks
        .iter()
        .map(|p| vec![0; p.channels.len()])
        .collect();
    let mut queued: Vec<Vec<bool>> = pc.iter().map(|c| vec![true; c.len()]).collect();
    let mut cursors: Vec<Vec<usize>> = pc.iter().map(|c| vec![0; c.len()]).collect();
    let mut work: Vec<(Rank, u32)> = Vec::new();
    for (r, prog) in schedule.ranks.iter().enumerate().rev() {
        for c in (0..prog.channels.len()).rev() {
            work.push((r as Rank, c as u32));
        }
    }
    let mut deliveries = Vec::new();
    let mut wake: Vec<(Rank, u32)> = Vec::new();
    let mut received: Vec<S::Payload> = Vec::new();
    let mut ids: Vec<Option<usize>> = Vec::new();

    while let Some((rank, channel)) = work.pop() {
        queued[rank as usize][channel as usize] = false;
        let steps = &schedule.ranks[rank as usize].channels[channel as usize];
        loop {
            let index = pc[rank as usize][channel as usize];
            let Some(step) = steps.get(index as usize) else {
                break;
            };
            let at = StepAt {
                rank,
                channel,
                index,
            };
            let cursor = &mut cursors[rank as usize][channel as usize];
            if !ready(step, at, &pc, &links, cursor) {
                break;
            }
            *cursor = 0;
            ids.clear();
            ids.extend_from_slice(links.of_step(at));
            let (recv_ids, send_ids) = ids.split_at(step.recv_from.len());
            for (&from, &id) in step.recv_from.iter().zip(recv_ids) {
                let msg = links.pop(id).expect("checked ready");
                if record_deliveries {
                    deliveries.push((msg.from, at));
                }
                wake.push((from, channel));
                received.push(msg.payload);
            }
            let sent = semantics.fire(at, step, &mut received);
            received.clear();
            if let Some(payload) = sent {
                for (&to, &id) in step.send_to.iter().zip(send_ids) {
                    let msg = Message {
                        from: at,
                        payload: payload.clone(),
                    };
                    links.push(id, msg);
                    wake.push((to, channel));
                }
            }
            pc[rank as usize][channel as usize] += 1;
            let other_channels = schedule.ranks[rank as usize].channels.len() as u32;
            wake.extend(
                (0..other_channels)
                    .filter(|&c| c != channel)
                    .map(|c| (rank, c)),
            );
            for (r, c) in wake.drain(..) {
                if let Some(q) = queued
                    .get_mut(r as usize)
                    .and_then(|v| v.get_mut(c as usize))
                    && !*q
                {
                    *q = true;
                    work.push((r, c));
                }
            }
        }
    }

    let mut stalled = Vec::new();
    for (r, prog) in schedule.ranks.iter().enumerate() {
        for (c, steps) in prog.channels.iter().enumerate() {
            let index = pc[r][c];
            if let Some(step) = steps.get(index as usize) {
                let at = StepAt {
                    rank: r as Rank,
                    channel: c as u32,
                    index,
                };
                stalled.push(Stalled {
                    at,
                    waits: waits(step, at, &pc, &links),
                });
            }
        }
    }
    let leftover = links
        .ends
        .iter()
        .zip(&links.len)
        .filter(|&(_, &len)| len > 0)
        .map(|(&link, &len)| (link, len))
        .collect();
    FlowOutcome {
        stalled,
        leftover,
        deliveries,
    }
}

/// True when `step` can fire now. Its conditions (`after` references,
/// then receives, then sends) are monotone — once met, only this step
/// unmeets them — so `cursor` remembers how many are already known met and
/// each is checked once per wake at most, not once per wake each.
fn ready<P>(
    step: &Step,
    at: StepAt,
    pc: &[Vec<u32>],
    links: &Links<P>,
    cursor: &mut usize,
) -> bool {
    let deps = step.after.len();
    let recvs = step.recv_from.len();
    let ids = links.of_step(at);
    let total = deps + ids.len();
    while *cursor < total {
        let i = *cursor;
        let met = if i < deps {
            let dep = step.after[i];
            pc[at.rank as usize][dep.channel as usize] > dep.step
        } else if i < deps + recvs {
            links.queued(ids[i - deps]) > 0
        } else {
            links.queued(ids[i - deps]) < links.slots
        };
        if !met {
            return false;
        }
        *cursor += 1;
    }
    true
}

/// Everything that keeps `step` from firing.
fn waits<P>(step: &Step, at: StepAt, pc: &[Vec<u32>], links: &Links<P>) -> Vec<Wait> {
    let mut out = Vec::new();
    for dep in &step.after {
        if pc[at.rank as usize][dep.channel as usize] <= dep.step {
            out.push(Wait::Step(*dep));
        }
    }
    let (recv_ids, send_ids) = links.of_step(at).split_at(step.recv_from.len());
    for (&from, &id) in step.recv_from.iter().zip(recv_ids) {
        if links.queued(id) == 0 {
            out.push(Wait::Message { from });
        }
    }
    for (&to, &id) in step.send_to.iter().zip(send_ids) {
        if links.queued(id) >= links.slots {
            out.push(Wait::Slot { to });
        }
    }
    out
}

/// The happens-before graph of a run: every step is a node; edges are
/// program order, `after` references and delivered messages.
pub(crate) struct HappensBefore {
    /// First node id of each (rank, channel).
    base: Vec<Vec<usize>>,
    succ: Vec<Vec<usize>>,
    /// Each node's place in a topological order; `None` when the graph
    /// has a cycle (a run that deadlocked), where no order prunes.
    place: Option<Vec<u32>>,
    /// The search's working memory, kept between questions.
    search: std::cell::RefCell<Search>,
}

/// A reachability search's marks: a node is seen in this search when
/// its stamp equals the search's.
#[derive(Default)]
struct Search {
    stamp: Vec<u32>,
    current: u32,
    stack: Vec<usize>,
}

impl HappensBefore {
    pub(crate) fn new(schedule: &Schedule, deliveries: &[(StepAt, StepAt)]) -> Self {
        let mut base = Vec::new();
        let mut total = 0;
        for prog in &schedule.ranks {
            let mut row = Vec::new();
            for steps in &prog.channels {
                row.push(total);
                total += steps.len();
            }
            base.push(row);
        }
        let mut order = HappensBefore {
            base,
            succ: vec![Vec::new(); total],
            place: None,
            search: Default::default(),
        };
        for (at, step) in schedule.steps() {
            let id = order.id(at);
            let len = schedule.ranks[at.rank as usize].channels[at.channel as usize].len();
            if (at.index as usize) + 1 < len {
                order.succ[id].push(id + 1);
            }
            for dep in &step.after {
                let from = order.base[at.rank as usize][dep.channel as usize] + dep.step as usize;
                order.succ[from].push(id);
            }
        }
        for &(from, to) in deliveries {
            let (f, t) = (order.id(from), order.id(to));
            order.succ[f].push(t);
        }
        order.place = topological_places(&order.succ);
        order
    }

    fn id(&self, at: StepAt) -> usize {
        self.base[at.rank as usize][at.channel as usize] + at.index as usize
    }

    /// True when `from` happens before `to` (or is `to`).
    ///
    /// A search from `from` that stops at `to` and never enters a node
    /// placed after `to` in a topological order (no path from there can
    /// come back to `to`): questions about steps close in the run cost
    /// little even at a thousand ranks, where keeping each asked step's
    /// whole reach (as this did) took minutes of full searches.
    pub(crate) fn reaches(&self, from: StepAt, to: StepAt) -> bool {
        let (from, to) = (self.id(from), self.id(to));
        if from == to {
            return true;
        }
        let limit = match &self.place {
            Some(place) if place[from] > place[to] => return false,
            Some(place) => Some((place, place[to])),
            None => None,
        };
        let mut search = self.search.borrow_mut();
        let Search {
            stamp,
            current,
            stack,
        } = &mut *search;
        if stamp.len() != self.succ.len() || *current == u32::MAX {
            *stamp = vec![0; self.succ.len()];
            *current = 0;
        }
        *current += 1;
        let mark = *current;
        stack.clear();
        stack.push(from);
        stamp[from] = mark;
        // A node lists its rank's steps that follow it (program order and
        // waits) before the steps its messages reach, which are added
        // last: pushed in reverse, the rank's own steps are searched first,
        // and the answer is most often among them.
        while let Some(v) = stack.pop() {
            for &w in self.succ[v].iter().rev() {
                if w == to {
                    return true;
                }
                if stamp[w] == mark || limit.is_some_and(|(place, last)| place[w] > last) {
                    continue;
                }
                stamp[w] = mark;
                stack.push(w);
            }
        }
        false
    }
}

/// Each node's place in a topological order of `succ` (Kahn's), or
/// `None` when `succ` has a cycle.
fn topological_places(succ: &[Vec<usize>]) -> Option<Vec<u32>> {
    let total = succ.len();
    u32::try_from(total).ok()?;
    let mut preds = vec![0u32; total];
    for list in succ {
        for &w in list {
            preds[w] += 1;
        }
    }
    // First in, first out: nodes are placed about in the order the run
    // reaches them, so the nodes placed between two steps are about those
    // that run between them, and a search between them stays small.
    let mut ready: std::collections::VecDeque<usize> =
        (0..total).filter(|&v| preds[v] == 0).collect();
    let mut place = vec![u32::MAX; total];
    let mut next = 0u32;
    while let Some(v) = ready.pop_front() {
        place[v] = next;
        next += 1;
        for &w in &succ[v] {
            preds[w] -= 1;
            if preds[w] == 0 {
                ready.push_back(w);
            }
        }
    }
    (next as usize == total).then_some(place)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pair's answer against a plain search over the whole graph.
    fn check_all_pairs(succ: Vec<Vec<usize>>) {
        let total = succ.len();
        let order = HappensBefore {
            base: vec![vec![0]],
            place: topological_places(&succ),
            succ,
            search: Default::default(),
        };
        let at = |i: usize| StepAt {
            rank: 0,
            channel: 0,
            index: i as u32,
        };
        for from in 0..total {
            let mut seen = vec![false; total];
            let mut stack = vec![from];
            seen[from] = true;
            while let Some(v) = stack.pop() {
                for &w in &order.succ[v] {
                    if !seen[w] {
                        seen[w] = true;
                        stack.push(w);
                    }
                }
            }
            for (to, &want) in seen.iter().enumerate() {
                assert_eq!(order.reaches(at(from), at(to)), want, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn reachability_equals_a_full_search_on_random_graphs() {
        let mut seed = 7u64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for round in 0..200 {
            let total = 1 + next(40) as usize;
            // Node ids shuffled against the order edges follow, so the
            // topological places are not the ids.
            let mut label: Vec<usize> = (0..total).collect();
            for i in (1..total).rev() {
                label.swap(i, next(i as u64 + 1) as usize);
            }
            let mut succ = vec![Vec::new(); total];
            for a in 0..total {
                for b in a + 1..total {
                    if next(6) == 0 {
                        succ[label[a]].push(label[b]);
                    }
                }
            }
            // Every fifth graph gets a cycle (first -> last -> first): the
            // search must still be right without an order to prune by.
            let cyclic = round % 5 == 0 && total > 1;
            if cyclic {
                succ[label[0]].push(label[total - 1]);
                succ[label[total - 1]].push(label[0]);
            }
            assert_eq!(topological_places(&succ).is_none(), cyclic);
            check_all_pairs(succ);
        }
    }
}
