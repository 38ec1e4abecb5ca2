//! The one-shot protocol for small calls, as data.
//!
//! For a few kilobytes the schedule machinery — links, slots, message
//! queues, one wake-up per message — costs more than the data. A one-shot
//! call moves its data in the same step as its agreement: every rank
//! copies its whole input into a buffer of its own that every peer can
//! read (the executor's staging), announces the call, and once every peer
//! has announced the same call builds its own output from the published
//! inputs in one pass — the `n` inputs of a reduction folded in rank
//! order, so every rank computes the same bits. This is the host
//! counterpart of NCCL's low-latency protocol: one synchronization per
//! call instead of one per message.
//!
//! The arithmetic — where each rank's input lies (in place or not), which
//! bytes of whose input make which bytes of the output, where `Avg`
//! divides — lives here, like every other byte map of a call; executors
//! read a [`OneShot`] and compute nothing.

use super::hash::stable_hash;
use crate::types::{Buffer, CallShape, Collective, CollectiveKind, Element, Rank, ReduceOp};

/// The total one-shot budget by default: world size × published bytes.
/// A one-shot rank reads every peer's whole input, so the traffic grows
/// with the world size where a ring's does not; past a few tens of
/// kilobytes in all, pipelined schedules win (see docs/benchmarks.md).
pub const ONE_SHOT_BYTES: usize = 64 << 10;

/// Which calls take the one-shot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneShotRule {
    /// World size × published bytes must not exceed this; 0 turns the
    /// path off.
    budget: usize,
    /// The collective a schedule of the user's runs at this world size:
    /// its calls keep that schedule.
    custom: Option<Collective>,
    /// Collectives that must run what the configuration allows, a bit
    /// each (by their place in [`CollectiveKind::ALL`]).
    excluded: u32,
}

fn bit(kind: CollectiveKind) -> u32 {
    CollectiveKind::ALL
        .iter()
        .position(|&k| k == kind)
        .map_or(0, |i| 1 << i)
}

impl OneShotRule {
    /// Calls whose world size × published bytes is at most `budget`, except
    /// those of `custom` (the collective a configured schedule runs).
    pub fn new(budget: usize, custom: Option<Collective>) -> Self {
        OneShotRule {
            budget,
            custom,
            excluded: 0,
        }
    }

    /// This rule, never taking `kinds` (collectives whose algorithms
    /// `FERROCOLL_ALGO` restricts).
    pub fn excluding(mut self, kinds: &[CollectiveKind]) -> Self {
        self.excluded = kinds.iter().fold(0, |bits, &k| bits | bit(k));
        self
    }

    /// No call takes the one-shot path (a forced algorithm, tests of the
    /// schedules themselves).
    pub fn never() -> Self {
        OneShotRule::new(0, None)
    }

    /// The budget: world size × published bytes at most.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The bytes a rank's staging must hold for any call this rule admits
    /// on `world` ranks.
    pub fn staging_bytes(&self, world: u32) -> usize {
        self.budget / world.max(1) as usize
    }

    /// Whether `shape` on `world` ranks takes the one-shot path.
    pub fn applies(&self, shape: &CallShape, world: u32) -> bool {
        if self.budget == 0
            || matches!(shape.collective, Collective::SendRecv)
            || self.custom == Some(shape.collective)
            || self.excluded & bit(shape.collective.kind()) != 0
        {
            return false;
        }
        published_bytes(shape, world)
            .checked_mul(world as usize)
            .is_some_and(|total| total <= self.budget)
    }
}

/// The bytes every rank publishes: its whole input.
fn published_bytes(shape: &CallShape, world: u32) -> usize {
    let blocks = shape.collective.input_blocks(world) as usize;
    shape
        .count
        .saturating_mul(blocks)
        .saturating_mul(shape.dtype.size_bytes())
}

/// Output bytes built from the published inputs: the first source's bytes
/// copied, or all of them folded with the call's op in source order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gather {
    /// Where the bytes go in the output buffer.
    pub output_offset: u64,
    /// How many.
    pub bytes: u64,
    /// Whose published input, and from which byte of it; a reduction
    /// lists every rank in rank order.
    pub sources: Vec<(Rank, u64)>,
}

/// One rank's part of a one-shot call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneShot {
    /// The buffer that holds this rank's input (the output, in place).
    pub input_buffer: Buffer,
    /// Where in it the input starts.
    pub input_offset: u64,
    /// The input's length: what the rank publishes.
    pub input_bytes: u64,
    /// The output, piece by piece.
    pub gathers: Vec<Gather>,
    /// Output bytes `Avg` divides by the world size once every gather is
    /// done: (offset, bytes).
    pub divide: Option<(u64, u64)>,
    /// The call's signature: equal on two ranks exactly when they make
    /// the same call, and never equal to a planned call's.
    pub signature: u64,
}

