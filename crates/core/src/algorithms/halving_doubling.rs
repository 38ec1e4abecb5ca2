//! Halving-doubling (Rabenseifner): reduce-scatter by recursive halving,
//! all-gather by recursive doubling — log2 n steps each, for any n.
//!
//! ```text
//! all-reduce, n = 4 (virtual ranks v0..v3, chunks a b c d)
//!
//!   halving, distance 2      halving, distance 1      doubling: the reverse
//!   v0 ⇄ v2: v0 keeps ab     v0 ⇄ v1: v0 keeps a      v0 ⇄ v1: both hold ab
//!   v1 ⇄ v3: v1 keeps ab     v2 ⇄ v3: v2 keeps c      v0 ⇄ v2: all hold abcd
//! ```
//!
//! Not a power of two: with p the largest power of two ≤ n and m = n − p,
//! ranks 0..2m pair up; each even one hands its whole input to its odd
//! neighbour first and sits out, and gets the result back at the end. The
//! remaining p ranks are virtual ranks 0..p.
//!
//! Cost (all-reduce, n a power of two): `2·log2(n)·α + 2(n−1)/n · S/B`; the
//! fold adds `2α + 2·S/B` on the paired ranks otherwise. Reduce-scatter and
//! all-gather are one half each; their block ranges follow the virtual
//! ranks, so the halves need not be equal in size.
//!
//! Traffic over all links, in blocks of `count` elements
//! ([`traffic_blocks`]), with m = n − p resting ranks: all-reduce 2(n−1)
//! (the p virtual ranks move 2(p−1) and each fold moves a block there and
//! back); reduce-scatter and all-gather n(p−1) + m·n + m (each halving or
//! doubling level moves n blocks over every pair, the fold moves a whole
//! buffer one way and one block the other).

use crate::schedule::{Schedule, ScheduleBuilder, Step};
use crate::types::{Buffer, Collective, Rank};

/// The fold that turns n ranks into a power of two of virtual ranks.
struct Fold {
    n: u32,
    /// Largest power of two ≤ n.
    p: u32,
    /// Ranks `0..2·paired` pair up.
    paired: u32,
}

/// A rank's role under the fold.
enum Role {
    /// Hands its data to `partner` and waits for the result.
    Resting { partner: Rank },
    /// Takes part as a virtual rank; `partner` is the resting rank it serves.
    Active {
        virtual_rank: u32,
        partner: Option<Rank>,
    },
}

impl Fold {
    fn new(n: u32) -> Self {
        let p = 1 << (u32::BITS - 1 - n.leading_zeros());
        Fold {
            n,
            p,
            paired: n - p,
        }
    }

    fn role(&self, r: Rank) -> Role {
        if r < 2 * self.paired {
            if r % 2 == 0 {
                Role::Resting { partner: r + 1 }
            } else {
                Role::Active {
                    virtual_rank: r / 2,
                    partner: Some(r - 1),
                }
            }
        } else {
            Role::Active {
                virtual_rank: r - self.paired,
                partner: None,
            }
        }
    }

    fn real(&self, v: u32) -> Rank {
        if v < self.paired {
            2 * v + 1
        } else {
            v + self.paired
        }
    }

    /// First block (real rank) that virtual rank `v` answers for; `v = p` gives n.
    fn first_block(&self, v: u32) -> u32 {
        if v < self.paired {
            2 * v
        } else {
            (v + self.paired).min(self.n)
        }
    }

    /// Halving partners and kept halves, largest distance first.
    fn distances_down(&self) -> impl Iterator<Item = u32> {
        let p = self.p;
        (0..p.trailing_zeros()).rev().map(|k| 1 << k)
    }
}

pub(super) fn generate(collective: Collective, n: u32) -> Schedule {
    let fold = Fold::new(n);
    let (cpb, scratch) = match collective {
        Collective::AllReduce => (fold.p, 0),
        Collective::ReduceScatter => (1, n),
        Collective::AllGather => (1, 0),
        _ => unreachable!("rejected by Algorithm::supports"),
    };
    let mut b =
        ScheduleBuilder::new("halving-doubling", collective, n, cpb, 1).scratch_chunks(scratch);
    for r in 0..n {
        let steps = match collective {
            Collective::AllReduce => all_reduce(&fold, r),
            Collective::ReduceScatter => reduce_scatter(&fold, r),
            _ => all_gather(&fold, r),
        };
        for step in steps {
            b.push(r, 0, step);
        }
    }
    b.build()
}

