//! Direct (full mesh): every rank exchanges with every other rank in one
//! hop — the schedule for NVSwitch systems and shared memory, where all
//! pairs are equally close.
//!
//! ```text
//! all-reduce, n = 4: rank k owns chunk k
//!
//!   scatter        reduce at owner        gather
//!   r0 ─b─▶ r1     r1: b0+b1+b2+b3        r1 ─B─▶ r0, r2, r3
//!   r0 ─c─▶ r2     r2: c0+c1+c2+c3        r2 ─C─▶ r0, r1, r3
//!   r0 ─d─▶ r3     ...                    ...
//! ```
//!
//! Cost (all-reduce): 2 steps of latency, `2α + 2(n−1)/n · S/B` when every
//! rank can drive all its links at once. Reduce-scatter, all-gather and
//! all-to-all are one phase each: `α + (n−1)/n · S/B`. Broadcast and reduce
//! are one star: `α + (n−1) · S/B` at the root's link.
//!
//! Traffic over all links, in blocks of `count` elements
//! ([`traffic_blocks`]): all-reduce 2(n−1) (each owner's chunk in, the
//! sum out); reduce-scatter, all-gather and all-to-all n(n−1); broadcast
//! and reduce n−1; send/recv n.

use super::peers;
use crate::schedule::{Schedule, ScheduleBuilder, Step};
use crate::types::{Buffer, Collective, Rank};

pub(super) fn generate(collective: Collective, n: u32, channels: u32) -> Schedule {
    let cpb = match collective {
        Collective::AllReduce => n * channels,
        _ => channels,
    };
    let mut b = ScheduleBuilder::new("direct", collective, n, cpb, channels);
    for g in 0..channels {
        for r in 0..n {
            let steps = match collective {
                Collective::AllReduce => all_reduce(r, n, g * n),
                Collective::ReduceScatter => reduce_scatter(r, n, g, channels),
                Collective::AllGather => all_gather(r, n, g, channels),
                Collective::Broadcast { root } => broadcast(r, n, root, g),
                Collective::Reduce { root } => reduce(r, n, root, g),
                Collective::AllToAll => all_to_all(r, n, g, channels),
                Collective::SendRecv => send_recv(r, n, g),
            };
            for step in steps {
                b.push(r, g, step);
            }
        }
    }
    b.build()
}

fn all_reduce(r: Rank, n: u32, base: u32) -> Vec<Step> {
    let mut steps: Vec<Step> = peers(r, n)
        .map(|q| Step::new(1).read(Buffer::Input, base + q).send(q))
        .collect();
    let mut own = Step::new(1)
        .read(Buffer::Input, base + r)
        .write(Buffer::Output, base + r);
    own.recv_from = peers(r, n).collect();
    own.send_to = peers(r, n).collect();
    steps.push(own);
    steps.extend(peers(r, n).map(|q| Step::new(1).recv(q).write(Buffer::Output, base + q)));
    steps
}

fn reduce_scatter(r: Rank, n: u32, g: u32, channels: u32) -> Vec<Step> {
    let mut steps: Vec<Step> = peers(r, n)
        .map(|q| Step::new(1).read(Buffer::Input, q * channels + g).send(q))
        .collect();
    let mut own = Step::new(1)
        .read(Buffer::Input, r * channels + g)
        .write(Buffer::Output, g);
    own.recv_from = peers(r, n).collect();
    steps.push(own);
    steps
}

fn all_gather(r: Rank, n: u32, g: u32, channels: u32) -> Vec<Step> {
    let mut own = Step::new(1)
        .read(Buffer::Input, g)
        .write(Buffer::Output, r * channels + g);
    own.send_to = peers(r, n).collect();
    let mut steps = vec![own];
    steps.extend(peers(r, n).map(|q| Step::new(1).recv(q).write(Buffer::Output, q * channels + g)));
    steps
}

fn broadcast(r: Rank, n: u32, root: Rank, g: u32) -> Vec<Step> {
    if r == root {
        let mut step = Step::new(1).read(Buffer::Input, g).write(Buffer::Output, g);
        step.send_to = peers(r, n).collect();
        vec![step]
    } else {
        vec![Step::new(1).recv(root).write(Buffer::Output, g)]
    }
}

fn reduce(r: Rank, n: u32, root: Rank, g: u32) -> Vec<Step> {
    if r == root {
        let mut step = Step::new(1).read(Buffer::Input, g).write(Buffer::Output, g);
        step.recv_from = peers(r, n).collect();
        vec![step]
    } else {
        vec![Step::new(1).read(Buffer::Input, g).send(root)]
    }
}

fn all_to_all(r: Rank, n: u32, g: u32, channels: u32) -> Vec<Step> {
    let at = |q: Rank| q * channels + g;
    let mut steps = vec![
        Step::new(1)
            .read(Buffer::Input, at(r))
            .write(Buffer::Output, at(r)),
    ];
    steps.extend(peers(r, n).map(|q| Step::new(1).read(Buffer::Input, at(q)).send(q)));
    steps.extend(peers(r, n).map(|q| Step::new(1).recv(q).write(Buffer::Output, at(q))));
    steps
}

fn send_recv(r: Rank, n: u32, g: u32) -> Vec<Step> {
    vec![
        Step::new(1).read(Buffer::Input, g).send((r + 1) % n),
        Step::new(1).recv((r + n - 1) % n).write(Buffer::Output, g),
    ]
}

/// Bytes over all links of one call, in blocks (see the module docs).
pub fn traffic_blocks(kind: crate::types::CollectiveKind, n: u32) -> u64 {
    use crate::types::CollectiveKind as K;
    let n = u64::from(n);
    match kind {
        _ if n == 1 => 0,
        K::AllReduce => 2 * (n - 1),
        K::ReduceScatter | K::AllGather | K::AllToAll => n * (n - 1),
        K::Broadcast | K::Reduce => n - 1,
        K::SendRecv => n,
    }
}
