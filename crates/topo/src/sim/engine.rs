//! The discrete-event engine: runs a schedule's steps on a topology.
//!
//! Every (rank, channel) runs its steps in order, segment after segment, as
//! the executors do. A step starts when its messages have arrived, its
//! `after` steps are complete and each (sender, receiver, channel) pair has
//! a free message slot, as in the CPU executor; it
//! then pays the device's step overhead, does its local memory work, and
//! launches one transfer per destination. Transfers and local work are
//! flows over resources (links, memories, core pools) shared max-min
//! fairly ([`super::fairshare`]); a transfer is delivered one route latency
//! after its last byte leaves.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ferrocoll_core::schedule::layout::Layout;
use ferrocoll_core::schedule::{Buffer, Schedule, Step};

use super::cost::CostModel;
use super::fairshare::{self, Uses};
use crate::error::TopologyError;
use crate::graph::{LinkKind, NodeId, NodeKind, Topology};

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
}

/// The resources of a topology and how ranks use them.
pub(crate) struct Fabric<'a> {
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
    cost: &'a CostModel,
}

impl<'a> Fabric<'a> {
    pub(crate) fn new(topo: &'a Topology, devices: Vec<NodeId>, cost: &'a CostModel) -> Fabric<'a> {
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
        Fabric {
            topo,
            resources,
            devices,
            link_res,
            memory_res,
            cores_res,
            routes: HashMap::new(),
            cost,
        }
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
        let route = self.topo.route(self.device(from), self.device(to))?;
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

    /// Whether the step's local work streams with its sends: a GPU kernel
    /// reduces slices as it copies them, so the reduction overlaps the wire.
    pub(crate) fn fuses_into_sends(&self, rank: u32, step: &Step) -> bool {
        self.kind(rank) != NodeKind::Thread && !step.send_to.is_empty()
    }

