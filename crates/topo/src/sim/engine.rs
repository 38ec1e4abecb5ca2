//! The discrete-event engine: interprets an execution plan on a topology.
//!
//! Every (rank, channel) fires its instructions in order, as the executors
//! do: an instruction starts when its messages have arrived, its waits are
//! met and each link it sends on has a free slot (the plan's model); it
//! then pays the device's step overhead, does its local memory work, and
//! launches one transfer per destination. Transfers and local work are
//! flows over resources (links, memories, core pools) shared max-min
//! fairly ([`super::fairshare`]); a transfer is delivered one route latency
//! after its last byte leaves. Lengths, regions, messages and waits are the
//! plan's; the engine derives none of them.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ferrocoll_core::plan::{ExecutionPlan, LinkLoad, Walk};
use ferrocoll_core::types::Link;

use super::fairshare::{self, Uses};
use super::network::Network;
use super::steady::Shares;
use crate::error::TopologyError;

/// What one run of the engine measured.
#[derive(Debug, Clone)]
pub(crate) struct Raw {
    pub time_us: f64,
    /// Bytes each resource carried (weighted).
    pub carried: Vec<f64>,
    /// Messages and bytes each link of the plan carried, counted as the
    /// transfers were launched.
    pub links: Vec<LinkLoad>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// An instruction's overhead has passed: start its local work.
    Work { rank: u32, channel: u32 },
    /// A message reaches its receiver.
    Deliver(Link),
    /// Local work at a steady share is done.
    WorkDone { rank: u32, channel: u32 },
}

#[derive(Debug, Clone, Copy)]
enum Done {
    Work { rank: u32, channel: u32 },
    Transfer { link: Link, latency: f64 },
}

struct Flow {
    left: f64,
    uses: Uses,
    done: Done,
}

/// A dirty mark for every channel of a rank.
const EVERY_CHANNEL: u32 = u32::MAX;

/// Time ordered by bits of a non-negative f64 (monotone for those).
fn key(t: f64) -> u64 {
    t.max(0.0).to_bits()
}

/// The state of one run.
struct Run<'p, 'n, 'a> {
    net: &'n mut Network<'a>,
    plan: &'p ExecutionPlan,
    walks: Vec<Walk<'p>>,
    busy: Vec<Vec<bool>>,
    /// Where each link sits in the plan's link table.
    link_index: LinkIndex,
    /// Messages delivered and not yet consumed, per link.
    inbox: Vec<u32>,
    /// Messages sent and not yet consumed, per link (slots in use).
    in_flight: Vec<u32>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    flows: Vec<Flow>,
    /// The flows' fair shares, kept while no flow starts or ends.
    rate: Vec<f64>,
    rates_stale: bool,
    shares: fairshare::Scratch,
    sharing: Sharing,
    /// The resources' capacities (resources are added while flows start,
    /// never changed).
    capacity: Vec<f64>,
    carried: Vec<f64>,
    /// What each link of the plan's table carried, by its place there.
    traffic: Vec<LinkLoad>,
    now: f64,
    /// (rank, channel) that may be able to start, [`EVERY_CHANNEL`] for
    /// all of the rank's (waits cross channels).
    dirty: Vec<(u32, u32)>,
    /// Messages sent by a step that computes nothing: a plain send of
    /// bytes at rest.
    at_rest: AtRest,
    /// Per rank: whether an instruction waits on another channel, so a
    /// finished step may free any of its channels, not only its own.
    waits_across: Vec<bool>,
}

/// The messages of a plan sent by plain sends (nothing received, nothing
/// written), whose receivers copy bytes at rest: a bit per message
/// number of each link of the plan's table.
struct AtRest {
    /// Where each link's bits start in `bits`.
    start: Vec<usize>,
    bits: Vec<bool>,
}