impl OneShot {
    /// Rank `rank`'s part of `shape` on `world` ranks.
    pub fn new(shape: &CallShape, world: u32, rank: Rank) -> OneShot {
        let b = (shape.count * shape.dtype.size_bytes()) as u64;
        let all = |offset: u64| (0..world).map(|r| (r, offset)).collect::<Vec<_>>();
        let one = |output_offset, source| Gather {
            output_offset,
            bytes: b,
            sources: vec![source],
        };
        let (input_buffer, input_offset) = match (shape.in_place, shape.collective) {
            (false, _) => (Buffer::Input, 0),
            (true, Collective::AllGather) => (Buffer::Output, u64::from(rank) * b),
            (true, _) => (Buffer::Output, 0),
        };
        let reduced = |output_offset, sources| Gather {
            output_offset,
            bytes: b,
            sources,
        };
        let gathers = match shape.collective {
            Collective::AllReduce => vec![reduced(0, all(0))],
            Collective::Reduce { root } if root == rank => vec![reduced(0, all(0))],
            Collective::Reduce { .. } => Vec::new(),
            Collective::Broadcast { root } if root == rank && shape.in_place => Vec::new(),
            Collective::Broadcast { root } => vec![one(0, (root, 0))],
            Collective::ReduceScatter => {
                let out = if shape.in_place {
                    u64::from(rank) * b
                } else {
                    0
                };
                vec![reduced(out, all(u64::from(rank) * b))]
            }
            Collective::AllGather => (0..world)
                .filter(|&r| !(shape.in_place && r == rank))
                .map(|r| one(u64::from(r) * b, (r, 0)))
                .collect(),
            Collective::AllToAll => (0..world)
                .map(|r| one(u64::from(r) * b, (r, u64::from(rank) * b)))
                .collect(),
            Collective::SendRecv => Vec::new(),
        };
        let divide = match shape.op {
            crate::ReduceOp::Avg if shape.collective.reduces() => gathers
                .iter()
                .find(|g| g.sources.len() > 1)
                .map(|g| (g.output_offset, g.bytes)),
            _ => None,
        };
        // Only the root's input is read in a broadcast.
        let input_bytes = match shape.collective {
            Collective::Broadcast { root } if root != rank => 0,
            _ => published_bytes(shape, world) as u64,
        };
        OneShot {
            input_buffer,
            input_offset,
            input_bytes,
            gathers,
            divide,
            signature: signature(shape, world),
        }
    }
}

impl OneShot {
    /// How many bytes of each rank's published input this rank's gathers
    /// read (0 for a rank it reads nothing of): what an executor checks a
    /// peer published before reading it.
    pub fn read_extents(&self, world: u32) -> Vec<u64> {
        let mut needed = vec![0u64; world as usize];
        for g in &self.gathers {
            for &(r, from) in &g.sources {
                let need = &mut needed[r as usize];
                *need = (*need).max(from + g.bytes);
            }
        }
        needed
    }

    /// Build this rank's output at `output` from the staged inputs, the
    /// start of rank `r`'s being `staged(r)`, then divide for `Avg` — the
    /// one reading of the byte map, shared by the executors (threads and
    /// processes stage in different places). The arithmetic is the
    /// executor's kernels' (`kernels::Reduce`: `T::reduce`, `T::divide`),
    /// passed in so that the plan knows no kernel.
    ///
    /// # Safety
    /// `staged(r)` points at rank `r`'s whole published input of this call,
    /// element-aligned, unchanged while this runs; `output` is this rank's
    /// output buffer, valid for writes of every gather and overlapping no
    /// staged input.
    pub unsafe fn build_output<T: Element>(
        &self,
        staged: impl Fn(Rank) -> *const u8,
        output: usize,
        (op, world): (ReduceOp, u32),
        reduce: unsafe fn(ReduceOp, &[*const T], *mut T, usize),
        divide: fn(T, u32) -> T,
    ) {
        let size = std::mem::size_of::<T>();
        let mut srcs: Vec<*const T> = Vec::with_capacity(world as usize);
        for g in &self.gathers {
            srcs.clear();
            srcs.extend(
                g.sources
                    .iter()
                    .map(|&(peer, offset)| staged(peer).wrapping_add(offset as usize).cast()),
            );
            let dst = (output + g.output_offset as usize) as *mut T;
            let len = g.bytes as usize / size;
            // SAFETY: sources lie in staged inputs (the caller's contract;
            // offsets are whole elements), the destination in the output;
            // the two never overlap.
            unsafe {
                match srcs.as_slice() {
                    [one] => std::ptr::copy_nonoverlapping(*one, dst, len),
                    many => reduce(op, many, dst, len),
                }
            }
        }
        if let Some((offset, bytes)) = self.divide {
            // SAFETY: the divided bytes are the output of a gather above.
            let out = unsafe {
                std::slice::from_raw_parts_mut(
                    (output + offset as usize) as *mut T,
                    bytes as usize / size,
                )
            };
            for x in out {
                *x = divide(*x, world);
            }
        }
    }
}

