//! A plan as a dependency graph over all ranks, for executors that enqueue
//! every rank's work up front (CUDA streams and events) instead of firing
//! instructions as they become ready.
//!
//! An instruction depends on the one before it on its channel, on the
//! instructions it waits for, on the sender of each message it receives,
//! and — because message `k` of a link reuses the slot of message
//! `k − slots` — on the receiver of that earlier message before it sends.
//! A plan compiled from a verified schedule has such an order whenever the
//! links hold at least the slots it was proven with.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::{ExecutionPlan, PlanError};
use crate::types::{Link, Rank};

/// One instruction of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Node {
    /// Its rank.
    pub rank: Rank,
    /// Its channel.
    pub channel: u32,
    /// Its index on the channel.
    pub index: u32,
}

/// The plan's instructions, what each depends on, and an order that
/// respects every dependency.
#[derive(Debug, Clone)]
pub struct Dag {
    /// Every instruction, rank by rank, channel by channel.
    pub nodes: Vec<Node>,
    /// `deps[id]`: the nodes that must complete before node `id` starts.
    pub deps: Vec<Vec<usize>>,
    /// Every node once, dependencies first (smallest id first among the ready).
    pub order: Vec<usize>,
    base: Vec<Vec<usize>>,
}

impl Dag {
    /// The graph of `plan`; [`PlanError::Invalid`] when it has a cycle
    /// (the links hold too few slots), an unmatched message or a wait on an
    /// instruction that does not exist. Meant for checked plans
    /// ([`ExecutionPlan::check`]); it never panics on others.
    pub fn new(plan: &ExecutionPlan) -> Result<Dag, PlanError> {
        let mut dag = Dag::nodes(plan);
        let (producer, consumer) = dag.matching(plan);
        if let Some((l, k)) = producer.keys().find(|key| !consumer.contains_key(key)) {
            return Err(PlanError::Invalid(format!(
                "nobody receives message {k} on {}->{} channel {}",
                l.from, l.to, l.channel
            )));
        }
        let slots = u64::from(plan.slots_per_link);
        let missing = |what: &str, l: Link, k: u64| {
            PlanError::Invalid(format!(
                "{what} of message {k} on {}->{} channel {}",
                l.from, l.to, l.channel
            ))
        };
        for id in 0..dag.nodes.len() {
            let Node {
                rank,
                channel,
                index,
            } = dag.nodes[id];
            let ins = &plan.ranks[rank as usize].channels[channel as usize][index as usize];
            let mut deps = Vec::new();
            if index > 0 {
                deps.push(id - 1);
            }
            for w in &ins.after {
                let exists = plan.ranks[rank as usize]
                    .channels
                    .get(w.channel as usize)
                    .is_some_and(|list| (w.index as usize) < list.len());
                if !exists {
                    return Err(PlanError::Invalid(format!(
                        "rank {rank} channel {channel} instruction {index} waits for channel {} index {}, which does not exist",
                        w.channel, w.index
                    )));
                }
                deps.push(dag.id(rank, w.channel, w.index));
            }
            for m in &ins.recv {
                let l = Link {
                    from: m.peer,
                    to: rank,
                    channel,
                };
                deps.push(
                    *producer
                        .get(&(l, m.index))
                        .ok_or_else(|| missing("no sender", l, m.index))?,
                );
            }
            for m in ins.send.iter().filter(|m| m.index >= slots) {
                let l = Link {
                    from: rank,
                    to: m.peer,
                    channel,
                };
                let k = m.index - slots;
                deps.push(
                    *consumer
                        .get(&(l, k))
                        .ok_or_else(|| missing("no receiver", l, k))?,
                );
            }
            dag.deps[id] = deps;
        }
        dag.order = dag.topological()?;
        Ok(dag)
    }

    fn nodes(plan: &ExecutionPlan) -> Dag {
        let mut nodes = Vec::with_capacity(plan.instruction_count());
        let mut base = Vec::with_capacity(plan.ranks.len());
        for rp in &plan.ranks {
            let mut row = Vec::with_capacity(rp.channels.len());
            for (c, list) in rp.channels.iter().enumerate() {
                row.push(nodes.len());
                nodes.extend((0..list.len()).map(|i| Node {
                    rank: rp.rank,
                    channel: c as u32,
                    index: i as u32,
                }));
            }
            base.push(row);
        }
        Dag {
            deps: vec![Vec::new(); nodes.len()],
            nodes,
            order: Vec::new(),
            base,
        }
    }

    /// Which node sends and which receives each (link, message number).
    #[allow(clippy::type_complexity)]
    fn matching(
        &self,
        plan: &ExecutionPlan,
    ) -> (HashMap<(Link, u64), usize>, HashMap<(Link, u64), usize>) {
        let (mut producer, mut consumer) = (HashMap::new(), HashMap::new());
        for (id, node) in self.nodes.iter().enumerate() {
            let ins = &plan.ranks[node.rank as usize].channels[node.channel as usize]
                [node.index as usize];
            for m in &ins.send {
                let l = Link {
                    from: node.rank,
                    to: m.peer,
                    channel: node.channel,
                };
                producer.insert((l, m.index), id);
            }
            for m in &ins.recv {
                let l = Link {
                    from: m.peer,
                    to: node.rank,
                    channel: node.channel,
                };
                consumer.insert((l, m.index), id);
            }
        }
        (producer, consumer)
    }

    /// The node id of instruction `index` of (`rank`, `channel`).
    pub fn id(&self, rank: Rank, channel: u32, index: u32) -> usize {
        self.base[rank as usize][channel as usize] + index as usize
    }

    /// Kahn's algorithm, smallest ready node first, for a deterministic order.
    fn topological(&self) -> Result<Vec<usize>, PlanError> {
        let mut waiting: Vec<usize> = self.deps.iter().map(Vec::len).collect();
        let mut dependants: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for (id, ds) in self.deps.iter().enumerate() {
            for &d in ds {
                dependants[d].push(id);
            }
        }
        let mut ready: BinaryHeap<Reverse<usize>> = (0..self.nodes.len())
            .filter(|&i| waiting[i] == 0)
            .map(Reverse)
            .collect();
        let mut order = Vec::with_capacity(self.nodes.len());
        while let Some(Reverse(id)) = ready.pop() {
            order.push(id);
            for &d in &dependants[id] {
                waiting[d] -= 1;
                if waiting[d] == 0 {
                    ready.push(Reverse(d));
                }
            }
        }
        if order.len() != self.nodes.len() {
            return Err(PlanError::Invalid(
                "the dependencies form a cycle: the links hold fewer slots than the schedule needs"
                    .into(),
            ));
        }
        Ok(order)
    }
}
