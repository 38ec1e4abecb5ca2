//! Double binary tree: two complementary binary trees, each carrying half
//! of the data, so that every rank sends and receives at most about one
//! share of the data per direction, while latency grows only with log n.
//!
//! ```text
//! tree A (n = 7, positions 1..7 = ranks 0..6)   tree B: the same shape,
//!                 4                              every label shifted by one
//!             /       \                          (rank = position mod n), so
//!           2           6                        A's leaves (odd positions)
//!          / \         / \                       are B's inner nodes
//!         1   3       5   7
//!
//! all-reduce per tree: reduce up (children → parent), the root completes
//! the sum, then broadcast down (parent → children) on a second channel.
//! ```
//!
//! Cost (all-reduce): about `2·⌈log2 n⌉·α + S/B` with segments pipelining:
//! each tree moves S/2 up and S/2 down and each rank is inner in at most
//! one tree. Broadcast and reduce run the down or up half only, on two
//! trees rooted at the given root.
//!
//! Traffic over all links, in blocks of `count` elements
//! ([`traffic_blocks`]): every rank but a tree's root sends that tree's half
//! up once and receives it down once, so all-reduce moves 2(n−1), broadcast
//! and reduce n−1.
//!
//! Channels: each tree uses its own up and down channels, so segments
//! stream up the tree while earlier segments stream down; the root's down
//! step waits (`after`) for its up step.

use crate::schedule::{Schedule, ScheduleBuilder, Step};
use crate::types::{Buffer, Collective, Rank};

/// A rooted binary tree over positions `0..n`.
#[derive(Debug, Clone)]
pub struct BinaryTree {
    /// The root's position.
    pub root: usize,
    /// Parent of each position (`None` for the root).
    pub parent: Vec<Option<usize>>,
    /// Children of each position, at most two, in order.
    pub children: Vec<Vec<usize>>,
}

impl BinaryTree {
    /// The in-order tree on positions `0..n` built from lowest set bits:
    /// 1-based position `i` with lowest set bit `b` heads the positions
    /// `i−b+1 ..= i+b−1`; its children are the heads of the two halves (the
    /// right one shrinks when it would pass `n`). Depth `⌈log2(n+1)⌉`.
    pub fn in_order(n: usize) -> Self {
        let mut children = vec![Vec::new(); n];
        let mut parent = vec![None; n];
        let mut root = 0;
        for i in 1..=n {
            let b = i & i.wrapping_neg();
            if 2 * b > n && i == b {
                root = i - 1;
            }
            if b > 1 {
                children[i - 1].push(i - b / 2 - 1);
                let mut h = b / 2;
                while h >= 1 && i + h > n {
                    h /= 2;
                }
                if h >= 1 {
                    children[i - 1].push(i + h - 1);
                }
            }
        }
        for (p, kids) in children.iter().enumerate() {
            for &k in kids {
                parent[k] = Some(p);
            }
        }
        BinaryTree {
            root,
            parent,
            children,
        }
    }

    /// The depth: edges on the longest root-to-leaf path.
    pub fn depth(&self) -> usize {
        (0..self.parent.len())
            .map(|mut v| {
                let mut d = 0;
                while let Some(p) = self.parent[v] {
                    v = p;
                    d += 1;
                }
                d
            })
            .max()
            .unwrap_or(0)
    }
}

/// A tree with ranks as labels.
struct Labeled<'a> {
    shape: &'a BinaryTree,
    rank_of: Vec<Rank>,
    position_of: Vec<usize>,
}

impl<'a> Labeled<'a> {
    fn new(shape: &'a BinaryTree, rank_of: Vec<Rank>) -> Self {
        let mut position_of = vec![0; rank_of.len()];
        for (p, &r) in rank_of.iter().enumerate() {
            position_of[r as usize] = p;
        }
        Labeled {
            shape,
            rank_of,
            position_of,
        }
    }

    fn parent(&self, r: Rank) -> Option<Rank> {
        self.shape.parent[self.position_of[r as usize]].map(|p| self.rank_of[p])
    }

    fn children(&self, r: Rank) -> Vec<Rank> {
        self.shape.children[self.position_of[r as usize]]
            .iter()
            .map(|&p| self.rank_of[p])
            .collect()
    }
}

/// The two trees for `collective`: for all-reduce the second is the first
/// shifted by one rank; for rooted collectives both are rooted at the root,
/// the second mirrored around it.
fn tree_labels(collective: Collective, shape: &BinaryTree, n: u32) -> [Vec<Rank>; 2] {
    let n64 = i64::from(n);
    let label = |f: &dyn Fn(i64) -> i64| -> Vec<Rank> {
        (0..n64).map(|p| f(p).rem_euclid(n64) as Rank).collect()
    };
    match collective.root() {
        None => [label(&|p| p), label(&|p| p + 1)],
        Some(root) => {
            let (top, root) = (shape.root as i64, i64::from(root));
            [label(&|p| p - top + root), label(&|p| top - p + root)]
        }
    }
}