impl AtRest {
    fn of(plan: &ExecutionPlan, index: &LinkIndex) -> AtRest {
        let mut start = Vec::with_capacity(plan.links.len() + 1);
        let mut total = 0usize;
        for l in &plan.links {
            start.push(total);
            total = total.saturating_add(l.messages as usize);
        }
        start.push(total);
        let mut bits = vec![false; total];
        for rank in &plan.ranks {
            for (c, channel) in rank.channels.iter().enumerate() {
                for ins in channel
                    .iter()
                    .filter(|i| i.recv.is_empty() && i.write.is_none())
                {
                    for m in &ins.send {
                        let l = index.get(rank.rank, m.peer, c as u32);
                        if let Some(b) = AtRest::place(&start, l, m.index) {
                            bits[b] = true;
                        }
                    }
                }
            }
        }
        AtRest { start, bits }
    }

    /// The bit of message `number` on link `l`, if the link's table
    /// counts that many messages.
    fn place(start: &[usize], l: usize, number: u64) -> Option<usize> {
        let b = start.get(l)?.checked_add(usize::try_from(number).ok()?)?;
        (b < *start.get(l + 1)?).then_some(b)
    }

    fn contains(&self, l: usize, number: u64) -> bool {
        AtRest::place(&self.start, l, number).is_some_and(|b| self.bits[b])
    }
}

/// Per rank, whether any instruction waits on a channel other than its own.
fn waits_across(plan: &ExecutionPlan) -> Vec<bool> {
    plan.ranks
        .iter()
        .map(|rp| {
            rp.channels.iter().enumerate().any(|(c, list)| {
                list.iter()
                    .any(|ins| ins.after.iter().any(|w| w.channel as usize != c))
            })
        })
        .collect()
}

/// Entries a dense link index may have; past it (absurd rank or channel
/// counts in a plan from a file) the index is a map.
const MAX_DENSE_LINKS: usize = 1 << 22;

/// Where each link of a plan sits in its link table.
enum LinkIndex {
    /// `(from · n + to) · channels + channel`, for plans of sane size.
    Dense {
        n: usize,
        channels: usize,
        at: Vec<u32>,
    },
    Sparse(HashMap<Link, u32>),
}

impl LinkIndex {
    fn new(plan: &ExecutionPlan) -> LinkIndex {
        let (n, channels) = (plan.world_size as usize, plan.channels.max(1) as usize);
        let entries = n.saturating_mul(n).saturating_mul(channels);
        if entries > MAX_DENSE_LINKS {
            let map = plan
                .links
                .iter()
                .enumerate()
                .map(|(i, l)| (l.link, i as u32))
                .collect();
            return LinkIndex::Sparse(map);
        }
        let mut at = vec![u32::MAX; entries];
        for (i, l) in plan.links.iter().enumerate() {
            let k = (l.link.from as usize * n + l.link.to as usize) * channels
                + l.link.channel as usize;
            if let Some(slot) = at.get_mut(k) {
                *slot = i as u32;
            }
        }
        LinkIndex::Dense { n, channels, at }
    }

    /// The link's position in the table (a checked plan names only links
    /// of its table).
    fn get(&self, from: u32, to: u32, channel: u32) -> usize {
        match self {
            LinkIndex::Dense { n, channels, at } => {
                at[(from as usize * n + to as usize) * channels + channel as usize] as usize
            }
            LinkIndex::Sparse(map) => map[&Link { from, to, channel }] as usize,
        }
    }
}

/// How a run shares resources among its flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Max-min fair shares, recomputed whenever a flow starts or ends.
    Fair,
    /// Each flow at the share it would have in the steady state, fixed
    /// when it starts ([`super::steady`]).
    Steady,
}

/// The sharing state of a run.
enum Sharing {
    Fair,
    Steady {
        shares: Shares,
        /// When each link of the plan's table finishes sending what it
        /// was given.
        link_free: Vec<f64>,
    },
}

