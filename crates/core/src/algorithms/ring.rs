//! Ring: the bandwidth-optimal schedule for any link graph that contains a
//! Hamiltonian cycle.
//!
//! ```text
//! all-reduce, n = 4, chunks a b c d; each arrow is one step on every rank
//!
//!   reduce-scatter (n-1 steps)          all-gather (n-1 steps)
//!   r0 ──a──▶ r1 ──b──▶ r2 ──c──▶ r3    each rank forwards the reduced
//!   ▲                              │    chunk it just completed or received
//!   └──────────────d───────────────┘    until every rank holds all four
//! ```
//!
//! Cost (all-reduce): 2(n−1) steps, each moving S/n bytes per rank:
//! `2(n−1)·α + 2(n−1)/n · S/B`. Reduce-scatter and all-gather are one half
//! each: `(n−1)·α + (n−1)/n · S/B` (S the larger buffer). Broadcast and
//! reduce are chains around the ring starting (or ending) at the root:
//! `(n−1)·α + S/B` once segments pipeline.
//!
//! Traffic over all links, in blocks of `count` elements
//! ([`traffic_blocks`]): all-reduce 2(n−1); reduce-scatter and all-gather
//! n(n−1) (every rank passes on n−1 of the n blocks); broadcast and reduce
//! n−1 (each link of the chain carries the whole buffer once).
//!
//! The ring order is a parameter (one per channel): the topology crate
//! picks orders whose slowest link is fastest. Each channel carries its own
//! share of the chunks.

use super::{AlgorithmError, AlgorithmParams, wrap};
use crate::schedule::{Schedule, ScheduleBuilder, Step};
use crate::types::{Buffer, Collective, Rank};

/// One channel's ring: the order and each rank's position in it.
struct Ring {
    order: Vec<Rank>,
    position: Vec<u32>,
}

impl Ring {
    fn new(order: Vec<Rank>) -> Self {
        let mut position = vec![0; order.len()];
        for (p, &r) in order.iter().enumerate() {
            position[r as usize] = p as u32;
        }
        Ring { order, position }
    }

    /// The rank `offset` places after `rank` (before, if negative).
    fn at(&self, rank: Rank, offset: i64) -> Rank {
        let n = self.order.len() as u32;
        self.order[wrap(i64::from(self.position[rank as usize]) + offset, n) as usize]
    }
}

fn rings(n: u32, params: &AlgorithmParams) -> Result<Vec<Ring>, AlgorithmError> {
    let identity: Vec<Rank> = (0..n).collect();
    let orders: Vec<Vec<Rank>> = match params.ring_orders.len() {
        0 => vec![identity; params.channels as usize],
        1 => vec![params.ring_orders[0].clone(); params.channels as usize],
        _ => params.ring_orders.clone(),
    };
    if orders.len() != params.channels as usize {
        return Err(AlgorithmError::BadRingOrder {
            index: orders.len(),
            world_size: n,
            order: Vec::new(),
        });
    }
    for (index, order) in orders.iter().enumerate() {
        let mut sorted = order.clone();
        sorted.sort_unstable();
        if sorted != (0..n).collect::<Vec<_>>() {
            return Err(AlgorithmError::BadRingOrder {
                index,
                world_size: n,
                order: order.clone(),
            });
        }
    }
    Ok(orders.into_iter().map(Ring::new).collect())
}

pub(super) fn generate(
    collective: Collective,
    n: u32,
    params: &AlgorithmParams,
) -> Result<Schedule, AlgorithmError> {
    let rings = rings(n, params)?;
    let channels = params.channels;
    let cpb = match collective {
        Collective::AllReduce => n * channels,
        _ => channels,
    };
    let mut b = ScheduleBuilder::new("ring", collective, n, cpb, channels);
    for (ch, ring) in (0..channels).zip(&rings) {
        for r in 0..n {
            let steps = match collective {
                Collective::AllReduce => all_reduce(ring, r, n, ch * n),
                Collective::ReduceScatter => reduce_scatter(ring, r, n, ch, channels),
                Collective::AllGather => all_gather(ring, r, n, ch, channels),
                Collective::Broadcast { root } => broadcast(ring, r, n, root, ch),
                Collective::Reduce { root } => reduce(ring, r, n, root, ch),
                Collective::AllToAll | Collective::SendRecv => {
                    unreachable!("rejected by Algorithm::supports")
                }
            };
            for step in steps {
                b.push(r, ch, step);
            }
        }
    }
    Ok(b.build())
}