pub(super) fn generate(collective: Collective, n: u32, channel_groups: u32) -> Schedule {
    let shape = BinaryTree::in_order(n as usize);
    let labels = tree_labels(collective, &shape, n);
    let trees: Vec<Labeled> = labels
        .into_iter()
        .map(|l| Labeled::new(&shape, l))
        .collect();
    let cpb = 2 * channel_groups;
    let per_tree = match collective {
        Collective::AllReduce => 2,
        _ => 1,
    };
    let channels = cpb * per_tree;
    let mut b = ScheduleBuilder::new("tree", collective, n, cpb, channels);
    for g in 0..channel_groups {
        for (t, tree) in trees.iter().enumerate() {
            let chunk = 2 * g + t as u32;
            let first_channel = chunk * per_tree;
            for r in 0..n {
                match collective {
                    Collective::AllReduce => {
                        all_reduce(&mut b, tree, r, chunk, first_channel, first_channel + 1)
                    }
                    Collective::Broadcast { .. } => {
                        broadcast(&mut b, tree, r, chunk, first_channel)
                    }
                    Collective::Reduce { .. } => reduce(&mut b, tree, r, chunk, first_channel),
                    _ => unreachable!("rejected by Algorithm::supports"),
                }
            }
        }
    }
    b.build()
}

/// Up: receive the children's partial sums, add this rank's input, send to
/// the parent. The root writes the total and sends it back down.
fn all_reduce(b: &mut ScheduleBuilder, tree: &Labeled, r: Rank, chunk: u32, up: u32, down: u32) {
    let kids = tree.children(r);
    let mut gather = Step::new(1).read(Buffer::Input, chunk);
    gather.recv_from = kids.clone();
    match tree.parent(r) {
        Some(parent) => {
            b.push(r, up, gather.send(parent));
            let mut spread = Step::new(1).recv(parent).write(Buffer::Output, chunk);
            spread.send_to = kids;
            b.push(r, down, spread);
        }
        None => {
            let done = b.push(r, up, gather.write(Buffer::Output, chunk));
            let mut spread = Step::new(1)
                .read(Buffer::Output, chunk)
                .after(done.channel, done.step);
            spread.send_to = kids;
            b.push(r, down, spread);
        }
    }
}

fn broadcast(b: &mut ScheduleBuilder, tree: &Labeled, r: Rank, chunk: u32, channel: u32) {
    let step = match tree.parent(r) {
        Some(parent) => Step::new(1).recv(parent),
        None => Step::new(1).read(Buffer::Input, chunk),
    };
    let mut step = step.write(Buffer::Output, chunk);
    step.send_to = tree.children(r);
    b.push(r, channel, step);
}

fn reduce(b: &mut ScheduleBuilder, tree: &Labeled, r: Rank, chunk: u32, channel: u32) {
    let mut step = Step::new(1).read(Buffer::Input, chunk);
    step.recv_from = tree.children(r);
    let step = match tree.parent(r) {
        Some(parent) => step.send(parent),
        None => step.write(Buffer::Output, chunk),
    };
    b.push(r, channel, step);
}

/// The trees built on positions, with position `p` run by rank
/// `params.tree_order[p]`. Tree schedules index no block by rank (their
/// collectives have one block per buffer), so renaming ranks keeps them
/// correct; only the root moves, and it is placed where it must end up.
pub(super) fn generate_in_order(
    collective: Collective,
    n: u32,
    params: &super::AlgorithmParams,
) -> Result<Schedule, super::AlgorithmError> {
    let order = &params.tree_order;
    let mut sorted = order.clone();
    sorted.sort_unstable();
    if sorted != (0..n).collect::<Vec<_>>() {
        return Err(super::AlgorithmError::BadTreeOrder {
            world_size: n,
            order: order.clone(),
        });
    }
    let mut position = vec![0; n as usize];
    for (p, &r) in order.iter().enumerate() {
        position[r as usize] = p as Rank;
    }
    let at_positions = match collective.root() {
        Some(root) => collective.kind().with_root(position[root as usize]),
        None => collective,
    };
    let mut schedule = generate(at_positions, n, params.channels);
    let rename = |p: Rank| order[p as usize];
    let mut ranks = vec![Default::default(); n as usize];
    for (p, mut program) in std::mem::take(&mut schedule.ranks).into_iter().enumerate() {
        for step in program.channels.iter_mut().flatten() {
            step.recv_from.iter_mut().for_each(|q| *q = rename(*q));
            step.send_to.iter_mut().for_each(|q| *q = rename(*q));
        }
        ranks[order[p] as usize] = program;
    }
    schedule.ranks = ranks;
    schedule.collective = collective;
    Ok(schedule)
}

/// Bytes over all links of one call, in blocks (see the module docs).
pub fn traffic_blocks(kind: crate::types::CollectiveKind, n: u32) -> u64 {
    use crate::types::CollectiveKind as K;
    let n = u64::from(n);
    match kind {
        K::AllReduce => 2 * (n - 1),
        K::Broadcast | K::Reduce => n - 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_tree_spans_every_position_with_logarithmic_depth() {
        for n in 1..=200usize {
            let t = BinaryTree::in_order(n);
            assert!(t.parent[t.root].is_none());
            let roots = t.parent.iter().filter(|p| p.is_none()).count();
            assert_eq!(roots, 1, "n={n}");
            assert!(t.children.iter().all(|c| c.len() <= 2));
            let bound = (usize::BITS - n.leading_zeros()) as usize; // ⌈log2(n+1)⌉
            assert!(t.depth() < bound.max(1), "n={n} depth={}", t.depth());
        }
    }

    #[test]
    fn the_two_all_reduce_trees_share_few_inner_ranks() {
        let n = 16;
        let shape = BinaryTree::in_order(n);
        let [a, b] = tree_labels(Collective::AllReduce, &shape, n as u32);
        let inner = |l: &Vec<Rank>| -> Vec<Rank> {
            (0..n)
                .filter(|&p| !shape.children[p].is_empty())
                .map(|p| l[p])
                .collect()
        };
        let (ia, ib) = (inner(&a), inner(&b));
        let both = ia.iter().filter(|r| ib.contains(r)).count();
        assert!(both <= 1, "inner in both trees: {both}");
    }
}