/// Run `plan` on `net`. At steady shares it runs twice: once weighing
/// every flow of a step index as concurrent, then at the concurrency that
/// run saw ([`Shares::refined`]).
pub(crate) fn run(
    net: &mut Network,
    plan: &ExecutionPlan,
    mode: Mode,
) -> Result<Raw, TopologyError> {
    net.add_blocks(plan);
    if mode == Mode::Fair {
        return Ok(run_with(net, plan, Sharing::Fair)?.0);
    }
    let steady = |shares| Sharing::Steady {
        shares,
        link_free: vec![0.0; plan.links.len()],
    };
    let first = Shares::of(net, plan)?;
    let (_, seen) = run_with(net, plan, steady(first))?;
    let Sharing::Steady { shares, .. } = seen else {
        unreachable!("a steady run keeps its sharing")
    };
    Ok(run_with(net, plan, steady(shares.refined()))?.0)
}

/// One run of `plan` on `net` (its blocks added); returns what it
/// measured and its sharing state at the end.
fn run_with(
    net: &mut Network,
    plan: &ExecutionPlan,
    sharing: Sharing,
) -> Result<(Raw, Sharing), TopologyError> {
    let carried = vec![0.0; net.resources.len()];
    let capacity = match sharing {
        Sharing::Fair => Vec::new(),
        Sharing::Steady { .. } => net.resources.iter().map(|r| r.capacity).collect(),
    };
    let link_index = LinkIndex::new(plan);
    let mut sim = Run {
        walks: plan.ranks.iter().map(Walk::new).collect(),
        busy: plan
            .ranks
            .iter()
            .map(|r| vec![false; r.channels.len()])
            .collect(),
        at_rest: AtRest::of(plan, &link_index),
        link_index,
        inbox: vec![0; plan.links.len()],
        in_flight: vec![0; plan.links.len()],
        events: BinaryHeap::new(),
        seq: 0,
        flows: Vec::new(),
        rate: Vec::new(),
        rates_stale: true,
        shares: fairshare::Scratch::default(),
        sharing,
        capacity,
        carried,
        traffic: plan.links.iter().map(|l| LinkLoad::new(l.link)).collect(),
        now: 0.0,
        dirty: (0..plan.world_size).map(|r| (r, EVERY_CHANNEL)).collect(),
        waits_across: waits_across(plan),
        net,
        plan,
    };
    loop {
        // A step costs about a pass over the flows and the resources
        // (the fair shares are recomputed): what the work budget counts.
        // At steady shares it costs a few heap operations.
        let step = match sim.sharing {
            Sharing::Fair => 1 + sim.flows.len() + sim.net.resources.len(),
            Sharing::Steady { .. } => 1,
        };
        crate::work::charge(step as u64)?;
        sim.start_ready();
        if !sim.advance_time() {
            break;
        }
        let finished = sim.finished_flows();
        let mut finished = sim.fire_events(finished);
        for done in finished.drain(..) {
            sim.complete(done)?;
        }
        if sim.flows.is_empty() && sim.events.is_empty() && sim.dirty.is_empty() {
            break;
        }
    }
    if !sim.walks.iter().all(Walk::done) {
        return Err(TopologyError::Invalid(format!(
            "the plan of `{}` stalls in the simulator (a plan compiled from a verified schedule never does)",
            plan.schedule
        )));
    }
    let call_us = (0..plan.world_size)
        .map(|r| sim.net.overheads(r).call_us)
        .fold(0.0, f64::max);
    // Links in order, as a map keyed by link would list them.
    let mut links: Vec<LinkLoad> = sim.traffic.into_iter().filter(|l| l.messages > 0).collect();
    links.sort_unstable_by_key(|l| l.link);
    let raw = Raw {
        time_us: sim.now + call_us,
        carried: sim.carried,
        links,
    };
    Ok((raw, sim.sharing))
}

