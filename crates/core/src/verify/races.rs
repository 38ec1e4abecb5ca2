//! Races between channels of one rank: two steps that touch overlapping
//! data, at least one writing, with no ordering between them through
//! program order, `after` references or delivered messages.

use std::collections::HashSet;

use super::symbolic::Access;
use super::violation::{Mode, Violation, ViolationKind as K, Violations};
use crate::schedule::{Schedule, StepAt};

/// The happens-before graph: every step is a node.
struct Order {
    /// First node id of each (rank, channel).
    base: Vec<Vec<usize>>,
    succ: Vec<Vec<usize>>,
}

impl Order {
    fn new(schedule: &Schedule, deliveries: &[(StepAt, StepAt)]) -> Self {
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
        let mut order = Order {
            base,
            succ: vec![Vec::new(); total],
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
        order
    }

    fn id(&self, at: StepAt) -> usize {
        self.base[at.rank as usize][at.channel as usize] + at.index as usize
    }

    fn reaches(&self, from: StepAt, to: StepAt) -> bool {
        let (from, to) = (self.id(from), self.id(to));
        let mut seen = HashSet::new();
        let mut stack = vec![from];
        while let Some(v) = stack.pop() {
            if v == to {
                return true;
            }
            for &w in &self.succ[v] {
                if seen.insert(w) {
                    stack.push(w);
                }
            }
        }
        false
    }
}

pub(crate) fn check(
    schedule: &Schedule,
    mode: Mode,
    accesses: &[Access],
    deliveries: &[(StepAt, StepAt)],
) -> Violations {
    let mut out = Violations::default();
    let mut order: Option<Order> = None;
    let mut by_rank: Vec<Vec<&Access>> = vec![Vec::new(); schedule.world_size as usize];
    for a in accesses {
        by_rank[a.at.rank as usize].push(a);
    }
    let mut reported: HashSet<(StepAt, StepAt)> = HashSet::new();
    for list in &mut by_rank {
        list.sort_by_key(|a| (a.region, a.start));
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if b.region != a.region || b.start >= a.end {
                    break;
                }
                if a.at.channel == b.at.channel {
                    continue;
                }
                if a.region == 2 {
                    if reported.insert((a.at, b.at)) {
                        out.push(Violation::at(
                            mode,
                            a.at,
                            K::ScratchSharedAcrossChannels {
                                other_channel: b.at.channel,
                            },
                        ));
                    }
                    continue;
                }
                if !(a.write || b.write) {
                    continue;
                }
                let order = order.get_or_insert_with(|| Order::new(schedule, deliveries));
                if order.reaches(a.at, b.at) || order.reaches(b.at, a.at) {
                    continue;
                }
                if reported.insert((a.at, b.at)) {
                    out.push(
                        Violation::at(
                            mode,
                            a.at,
                            K::Race {
                                other: b.at,
                                buffer: a.buffer,
                            },
                        )
                        .with_chunk(a.start.max(b.start)),
                    );
                }
            }
        }
    }
    out
}
