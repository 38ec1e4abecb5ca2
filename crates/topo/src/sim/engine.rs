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
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use ferrocoll_core::plan::{ExecutionPlan, Instruction, LinkLoad, Walk};
use ferrocoll_core::types::{Buffer, Link};

use super::cost::CostModel;
use super::fairshare::{self, Uses};
use crate::error::TopologyError;
use crate::graph::{LinkKind, NodeId, NodeKind, Router, Topology};

/// A resource flows compete for.
#[derive(Debug, Clone)]
pub(crate) struct Resource {
    pub name: String,
    /// Bytes per µs.
    pub capacity: f64,
}

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

/// The resources of a topology and how ranks' traffic maps onto them.
pub(crate) struct Network<'a> {
    topo: &'a Topology,
    pub resources: Vec<Resource>,
    devices: Vec<NodeId>,
    /// Resource index of each link.
    link_res: Vec<usize>,
    /// Resource index of each node's memory, if modelled.
    memory_res: Vec<Option<usize>>,
    /// Resource index of each CPU node's core pool, if modelled.
    cores_res: Vec<Option<usize>>,
    routes: HashMap<(u32, u32), (Uses, f64)>,
    /// The topology's links indexed by node, built once for every route.
    router: Router<'a>,
    cost: &'a CostModel,
    /// Resources the topology gives; a run adds its plan's blocks after.
    base: usize,
    /// Resource index of each (rank, channel)'s thread block on a GPU, for
    /// the plan being run.
    blocks: Vec<Vec<Option<usize>>>,
}