/// Chunks are numbered by virtual rank: chunk v ends reduced on virtual rank v.
fn all_reduce(fold: &Fold, r: Rank) -> Vec<Step> {
    let p = fold.p;
    let mut steps = Vec::new();
    let (v, partner) = match fold.role(r) {
        Role::Resting { partner } => {
            steps.push(Step::new(p).read(Buffer::Input, 0).send(partner));
            steps.push(Step::new(p).recv(partner).write(Buffer::Output, 0));
            return steps;
        }
        Role::Active {
            virtual_rank,
            partner,
        } => (virtual_rank, partner),
    };
    let mut current = Buffer::Input;
    if let Some(rest) = partner {
        steps.push(
            Step::new(p)
                .recv(rest)
                .read(Buffer::Input, 0)
                .write(Buffer::Output, 0),
        );
        current = Buffer::Output;
    }
    let (mut lo, mut len) = (0, p);
    for d in fold.distances_down() {
        let peer = fold.real(v ^ d);
        let half = len / 2;
        let (keep, give) = if v & d == 0 {
            (lo, lo + half)
        } else {
            (lo + half, lo)
        };
        steps.push(Step::new(half).read(current, give).send(peer));
        steps.push(
            Step::new(half)
                .recv(peer)
                .read(current, keep)
                .write(Buffer::Output, keep),
        );
        current = Buffer::Output;
        (lo, len) = (keep, half);
    }
    for d in (0..p.trailing_zeros()).map(|k| 1 << k) {
        let peer = fold.real(v ^ d);
        let theirs = if v & d == 0 { lo + len } else { lo - len };
        steps.push(Step::new(len).read(Buffer::Output, lo).send(peer));
        steps.push(Step::new(len).recv(peer).write(Buffer::Output, theirs));
        (lo, len) = (lo.min(theirs), 2 * len);
    }
    if let Some(rest) = partner {
        steps.push(Step::new(p).read(Buffer::Output, 0).send(rest));
    }
    steps
}

/// Blocks are numbered by real rank; a virtual range covers the blocks of
/// the real ranks it stands for, which are contiguous.
fn reduce_scatter(fold: &Fold, r: Rank) -> Vec<Step> {
    let n = fold.n;
    let mut steps = Vec::new();
    let (v, partner) = match fold.role(r) {
        Role::Resting { partner } => {
            steps.push(Step::new(n).read(Buffer::Input, 0).send(partner));
            steps.push(Step::new(1).recv(partner).write(Buffer::Output, 0));
            return steps;
        }
        Role::Active {
            virtual_rank,
            partner,
        } => (virtual_rank, partner),
    };
    let mut current = Buffer::Input;
    if let Some(rest) = partner {
        steps.push(
            Step::new(n)
                .recv(rest)
                .read(Buffer::Input, 0)
                .write(Buffer::Scratch, 0),
        );
        current = Buffer::Scratch;
    }
    let blocks = |lo: u32, len: u32| {
        (
            fold.first_block(lo),
            fold.first_block(lo + len) - fold.first_block(lo),
        )
    };
    let (mut lo, mut len) = (0, fold.p);
    for d in fold.distances_down() {
        let peer = fold.real(v ^ d);
        let half = len / 2;
        let (keep, give) = if v & d == 0 {
            (lo, lo + half)
        } else {
            (lo + half, lo)
        };
        let (give_first, give_len) = blocks(give, half);
        let (keep_first, keep_len) = blocks(keep, half);
        steps.push(Step::new(give_len).read(current, give_first).send(peer));
        // The last halving of an unpaired rank completes its own block.
        let dest = if half == 1 && partner.is_none() {
            Step::new(keep_len).write(Buffer::Output, 0)
        } else {
            Step::new(keep_len).write(Buffer::Scratch, keep_first)
        };
        steps.push(dest.recv(peer).read(current, keep_first));
        current = Buffer::Scratch;
        (lo, len) = (keep, half);
    }
    if let Some(rest) = partner {
        steps.push(Step::new(1).read(Buffer::Scratch, rest).send(rest));
        steps.push(
            Step::new(1)
                .read(Buffer::Scratch, r)
                .write(Buffer::Output, 0),
        );
    }
    steps
}

fn all_gather(fold: &Fold, r: Rank) -> Vec<Step> {
    let n = fold.n;
    let mut steps = Vec::new();
    let (v, partner) = match fold.role(r) {
        Role::Resting { partner } => {
            steps.push(Step::new(1).read(Buffer::Input, 0).send(partner));
            steps.push(Step::new(n).recv(partner).write(Buffer::Output, 0));
            return steps;
        }
        Role::Active {
            virtual_rank,
            partner,
        } => (virtual_rank, partner),
    };
    if let Some(rest) = partner {
        steps.push(Step::new(1).recv(rest).write(Buffer::Output, rest));
    }
    steps.push(Step::new(1).read(Buffer::Input, 0).write(Buffer::Output, r));
    let blocks = |lo: u32, len: u32| {
        (
            fold.first_block(lo),
            fold.first_block(lo + len) - fold.first_block(lo),
        )
    };
    let (mut lo, mut len) = (v, 1);
    for d in (0..fold.p.trailing_zeros()).map(|k| 1 << k) {
        let peer = fold.real(v ^ d);
        let theirs = if v & d == 0 { lo + len } else { lo - len };
        let (mine_first, mine_len) = blocks(lo, len);
        let (their_first, their_len) = blocks(theirs, len);
        steps.push(
            Step::new(mine_len)
                .read(Buffer::Output, mine_first)
                .send(peer),
        );
        steps.push(
            Step::new(their_len)
                .recv(peer)
                .write(Buffer::Output, their_first),
        );
        (lo, len) = (lo.min(theirs), 2 * len);
    }
    if let Some(rest) = partner {
        steps.push(Step::new(n).read(Buffer::Output, 0).send(rest));
    }
    steps
}

/// Bytes over all links of one call, in blocks (see the module docs).
pub fn traffic_blocks(kind: crate::types::CollectiveKind, n: u32) -> u64 {
    use crate::types::CollectiveKind as K;
    let p = u64::from(1u32 << (31 - n.leading_zeros()));
    let n = u64::from(n);
    let m = n - p;
    match kind {
        K::AllReduce => 2 * (n - 1),
        K::ReduceScatter | K::AllGather => n * (p - 1) + m * n + m,
        _ => 0,
    }
}