impl Run<'_, '_, '_> {
    /// The position of a link in the plan's link table.
    fn slot(&self, from: u32, to: u32, channel: u32) -> usize {
        self.link_index.get(from, to, channel)
    }

    fn push(&mut self, at: f64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((key(at), self.seq, event)));
    }

    /// Start every instruction that can start; starting one may free a
    /// slot for another rank, so repeat until nothing changes.
    fn start_ready(&mut self) {
        while let Some((r, only)) = self.dirty.pop() {
            let channels = self.walks[r as usize].channels();
            let range = if only == EVERY_CHANNEL {
                0..channels
            } else {
                only as usize..only as usize + 1
            };
            for c in range {
                if !self.busy[r as usize][c] {
                    self.try_start(r, c);
                }
            }
        }
    }

    fn try_start(&mut self, r: u32, c: usize) {
        let Some((_, ins)) = self.walks[r as usize].ready(c) else {
            return;
        };
        let ch = c as u32;
        let slots = self.plan.slots_per_link;
        let recv_ok = ins
            .recv
            .iter()
            .all(|m| self.inbox[self.slot(m.peer, r, ch)] > 0);
        let send_ok = ins
            .send
            .iter()
            .all(|m| self.in_flight[self.slot(r, m.peer, ch)] < slots);
        if !(recv_ok && send_ok) {
            return;
        }
        for m in &ins.recv {
            let l = self.slot(m.peer, r, ch);
            self.inbox[l] -= 1;
            self.in_flight[l] -= 1;
            // A slot freed on the sender's link of this channel.
            self.dirty.push((m.peer, ch));
        }
        for m in &ins.send {
            let l = self.slot(r, m.peer, ch);
            self.in_flight[l] += 1;
        }
        self.busy[r as usize][c] = true;
        let step_us = self.net.overheads(r).step_busy_us;
        self.push(
            self.now + step_us,
            Event::Work {
                rank: r,
                channel: ch,
            },
        );
    }

    /// Move time to the next flow completion or event; false when nothing
    /// is left to happen.
    fn advance_time(&mut self) -> bool {
        // The shares change only when a flow starts or ends.
        if self.rate.len() != self.flows.len() || self.rates_stale {
            if self.capacity.len() != self.net.resources.len() {
                self.capacity = self.net.resources.iter().map(|r| r.capacity).collect();
            }
            let uses: Vec<&Uses> = self.flows.iter().map(|f| &f.uses).collect();
            self.shares.rates(&self.capacity, &uses, &mut self.rate);
            self.rates_stale = false;
        }
        let rate = std::mem::take(&mut self.rate);
        let next_flow = self
            .flows
            .iter()
            .zip(&rate)
            .map(|(f, &r)| if r.is_infinite() { 0.0 } else { f.left / r })
            .fold(f64::INFINITY, f64::min);
        let next_event = self
            .events
            .peek()
            .map_or(f64::INFINITY, |Reverse((t, _, _))| {
                f64::from_bits(*t) - self.now
            });
        let dt = next_flow.min(next_event).max(0.0);
        if !dt.is_finite() {
            return false;
        }
        for (f, &r) in self.flows.iter_mut().zip(&rate) {
            let moved = if r.is_infinite() {
                f.left
            } else {
                (r * dt).min(f.left)
            };
            f.left -= moved;
            for &(res, w) in &f.uses {
                self.carried[res] += moved * w;
            }
        }
        self.now += dt;
        self.rate = rate;
        true
    }

    fn finished_flows(&mut self) -> Vec<Done> {
        let mut finished = Vec::new();
        self.flows.retain(|f| {
            let over = f.left <= 1e-9 * (1.0 + f.left.abs()) || f.left <= 1e-6;
            if over {
                finished.push(f.done);
            }
            !over
        });
        self.rates_stale |= !finished.is_empty();
        finished
    }

    /// Handle every event due now; local work that needs no flow is done at once.
    fn fire_events(&mut self, mut finished: Vec<Done>) -> Vec<Done> {
        while let Some(Reverse((t, _, _))) = self.events.peek() {
            if f64::from_bits(*t) > self.now + 1e-9 {
                break;
            }
            let Reverse((_, _, e)) = self.events.pop().expect("peeked");
            match e {
                Event::Work { rank, channel } => {
                    if let Some(done) = self.start_work(rank, channel) {
                        finished.push(done);
                    }
                }
                Event::WorkDone { rank, channel } => finished.push(Done::Work { rank, channel }),
                Event::Deliver(link) => {
                    let l = self.slot(link.from, link.to, link.channel);
                    self.inbox[l] += 1;
                    self.dirty.push((link.to, link.channel));
                }
            }
        }
        finished
    }

    /// Start the local memory work of `channel`'s running instruction;
    /// `Some` when there is none to do.
    fn start_work(&mut self, rank: u32, channel: u32) -> Option<Done> {
        let (_, ins) = self.walks[rank as usize]
            .next(channel as usize)
            .expect("running");
        let done = Done::Work { rank, channel };
        let at_rest = ins.recv.first().is_some_and(|msg| {
            let l = self.slot(msg.peer, rank, channel);
            self.at_rest.contains(l, msg.index)
        });
        match self
            .net
            .work_flow(rank, channel, ins, self.plan.in_place, at_rest)
        {
            Some((bytes, uses)) => {
                self.start_flow(bytes, uses, done, None);
                None
            }
            None => Some(done),
        }
    }

    /// Start a flow of `bytes` over `uses` that ends in `done`; a transfer
    /// names its link's place in the table (`link`).
    fn start_flow(&mut self, bytes: f64, uses: Uses, done: Done, link: Option<usize>) {
        let Sharing::Steady { shares, link_free } = &mut self.sharing else {
            self.rates_stale = true;
            self.flows.push(Flow {
                left: bytes,
                uses,
                done,
            });
            return;
        };
        // At a steady share, alone in its stream: the flow's end is known
        // when it starts, and a link sends its messages one after another.
        let rate = shares.rate(&self.capacity, &uses);
        for &(r, w) in &uses {
            self.carried[r] += bytes * w;
        }
        let start = link.map_or(self.now, |l| link_free[l].max(self.now));
        let end = start + if rate.is_finite() { bytes / rate } else { 0.0 };
        shares.note(&uses, start, end);
        if let Some(l) = link {
            link_free[l] = end;
        }
        match done {
            Done::Work { rank, channel } => self.push(end, Event::WorkDone { rank, channel }),
            Done::Transfer { link, latency } => self.push(end + latency, Event::Deliver(link)),
        }
    }

    fn complete(&mut self, done: Done) -> Result<(), TopologyError> {
        match done {
            Done::Work { rank, channel } => self.send_all(rank, channel)?,
            Done::Transfer { link, latency } => self.push(self.now + latency, Event::Deliver(link)),
        }
        Ok(())
    }

    /// The instruction's work is done: launch its transfers and move on.
    fn send_all(&mut self, rank: u32, channel: u32) -> Result<(), TopologyError> {
        let c = channel as usize;
        let (_, ins) = self.walks[rank as usize].next(c).expect("running");
        let m = ins.bytes as f64;
        for msg in &ins.send {
            let link = Link {
                from: rank,
                to: msg.peer,
                channel,
            };
            let slot = self.slot(rank, msg.peer, channel);
            self.traffic[slot].count(ins.bytes);
            let (uses, latency) = self.net.transfer_flow(rank, channel, ins, msg.peer)?;
            let done = Done::Transfer { link, latency };
            if m > 0.0 && !uses.is_empty() {
                self.start_flow(m, uses, done, Some(slot));
            } else {
                self.push(self.now + latency, Event::Deliver(link));
            }
        }
        self.walks[rank as usize].advance(c);
        self.busy[rank as usize][c] = false;
        let woken = if self.waits_across[rank as usize] {
            EVERY_CHANNEL
        } else {
            channel
        };
        self.dirty.push((rank, woken));
        Ok(())
    }
}