    /// The memories a fused GPU send streams through: the sender reads each
    /// input once, the receiver writes the message once.
    fn streaming_memory(&self, from: u32, to: u32, step: &Step) -> Uses {
        let mut uses = Uses::new();
        let reads = if step.reduces() {
            step.input_count() as f64
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

    /// Bytes of local memory traffic for a step moving `m` bytes, and the
    /// resources it crosses.
    fn local_work(&self, rank: u32, step: &Step, m: f64, pure_local_copy: bool) -> (f64, Uses) {
        let dev = self.device(rank);
        let inputs = step.input_count() as f64;
        match self.kind(rank) {
            NodeKind::Thread => {
                // Shared memory: every value computed is read once per
                // input and written once; a value only forwarded is written
                // straight into the consumer's buffer by the producer.
                let received_copy = step.recv_from.len() == 1 && step.read.is_none();
                let bytes = if pure_local_copy {
                    0.0
                } else if step.reduces() {
                    inputs * m + m
                } else if step.write.is_some() {
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
                let bytes = if step.reduces() { inputs * m + m } else { 0.0 };
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
    /// A step's overhead has passed: start its local work.
    Work { rank: u32, channel: u32 },
    /// A message reaches its receiver.
    Deliver { from: u32, to: u32, channel: u32 },
}

#[derive(Debug, Clone, Copy)]
enum Done {
    Work {
        rank: u32,
        channel: u32,
    },
    Transfer {
        from: u32,
        to: u32,
        channel: u32,
        latency: f64,
    },
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

/// Run `schedule` with `layout` on `fabric`.
pub(crate) fn run(
    fabric: &mut Fabric,
    schedule: &Schedule,
    layout: &Layout,
    element_size: usize,
    slots: u32,
    in_place: bool,
) -> Result<Raw, TopologyError> {
    let n = schedule.world_size;
    let segments = layout.segments();
    let channels: Vec<usize> = schedule.ranks.iter().map(|p| p.channels.len()).collect();
    let total =
        |r: usize, c: usize| schedule.ranks[r].channels[c].len() as u64 * u64::from(segments);
    // Completed step instances per (rank, channel), and whether one runs.
    let mut completed: Vec<Vec<u64>> = channels.iter().map(|&c| vec![0; c]).collect();
    let mut busy: Vec<Vec<bool>> = channels.iter().map(|&c| vec![false; c]).collect();
    let mut inbox: HashMap<(u32, u32, u32), u32> = HashMap::new();
    let mut in_flight: HashMap<(u32, u32, u32), u32> = HashMap::new();
    let mut events: BinaryHeap<Reverse<(u64, u64, Event)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut flows: Vec<Flow> = Vec::new();
    let mut carried = vec![0.0; fabric.resources.len()];
    let capacity: Vec<f64> = fabric.resources.iter().map(|r| r.capacity).collect();
    let mut now = 0.0f64;

    let step_at = |r: u32, c: usize, k: u64| -> (&Step, u32) {
        let steps = &schedule.ranks[r as usize].channels[c];
        (
            &steps[(k % steps.len() as u64) as usize],
            (k / steps.len() as u64) as u32,
        )
    };
    let bytes_of = |step: &Step, seg: u32| -> f64 {
        let chunk = step.write.or(step.read).map_or(0, |s| s.chunk);
        (layout.slice_len(seg, chunk, step.chunks) * element_size) as f64
    };

    let mut dirty: Vec<u32> = (0..n).collect();
    loop {
        // Start every step that can start; starting one may free a slot
        // for another rank, so repeat until nothing changes.
        while let Some(r) = dirty.pop() {
            for c in 0..channels[r as usize] {
                let k = completed[r as usize][c];
                if busy[r as usize][c] || k >= total(r as usize, c) {
                    continue;
                }
                let (step, seg) = step_at(r, c, k);
                let ch = c as u32;
                let after_ok = step.after.iter().all(|a| {
                    let len = schedule.ranks[r as usize].channels[a.channel as usize].len() as u64;
                    completed[r as usize][a.channel as usize]
                        > u64::from(seg) * len + u64::from(a.step)
                });
                let need = |p: u32| step.recv_from.iter().filter(|&&q| q == p).count() as u32;
                let recv_ok = step
                    .recv_from
                    .iter()
                    .all(|&p| inbox.get(&(p, r, ch)).copied().unwrap_or(0) >= need(p));
                let send_ok = step.send_to.iter().all(|&s| {
                    let sends = step.send_to.iter().filter(|&&q| q == s).count() as u32;
                    in_flight.get(&(r, s, ch)).copied().unwrap_or(0) + sends <= slots
                });
                if !(after_ok && recv_ok && send_ok) {
                    continue;
                }
                for &p in &step.recv_from {
                    *inbox.get_mut(&(p, r, ch)).expect("checked") -= 1;
                    *in_flight.get_mut(&(p, r, ch)).expect("sender reserved") -= 1;
                    dirty.push(p);
                }
                for &s in &step.send_to {
                    *in_flight.entry((r, s, ch)).or_default() += 1;
                }
                busy[r as usize][c] = true;
                let step_us = fabric.cost.overheads(fabric.kind(r)).step_busy_us;
                seq += 1;
                events.push(Reverse((
                    key(now + step_us),
                    seq,
                    Event::Work {
                        rank: r,
                        channel: ch,
                    },
                )));
            }
        }

        // Rates of the flows now running.
        let uses: Vec<&Uses> = flows.iter().map(|f| &f.uses).collect();
        let rate = fairshare::rates(&capacity, &uses);
        let next_flow = flows
            .iter()
            .zip(&rate)
            .map(|(f, &r)| if r.is_infinite() { 0.0 } else { f.left / r })
            .fold(f64::INFINITY, f64::min);
        let next_event = events
            .peek()
            .map_or(f64::INFINITY, |Reverse((t, _, _))| f64::from_bits(*t) - now);
        let dt = next_flow.min(next_event).max(0.0);
        if !dt.is_finite() {
            break;
        }
        for (f, &r) in flows.iter_mut().zip(&rate) {
            let moved = if r.is_infinite() {
                f.left
            } else {
                (r * dt).min(f.left)
            };
            f.left -= moved;
            for &(res, w) in &f.uses {
                carried[res] += moved * w;
            }
        }
        now += dt;

        let mut finished: Vec<Done> = Vec::new();
        flows.retain(|f| {
            if f.left <= 1e-9 * (1.0 + f.left.abs()) || f.left <= 1e-6 {
                finished.push(f.done);
                false
            } else {
                true
            }
        });
        while let Some(Reverse((t, _, _))) = events.peek() {
            if f64::from_bits(*t) > now + 1e-9 {
                break;
            }
            let Reverse((_, _, e)) = events.pop().expect("peeked");
            match e {
                Event::Work { rank, channel } => {
                    let c = channel as usize;
                    let (step, seg) = step_at(rank, c, completed[rank as usize][c]);
                    let m = bytes_of(step, seg);
                    let pure_local_copy = in_place
                        && step.recv_from.is_empty()
                        && match (step.read, step.write) {
                            (Some(rd), Some(wr)) => {
                                schedule.physical(true, rank, rd.buffer, rd.chunk)
                                    == schedule.physical(true, rank, wr.buffer, wr.chunk)
                                    && rd.buffer != Buffer::Scratch
                            }
                            _ => false,
                        };
                    let (bytes, uses) = if fabric.fuses_into_sends(rank, step) {
                        (0.0, Uses::new())
                    } else {
                        fabric.local_work(rank, step, m, pure_local_copy)
                    };
                    let done = Done::Work { rank, channel };
                    if bytes > 0.0 && !uses.is_empty() {
                        flows.push(Flow {
                            left: bytes,
                            uses,
                            done,
                        });
                    } else {
                        finished.push(done);
                    }
                }
                Event::Deliver { from, to, channel } => {
                    *inbox.entry((from, to, channel)).or_default() += 1;
                    dirty.push(to);
                }
            }
        }
        for done in finished {
            match done {
                Done::Work { rank, channel } => {
                    let c = channel as usize;
                    let (step, seg) = step_at(rank, c, completed[rank as usize][c]);
                    let m = bytes_of(step, seg);
                    let step_latency = fabric.cost.overheads(fabric.kind(rank)).step_latency_us;
                    for &s in &step.send_to {
                        let (mut uses, latency) = fabric.route(rank, s)?;
                        let latency = latency + step_latency;
                        if fabric.fuses_into_sends(rank, step) {
                            uses.extend(fabric.streaming_memory(rank, s, step));
                        }
                        let done = Done::Transfer {
                            from: rank,
                            to: s,
                            channel,
                            latency,
                        };
                        if m > 0.0 && !uses.is_empty() {
                            flows.push(Flow {
                                left: m,
                                uses,
                                done,
                            });
                        } else {
                            seq += 1;
                            events.push(Reverse((
                                key(now + latency),
                                seq,
                                Event::Deliver {
                                    from: rank,
                                    to: s,
                                    channel,
                                },
                            )));
                        }
                    }
                    completed[rank as usize][c] += 1;
                    busy[rank as usize][c] = false;
                    dirty.push(rank);
                }
                Done::Transfer {
                    from,
                    to,
                    channel,
                    latency,
                } => {
                    seq += 1;
                    events.push(Reverse((
                        key(now + latency),
                        seq,
                        Event::Deliver { from, to, channel },
                    )));
                }
            }
        }
        if flows.is_empty() && events.is_empty() && dirty.is_empty() {
            break;
        }
    }
    let unfinished =
        (0..n as usize).any(|r| (0..channels[r]).any(|c| completed[r][c] < total(r, c)));
    if unfinished {
        return Err(TopologyError::Invalid(format!(
            "schedule `{}` stalls in the simulator (a schedule that passed the verifier never does)",
            schedule.name
        )));
    }
    let call_us = (0..n)
        .map(|r| fabric.cost.overheads(fabric.kind(r)).call_us)
        .fold(0.0, f64::max);
    Ok(Raw {
        time_us: now + call_us,
        carried,
    })
}