/// Chunk `base + k mod n`: the chunks of one channel are numbered around the ring.
fn chunk(base: u32, k: i64, n: u32) -> u32 {
    base + wrap(k, n)
}

fn all_reduce(ring: &Ring, r: Rank, n: u32, base: u32) -> Vec<Step> {
    let p = i64::from(ring.position[r as usize]);
    let (next, prev) = (ring.at(r, 1), ring.at(r, -1));
    let c = |k: i64| chunk(base, k, n);
    let mut steps = vec![Step::new(1).read(Buffer::Input, c(p)).send(next)];
    // Reduce-scatter: pass partial sums along; after n-1 receives this rank
    // holds the complete chunk p+1.
    for s in 1..i64::from(n) - 1 {
        steps.push(
            Step::new(1)
                .recv(prev)
                .read(Buffer::Input, c(p - s))
                .send(next),
        );
    }
    steps.push(
        Step::new(1)
            .recv(prev)
            .read(Buffer::Input, c(p + 1))
            .write(Buffer::Output, c(p + 1))
            .send(next),
    );
    // All-gather: forward each completed chunk once around the ring.
    for t in 1..i64::from(n) - 1 {
        steps.push(
            Step::new(1)
                .recv(prev)
                .write(Buffer::Output, c(p - t + 1))
                .send(next),
        );
    }
    steps.push(Step::new(1).recv(prev).write(Buffer::Output, c(p + 2)));
    steps
}

fn reduce_scatter(ring: &Ring, r: Rank, n: u32, ch: u32, channels: u32) -> Vec<Step> {
    let (next, prev) = (ring.at(r, 1), ring.at(r, -1));
    // The chunk of this channel inside the block owned by the rank k places on.
    let block = |k: i64| ring.at(r, k) * channels + ch;
    let mut steps = vec![Step::new(1).read(Buffer::Input, block(-1)).send(next)];
    for s in 1..i64::from(n) - 1 {
        steps.push(
            Step::new(1)
                .recv(prev)
                .read(Buffer::Input, block(-s - 1))
                .send(next),
        );
    }
    steps.push(
        Step::new(1)
            .recv(prev)
            .read(Buffer::Input, block(0))
            .write(Buffer::Output, ch),
    );
    steps
}

fn all_gather(ring: &Ring, r: Rank, n: u32, ch: u32, channels: u32) -> Vec<Step> {
    let (next, prev) = (ring.at(r, 1), ring.at(r, -1));
    let block = |k: i64| ring.at(r, k) * channels + ch;
    let mut steps = vec![
        Step::new(1)
            .read(Buffer::Input, ch)
            .write(Buffer::Output, block(0))
            .send(next),
    ];
    for t in 1..i64::from(n) {
        let mut step = Step::new(1).recv(prev).write(Buffer::Output, block(-t));
        if t < i64::from(n) - 1 {
            step = step.send(next);
        }
        steps.push(step);
    }
    steps
}

fn broadcast(ring: &Ring, r: Rank, n: u32, root: Rank, ch: u32) -> Vec<Step> {
    let q = wrap(
        i64::from(ring.position[r as usize]) - i64::from(ring.position[root as usize]),
        n,
    );
    let (next, prev) = (ring.at(r, 1), ring.at(r, -1));
    let step = if q == 0 {
        Step::new(1).read(Buffer::Input, ch)
    } else {
        Step::new(1).recv(prev)
    };
    let step = step.write(Buffer::Output, ch);
    vec![if q + 1 < n { step.send(next) } else { step }]
}

fn reduce(ring: &Ring, r: Rank, n: u32, root: Rank, ch: u32) -> Vec<Step> {
    // The chain starts just after the root and ends at it.
    let q = wrap(
        i64::from(ring.position[r as usize]) - i64::from(ring.position[root as usize]) - 1,
        n,
    );
    let (next, prev) = (ring.at(r, 1), ring.at(r, -1));
    let mut step = Step::new(1);
    if q > 0 {
        step = step.recv(prev);
    }
    step = step.read(Buffer::Input, ch);
    vec![if q + 1 < n {
        step.send(next)
    } else {
        step.write(Buffer::Output, ch)
    }]
}

/// Bytes over all links of one call, in blocks (see the module docs).
pub fn traffic_blocks(kind: crate::types::CollectiveKind, n: u32) -> u64 {
    use crate::types::CollectiveKind as K;
    let n = u64::from(n);
    match kind {
        K::AllReduce => 2 * (n - 1),
        K::ReduceScatter | K::AllGather => n * (n - 1),
        K::Broadcast | K::Reduce => n - 1,
        K::AllToAll | K::SendRecv => 0,
    }
}