/// The one-shot signature of `shape` on `world` ranks.
pub fn signature(shape: &CallShape, world: u32) -> u64 {
    stable_hash(&("one-shot", world, describe(shape)))
}

/// How a one-shot call reads in logs and mismatch reports.
pub fn describe(shape: &CallShape) -> String {
    let purpose = match shape.purpose {
        crate::types::Purpose::User => String::new(),
        other => format!("{other} "),
    };
    format!(
        "{purpose}{} count={} type={} op={} in_place={} protocol=one-shot",
        shape.collective, shape.count, shape.dtype, shape.op, shape.in_place
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DataType, ReduceOp};

    fn shape(collective: Collective, count: usize, in_place: bool) -> CallShape {
        CallShape {
            collective,
            count,
            dtype: DataType::F32,
            op: ReduceOp::Avg,
            in_place,
            purpose: Default::default(),
        }
    }

    /// What a rank reads of each peer's input: all of it for all-reduce,
    /// only the root's for a broadcast, one block each for all-to-all.
    #[test]
    fn read_extents_name_what_each_rank_reads_of_each_input() {
        let n = 4;
        let b = 10 * 4;
        let ar = OneShot::new(&shape(Collective::AllReduce, 10, false), n, 1);
        assert_eq!(ar.read_extents(n), vec![b; 4]);
        let bc = OneShot::new(&shape(Collective::Broadcast { root: 2 }, 10, false), n, 1);
        assert_eq!(bc.read_extents(n), vec![0, 0, b, 0]);
        let a2a = OneShot::new(&shape(Collective::AllToAll, 10, false), n, 1);
        assert_eq!(
            a2a.read_extents(n),
            vec![2 * b; 4],
            "block 1 of each: up to 2 blocks"
        );
    }

    #[test]
    fn the_budget_counts_every_ranks_published_input() {
        let rule = OneShotRule::new(64 << 10, None);
        // 4 ranks × 4096 f32 = 64 KiB: in; one more element: out.
        assert!(rule.applies(&shape(Collective::AllReduce, 4096, false), 4));
        assert!(!rule.applies(&shape(Collective::AllReduce, 4097, false), 4));
        // Reduce-scatter publishes n blocks per rank.
        assert!(rule.applies(&shape(Collective::ReduceScatter, 1024, false), 4));
        assert!(!rule.applies(&shape(Collective::ReduceScatter, 1025, false), 4));
        assert!(!OneShotRule::never().applies(&shape(Collective::AllReduce, 0, false), 2));
        let custom = OneShotRule::new(64 << 10, Some(Collective::AllReduce));
        assert!(!custom.applies(&shape(Collective::AllReduce, 1, false), 2));
        assert!(custom.applies(&shape(Collective::AllGather, 1, false), 2));
        // Counts that overflow are simply not small.
        assert!(!rule.applies(&shape(Collective::AllToAll, usize::MAX / 2, false), 3));
        assert_eq!(rule.staging_bytes(4), 16 << 10);
    }

    #[test]
    fn in_place_inputs_and_outputs_sit_where_the_collective_puts_them() {
        let b = 40; // 10 f32
        let g = OneShot::new(&shape(Collective::AllGather, 10, true), 3, 1);
        assert_eq!(
            (g.input_buffer, g.input_offset, g.input_bytes),
            (Buffer::Output, b, b)
        );
        let blocks: Vec<u64> = g.gathers.iter().map(|x| x.output_offset).collect();
        assert_eq!(blocks, [0, 2 * b], "its own block is already in place");
        let rs = OneShot::new(&shape(Collective::ReduceScatter, 10, true), 3, 2);
        assert_eq!((rs.input_buffer, rs.input_bytes), (Buffer::Output, 3 * b));
        assert_eq!(rs.gathers[0].output_offset, 2 * b);
        assert_eq!(rs.gathers[0].sources, [(0, 2 * b), (1, 2 * b), (2, 2 * b)]);
        assert_eq!(rs.divide, Some((2 * b, b)));
        let red = OneShot::new(&shape(Collective::Reduce { root: 0 }, 10, false), 3, 1);
        assert!(red.gathers.is_empty() && red.divide.is_none());
        let a2a = OneShot::new(&shape(Collective::AllToAll, 10, false), 3, 1);
        assert_eq!(a2a.gathers[2].sources, [(2, b)]);
        assert_eq!(a2a.gathers[2].output_offset, 2 * b);
    }

    #[test]
    fn signatures_tell_calls_apart() {
        let a = signature(&shape(Collective::AllReduce, 10, false), 2);
        assert_eq!(a, signature(&shape(Collective::AllReduce, 10, false), 2));
        assert_ne!(a, signature(&shape(Collective::AllReduce, 10, true), 2));
        assert_ne!(a, signature(&shape(Collective::AllReduce, 11, false), 2));
        assert_ne!(
            signature(&shape(Collective::Broadcast { root: 0 }, 10, false), 2),
            signature(&shape(Collective::Broadcast { root: 1 }, 10, false), 2)
        );
    }
}
