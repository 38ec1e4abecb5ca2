//! The network a plan runs on: the resources of a topology (links,
//! memories, core pools, a GPU channel's thread block) and which of them,
//! with what weight, each instruction's local work and each of its
//! transfers crosses. The detailed engine and the steady-state estimate
//! both ask here, so they charge every byte alike.

use std::collections::HashMap;

use ferrocoll_core::plan::{ExecutionPlan, Instruction};
use ferrocoll_core::types::Buffer;

use super::cost::CostModel;
use super::fairshare::Uses;
use crate::error::TopologyError;
use crate::graph::{LinkKind, NodeId, NodeKind, Router, Topology};

/// A resource flows compete for.
#[derive(Debug, Clone)]
pub(crate) struct Resource {
    pub name: String,
    /// Bytes per µs.
    pub capacity: f64,
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
    pub(crate) fn add_blocks(&mut self, plan: &ExecutionPlan) {
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

    /// The local work of `ins` on `rank`'s `channel`: its bytes and the
    /// resources they cross, or `None` when it moves nothing a resource
    /// feels (a GPU step that streams into its sends, an in-place copy of
    /// bytes onto themselves). `at_rest`: its one received message was
    /// sent from bytes at rest, not computed by the sending step.
    pub(crate) fn work_flow(
        &self,
        rank: u32,
        channel: u32,
        ins: &Instruction,
        in_place: bool,
        at_rest: bool,
    ) -> Option<(f64, Uses)> {
        if self.fuses_into_sends(rank, ins) {
            return None;
        }
        let pure = in_place
            && ins.recv.is_empty()
            && matches!((&ins.read, &ins.write), (Some(r), Some(w)) if r == w && r.buffer != Buffer::Scratch);
        let (bytes, uses) = self.local_work(rank, ins, ins.bytes as f64, pure, at_rest);
        let uses = self.with_block(uses, rank, channel, 1.0);
        (bytes > 0.0 && !uses.is_empty()).then_some((bytes, uses))
    }

    /// The resources a transfer of `ins` from `rank` to `peer` on
    /// `channel` crosses per byte, and when it is delivered after its
    /// last byte leaves (route latency plus the device's step latency).
    pub(crate) fn transfer_flow(
        &mut self,
        rank: u32,
        channel: u32,
        ins: &Instruction,
        peer: u32,
    ) -> Result<(Uses, f64), TopologyError> {
        let step_latency = self.cost.overheads(self.kind(rank)).step_latency_us;
        let (mut uses, latency) = self.route(rank, peer)?;
        if self.fuses_into_sends(rank, ins) {
            uses.extend(self.streaming_memory(rank, peer, ins));
            // The block loads its inputs once for every destination and
            // stores into each.
            let reads = if ins.reduces() {
                ins.inputs() as f64
            } else {
                1.0
            };
            let weight = 1.0 + reads / ins.send.len() as f64;
            uses = self.with_block(uses, rank, channel, weight);
        }
        Ok((uses, latency + step_latency))
    }

    /// The device's fixed costs for `rank`.
    pub(crate) fn overheads(&self, rank: u32) -> super::cost::Overheads {
        self.cost.overheads(self.kind(rank))
    }
}