impl<'a> Network<'a> {
    pub(crate) fn new(
        topo: &'a Topology,
        devices: Vec<NodeId>,
        cost: &'a CostModel,
    ) -> Network<'a> {
        let mut resources = Vec::new();
        let mut link_res = Vec::new();
        for l in &topo.links {
            link_res.push(resources.len());
            resources.push(Resource {
                name: format!(
                    "{} -> {} ({})",
                    topo.nodes[l.from].name, topo.nodes[l.to].name, l.kind
                ),
                capacity: cost.effective_bandwidth(&l.kind, l.bandwidth) * 1e3,
            });
        }
        let mut memory_res = vec![None; topo.nodes.len()];
        let mut cores_res = vec![None; topo.nodes.len()];
        for (i, n) in topo.nodes.iter().enumerate() {
            if let Some(bw) = n.memory_bandwidth {
                memory_res[i] = Some(resources.len());
                resources.push(Resource {
                    name: format!("{} memory", n.name),
                    capacity: bw * 1e3,
                });
            }
            if let Some(cores) = n.cores {
                // A core moves at most what one thread's link to memory
                // carries; the pool is that times the cores.
                let per_core = topo
                    .links
                    .iter()
                    .filter(|l| l.to == i && l.kind == LinkKind::SharedMemory)
                    .map(|l| l.bandwidth)
                    .fold(0.0, f64::max);
                if per_core > 0.0 {
                    cores_res[i] = Some(resources.len());
                    resources.push(Resource {
                        name: format!("{} cores", n.name),
                        capacity: per_core * f64::from(cores) * 1e3,
                    });
                }
            }
        }
        Network {
            topo,
            base: resources.len(),
            resources,
            devices,
            link_res,
            memory_res,
            cores_res,
            routes: HashMap::new(),
            router: Router::new(topo),
            cost,
            blocks: Vec::new(),
        }
    }

    /// A resource per GPU channel of `plan`: the thread block that moves
    /// its bytes, at the cost model's block throughput (none when it is
    /// 0, or on threads).
    fn add_blocks(&mut self, plan: &ExecutionPlan) {
        self.resources.truncate(self.base);
        self.blocks = plan
            .ranks
            .iter()
            .map(|rp| {
                (0..rp.channels.len())
                    .map(|c| {
                        let gpu = self.kind(rp.rank) != NodeKind::Thread;
                        (gpu && self.cost.gpu_block_gbps > 0.0).then(|| {
                            self.resources.push(Resource {
                                name: format!(
                                    "{} channel {c} (its SM's loads and stores)",
                                    self.topo.nodes[self.device(rp.rank)].name
                                ),
                                capacity: self.cost.gpu_block_gbps * 1e3,
                            });
                            self.resources.len() - 1
                        })
                    })
                    .collect()
            })
            .collect();
    }

    /// `uses` and, on a GPU, the channel's block moving `weight` bytes per
    /// byte of the flow.
    fn with_block(&self, mut uses: Uses, rank: u32, channel: u32, weight: f64) -> Uses {
        if let Some(b) = self.blocks[rank as usize][channel as usize] {
            uses.push((b, weight));
        }
        uses
    }

    fn device(&self, rank: u32) -> NodeId {
        self.devices[rank as usize]
    }

    fn kind(&self, rank: u32) -> NodeKind {
        self.topo.nodes[self.device(rank)].kind
    }

    /// Resources a message from `from` to `to` crosses, and the route
    /// latency. Over shared memory a message is read in place by its
    /// consumer, whose local work pays for it, so it crosses nothing.
    pub(crate) fn route(&mut self, from: u32, to: u32) -> Result<(Uses, f64), TopologyError> {
        if let Some(r) = self.routes.get(&(from, to)) {
            return Ok(r.clone());
        }
        let route = self.router.route(self.device(from), self.device(to))?;
        let shared = route
            .links
            .iter()
            .all(|&l| self.topo.links[l].kind == LinkKind::SharedMemory);
        let mut uses: Uses = Vec::new();
        if !shared {
            uses.extend(route.links.iter().map(|&l| (self.link_res[l], 1.0)));
            if let Some(cpu) = route.staged_in
                && let Some(m) = self.memory_res[cpu]
            {
                uses.push((m, 2.0));
            }
        }
        let entry = (uses, route.latency_us);
        self.routes.insert((from, to), entry.clone());
        Ok(entry)
    }

    /// Whether the instruction's local work streams with its sends: a GPU
    /// kernel reduces slices as it copies them, so the reduction overlaps the wire.
    pub(crate) fn fuses_into_sends(&self, rank: u32, ins: &Instruction) -> bool {
        self.kind(rank) != NodeKind::Thread && !ins.send.is_empty()
    }

    /// The memories a fused GPU send streams through: the sender reads each
    /// input once, the receiver writes the message once.
    fn streaming_memory(&self, from: u32, to: u32, ins: &Instruction) -> Uses {
        let mut uses = Uses::new();
        let reads = if ins.reduces() {
            ins.inputs() as f64
        } else {
            1.0
        };
        if let Some(r) = self.memory_res[self.device(from)] {
            uses.push((r, reads));
        }
        if let Some(r) = self.memory_res[self.device(to)] {
            uses.push((r, 1.0));
        }
        uses
    }

    /// Bytes of local memory traffic for an instruction moving `m` bytes,
    /// and the resources it crosses. `at_rest`: its one received message
    /// was sent from bytes at rest, not computed by the sending step.
    fn local_work(
        &self,
        rank: u32,
        ins: &Instruction,
        m: f64,
        pure_local_copy: bool,
        at_rest: bool,
    ) -> (f64, Uses) {
        let dev = self.device(rank);
        let inputs = ins.inputs() as f64;
        match self.kind(rank) {
            NodeKind::Thread => {
                // Shared memory: every value computed is read once per
                // input and written once; a value the producing step
                // computes is written straight into the consumer's buffer
                // as it is computed (one write), but a value sent from
                // bytes at rest is read there and written here (two).
                let received_copy = ins.recv.len() == 1 && ins.read.is_none() && !at_rest;
                let bytes = if pure_local_copy {
                    0.0
                } else if ins.reduces() {
                    inputs * m + m
                } else if ins.write.is_some() {
                    if received_copy { m } else { 2.0 * m }
                } else {
                    0.0
                };
                let mut uses = Uses::new();
                for (id, l) in self.topo.links_from(dev) {
                    if l.kind == LinkKind::SharedMemory {
                        uses.push((self.link_res[id], 1.0));
                        if let Some(r) = self.memory_res[l.to] {
                            uses.push((r, 1.0));
                        }
                        if let Some(r) = self.cores_res[l.to] {
                            uses.push((r, 1.0));
                        }
                        break;
                    }
                }
                (bytes, uses)
            }
            _ => {
                // A GPU reduces from its own memory; copies ride the links.
                let bytes = if ins.reduces() { inputs * m + m } else { 0.0 };
                let uses = self.memory_res[dev]
                    .map(|r| vec![(r, 1.0)])
                    .unwrap_or_default();
                (bytes, uses)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// An instruction's overhead has passed: start its local work.
    Work { rank: u32, channel: u32 },
    /// A message reaches its receiver.
    Deliver(Link),
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
    /// The resources' capacities (resources are added while flows start,
    /// never changed).
    capacity: Vec<f64>,
    carried: Vec<f64>,
    traffic: BTreeMap<Link, LinkLoad>,
    now: f64,
    dirty: Vec<u32>,
    /// Messages (link, number) sent by a step that computes nothing: a
    /// plain send of bytes at rest.
    at_rest: HashSet<(Link, u64)>,
}

/// The messages of `plan` sent by plain sends (nothing received, nothing
/// written): their receivers copy bytes at rest.
fn sent_at_rest(plan: &ExecutionPlan) -> HashSet<(Link, u64)> {
    let mut set = HashSet::new();
    for rank in &plan.ranks {
        for (c, channel) in rank.channels.iter().enumerate() {
            for ins in channel
                .iter()
                .filter(|i| i.recv.is_empty() && i.write.is_none())
            {
                for m in &ins.send {
                    let link = Link {
                        from: rank.rank,
                        to: m.peer,
                        channel: c as u32,
                    };
                    set.insert((link, m.index));
                }
            }
        }
    }
    set
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

/// Run `plan` on `net`.
pub(crate) fn run(net: &mut Network, plan: &ExecutionPlan) -> Result<Raw, TopologyError> {
    net.add_blocks(plan);
    let carried = vec![0.0; net.resources.len()];
    let mut sim = Run {
        walks: plan.ranks.iter().map(Walk::new).collect(),
        busy: plan
            .ranks
            .iter()
            .map(|r| vec![false; r.channels.len()])
            .collect(),
        link_index: LinkIndex::new(plan),
        inbox: vec![0; plan.links.len()],
        in_flight: vec![0; plan.links.len()],
        events: BinaryHeap::new(),
        seq: 0,
        flows: Vec::new(),
        rate: Vec::new(),
        rates_stale: true,
        shares: fairshare::Scratch::default(),
        capacity: Vec::new(),
        carried,
        traffic: BTreeMap::new(),
        now: 0.0,
        dirty: (0..plan.world_size).collect(),
        at_rest: sent_at_rest(plan),
        net,
        plan,
    };
    loop {
        // A step costs about a pass over the flows and the resources
        // (the fair shares are recomputed): what the work budget counts.
        crate::work::charge((1 + sim.flows.len() + sim.net.resources.len()) as u64)?;
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
        .map(|r| sim.net.cost.overheads(sim.net.kind(r)).call_us)
        .fold(0.0, f64::max);
    Ok(Raw {
        time_us: sim.now + call_us,
        carried: sim.carried,
        links: sim.traffic.into_values().collect(),
    })
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
        while let Some(r) = self.dirty.pop() {
            for c in 0..self.walks[r as usize].channels() {
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
            self.dirty.push(m.peer);
        }
        for m in &ins.send {
            let l = self.slot(r, m.peer, ch);
            self.in_flight[l] += 1;
        }
        self.busy[r as usize][c] = true;
        let step_us = self.net.cost.overheads(self.net.kind(r)).step_busy_us;
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
                Event::Deliver(link) => {
                    let l = self.slot(link.from, link.to, link.channel);
                    self.inbox[l] += 1;
                    self.dirty.push(link.to);
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
        let m = ins.bytes as f64;
        let done = Done::Work { rank, channel };
        let (bytes, uses) = if self.net.fuses_into_sends(rank, ins) {
            (0.0, Uses::new())
        } else {
            let at_rest = ins.recv.first().is_some_and(|msg| {
                let link = Link {
                    from: msg.peer,
                    to: rank,
                    channel,
                };
                self.at_rest.contains(&(link, msg.index))
            });
            let pure = self.pure_local_copy(ins);
            let (bytes, uses) = self.net.local_work(rank, ins, m, pure, at_rest);
            (bytes, self.net.with_block(uses, rank, channel, 1.0))
        };
        if bytes > 0.0 && !uses.is_empty() {
            self.rates_stale = true;
            self.flows.push(Flow {
                left: bytes,
                uses,
                done,
            });
            None
        } else {
            Some(done)
        }
    }

    /// In place, a step that reads and writes the same bytes moves nothing.
    fn pure_local_copy(&self, ins: &Instruction) -> bool {
        self.plan.in_place
            && ins.recv.is_empty()
            && matches!((&ins.read, &ins.write), (Some(r), Some(w)) if r == w && r.buffer != Buffer::Scratch)
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
        let step_latency = self.net.cost.overheads(self.net.kind(rank)).step_latency_us;
        for msg in &ins.send {
            let link = Link {
                from: rank,
                to: msg.peer,
                channel,
            };
            self.traffic
                .entry(link)
                .or_insert(LinkLoad::new(link))
                .count(ins.bytes);
            let (mut uses, latency) = self.net.route(rank, msg.peer)?;
            let latency = latency + step_latency;
            if self.net.fuses_into_sends(rank, ins) {
                uses.extend(self.net.streaming_memory(rank, msg.peer, ins));
                // The block loads its inputs once for every destination
                // and stores into each.
                let reads = if ins.reduces() {
                    ins.inputs() as f64
                } else {
                    1.0
                };
                let weight = 1.0 + reads / ins.send.len() as f64;
                uses = self.net.with_block(uses, rank, channel, weight);
            }
            let done = Done::Transfer { link, latency };
            if m > 0.0 && !uses.is_empty() {
                self.rates_stale = true;
                self.flows.push(Flow {
                    left: m,
                    uses,
                    done,
                });
            } else {
                self.push(self.now + latency, Event::Deliver(link));
            }
        }
        self.walks[rank as usize].advance(c);
        self.busy[rank as usize][c] = false;
        self.dirty.push(rank);
        Ok(())
    }
}
