//! From a verified schedule and a call to an [`ExecutionPlan`]: the one
//! place where chunks become bytes, steps become instructions per segment,
//! messages get their numbers and slots, and `after` references become
//! waits on instruction indices.

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use super::facts::{self, Facts};
use super::layout::Layout;
use super::{
    ExecutionPlan, Instruction, LinkLoad, Message, PLAN_FORMAT_VERSION, Piece, PlanError, RankPlan,
    Region, Wait,
};
use crate::schedule::{Schedule, Slice, Step};
use crate::types::{Buffer, CallShape, Collective, InPlaceAlias, Link, Rank, ReduceOp};
use crate::verify::Verified;

/// Instructions a plan may hold over all ranks; past it, compiling fails
/// with [`PlanError::TooLarge`] rather than exhaust memory (about 250 bytes
/// each). Raise the chunk size to fit.
pub const MAX_PLAN_INSTRUCTIONS: u64 = 1 << 22;

/// How a call's chunks are cut into segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Chunking {
    /// As few segments as keep every chunk at most this many bytes.
    MaxBytes(usize),
    /// Exactly this many segments (at least 1).
    Segments(u32),
}

/// A verified schedule ready to compile, with the facts that depend on the
/// schedule alone computed once (lazily) and reused for every call.
#[derive(Debug)]
pub struct Compiler {
    verified: Arc<Verified>,
    schedule_hash: u64,
    facts: [OnceLock<Facts>; 2],
}

impl Compiler {
    /// A compiler for `verified`.
    pub fn new(verified: Arc<Verified>) -> Self {
        let schedule_hash = super::hash::stable_hash(verified.schedule());
        Compiler {
            verified,
            schedule_hash,
            facts: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// The schedule it compiles.
    pub fn verified(&self) -> &Arc<Verified> {
        &self.verified
    }

    fn facts(&self, in_place: bool) -> &Facts {
        self.facts[usize::from(in_place)]
            .get_or_init(|| facts::analyse(self.verified.schedule(), in_place))
    }

    /// The plan of `call` cut by `chunking`, for an executor whose links
    /// hold `slots_per_link` messages.
    pub fn compile(
        &self,
        call: &CallShape,
        chunking: Chunking,
        slots_per_link: u32,
    ) -> Result<ExecutionPlan, PlanError> {
        let mut plan = self.compile_unhashed(call, chunking, slots_per_link)?;
        plan.hash = plan.compute_hash();
        Ok(plan)
    }

    /// [`compile`](Self::compile) without the plan's hash (left 0, so
    /// [`ExecutionPlan::check`] refuses the plan): for a model that reads
    /// a plan and never compares it with another rank's. Hashing streams
    /// the whole plan's JSON form, a tenth of what simulating a large plan
    /// costs.
    pub fn compile_unhashed(
        &self,
        call: &CallShape,
        chunking: Chunking,
        slots_per_link: u32,
    ) -> Result<ExecutionPlan, PlanError> {
        let s = self.verified.schedule();
        self.check_call(call, slots_per_link)?;
        let layout = layout(s, call, chunking)?;
        let facts = self.facts(call.in_place);
        let mut cx = Context::new(s, call, layout, slots_per_link);
        let mut ranks: Vec<RankPlan> = (0..s.world_size)
            .map(|r| cx.rank(r, &facts[r as usize]))
            .collect();
        resolve_forwarded_bytes(&mut ranks)?;
        let links = link_loads(&ranks);
        let elem = call.dtype.size_bytes() as u64;
        let n = s.world_size;
        let blocks = |b: u32| u64::from(b) * call.count as u64 * elem;
        let (input_bytes, output_bytes) = if call.in_place {
            let c = call.collective;
            (0, blocks(c.size_blocks(n)))
        } else {
            (
                blocks(call.collective.input_blocks(n)),
                blocks(call.collective.output_blocks(n)),
            )
        };
        Ok(ExecutionPlan {
            version: PLAN_FORMAT_VERSION,
            schedule: s.name.clone(),
            schedule_hash: self.schedule_hash,
            collective: call.collective,
            count: call.count as u64,
            dtype: call.dtype,
            op: call.op,
            in_place: call.in_place,
            purpose: call.purpose,
            world_size: n,
            channels: s.channel_count() as u32,
            chunks_per_block: s.chunks_per_block,
            segments: layout.segments(),
            chunk_bytes: layout.longest_chunk() as u64 * elem,
            slots_per_link,
            input_bytes,
            output_bytes,
            scratch_bytes: scratch_bytes(s, call)?,
            ranks,
            links,
            hash: 0,
        })
    }

    /// How many segments the plan of `call` cut by `chunking` has, without
    /// compiling it (the simulator extrapolates long pipelines from short ones).
    pub fn segments(&self, call: &CallShape, chunking: Chunking) -> u32 {
        self.layout(call, chunking).segments()
    }

    /// The chunk-to-element map the plan of `call` cut by `chunking` has,
    /// without compiling it: two chunkings with equal layouts compile to
    /// the same plan (a model comparing chunk sizes runs it once).
    pub fn layout(&self, call: &CallShape, chunking: Chunking) -> Layout {
        layout_of(self.verified.schedule().chunks_per_block, call, chunking)
    }

    fn check_call(&self, call: &CallShape, slots_per_link: u32) -> Result<(), PlanError> {
        let v = &self.verified;
        let s = v.schedule();
        if call.collective != s.collective {
            return Err(PlanError::WrongCollective {
                schedule: s.name.clone(),
                proven: s.collective,
                called: call.collective,
            });
        }
        if call.in_place && !v.supports_in_place() {
            return Err(PlanError::InPlaceUnproven {
                schedule: s.name.clone(),
                collective: s.collective,
            });
        }
        if slots_per_link < v.slots_per_link() {
            return Err(PlanError::TooFewSlots {
                proven: v.slots_per_link(),
                given: slots_per_link,
            });
        }
        Ok(())
    }
}

/// Compile `verified` for one call (see [`Compiler::compile`]); a
/// [`Compiler`] reuses the schedule's facts across calls.
pub fn compile(
    verified: &Verified,
    call: &CallShape,
    chunking: Chunking,
    slots_per_link: u32,
) -> Result<ExecutionPlan, PlanError> {
    Compiler::new(Arc::new(verified.clone())).compile(call, chunking, slots_per_link)
}

/// The layout of `call` cut by `chunking`, for a schedule of `cpb` chunks
/// per block.
fn layout_of(cpb: u32, call: &CallShape, chunking: Chunking) -> Layout {
    let elem = call.dtype.size_bytes();
    match chunking {
        Chunking::MaxBytes(max) => Layout::with_max_chunk_bytes(call.count, cpb, elem, max),
        Chunking::Segments(k) => Layout::aligned(call.count, cpb, k, elem),
    }
}

/// The call's chunk-to-element map, refusing plans too large to hold.
fn layout(s: &Schedule, call: &CallShape, chunking: Chunking) -> Result<Layout, PlanError> {
    let elem = call.dtype.size_bytes();
    let n = s.world_size;
    let c = call.collective;
    let blocks = u64::from(c.size_blocks(n));
    let bytes = (call.count as u64)
        .checked_mul(blocks)
        .and_then(|e| e.checked_mul(elem as u64));
    if bytes.is_none_or(|b| b > i64::MAX as u64) {
        return Err(PlanError::TooLarge {
            what: "buffer bytes",
            value: u64::MAX,
            limit: i64::MAX as u64,
        });
    }
    let layout = layout_of(s.chunks_per_block, call, chunking);
    let instructions = (s.step_count() as u64).saturating_mul(u64::from(layout.segments()));
    if instructions > MAX_PLAN_INSTRUCTIONS {
        return Err(PlanError::TooLarge {
            what: "instructions (steps × segments; raise the chunk size)",
            value: instructions,
            limit: MAX_PLAN_INSTRUCTIONS,
        });
    }
    Ok(layout)
}

/// Bytes of scratch each rank needs, checked: a schedule's scratch may
/// hold more blocks than the call's buffers.
fn scratch_bytes(s: &Schedule, call: &CallShape) -> Result<u64, PlanError> {
    let blocks = u64::from(s.scratch_chunks.div_ceil(s.chunks_per_block));
    blocks
        .checked_mul(call.count as u64)
        .and_then(|e| e.checked_mul(call.dtype.size_bytes() as u64))
        .filter(|&b| b <= i64::MAX as u64)
        .ok_or(PlanError::TooLarge {
            what: "scratch bytes",
            value: u64::MAX,
            limit: i64::MAX as u64,
        })
}

/// What building one rank's instructions needs.
struct Context<'a> {
    s: &'a Schedule,
    call: &'a CallShape,
    layout: Layout,
    slots: u32,
    elem: u64,
}

impl<'a> Context<'a> {
    fn new(s: &'a Schedule, call: &'a CallShape, layout: Layout, slots: u32) -> Self {
        Context {
            s,
            call,
            layout,
            slots,
            elem: call.dtype.size_bytes() as u64,
        }
    }

    fn rank(&mut self, rank: Rank, facts: &[Vec<super::facts::StepFacts>]) -> RankPlan {
        let program = &self.s.ranks[rank as usize];
        let lens: Vec<u32> = program.channels.iter().map(|c| c.len() as u32).collect();
        let channels = program
            .channels
            .iter()
            .enumerate()
            .map(|(c, steps)| self.channel(rank, steps, &facts[c], &lens))
            .collect();
        RankPlan {
            rank,
            channels,
            divide: self.divide(rank),
        }
    }

    /// One channel's steps, unrolled segment after segment.
    fn channel(
        &self,
        rank: Rank,
        steps: &[Step],
        facts: &[super::facts::StepFacts],
        lens: &[u32],
    ) -> Vec<Instruction> {
        let n = self.s.world_size as usize;
        let (mut sent, mut received) = (vec![0u64; n], vec![0u64; n]);
        let message = |counts: &mut Vec<u64>, peer: Rank| {
            let index = counts[peer as usize];
            counts[peer as usize] += 1;
            Message {
                peer,
                index,
                slot: (index % u64::from(self.slots)) as u32,
            }
        };
        let mut out = Vec::with_capacity(steps.len() * self.layout.segments() as usize);
        for segment in 0..self.layout.segments() {
            let base = segment * steps.len() as u32;
            for (i, step) in steps.iter().enumerate() {
                let read = step
                    .read
                    .map(|r| self.region(rank, segment, r, step.chunks));
                let write = step
                    .write
                    .map(|w| self.region(rank, segment, w, step.chunks));
                // A step that only forwards takes its length from the message;
                // `resolve_forwarded_bytes` fills it in once every rank is built.
                let bytes = read.as_ref().or(write.as_ref()).map_or(0, Region::bytes);
                out.push(Instruction {
                    step: i as u32,
                    segment,
                    bytes,
                    recv: step
                        .recv_from
                        .iter()
                        .map(|&p| message(&mut received, p))
                        .collect(),
                    read,
                    write,
                    send: step
                        .send_to
                        .iter()
                        .map(|&p| message(&mut sent, p))
                        .collect(),
                    after: step
                        .after
                        .iter()
                        .map(|a| Wait {
                            channel: a.channel,
                            index: segment * lens[a.channel as usize] + a.step,
                        })
                        .collect(),
                    source: facts[i].source,
                    direct: facts[i].direct_from.map(|from| base + from),
                    stored_by_sender: facts[i].stored_by_sender,
                });
            }
        }
        out
    }

    /// The bytes of `chunks` chunks from `slice` in `segment`, in the
    /// physical buffer (in place: the caller's one buffer, `Output`).
    fn region(&self, rank: Rank, segment: u32, slice: Slice, chunks: u32) -> Region {
        let (buffer, chunk) = self
            .s
            .physical(self.call.in_place, rank, slice.buffer, slice.chunk);
        let buffer = match buffer {
            Buffer::Input if self.call.in_place => Buffer::Output,
            b => b,
        };
        let pieces = self
            .layout
            .slice_ranges(segment, chunk, chunks)
            .into_iter()
            .filter(|r| !r.is_empty())
            .map(|r| Piece {
                offset: r.start as u64 * self.elem,
                bytes: r.len() as u64 * self.elem,
            })
            .collect();
        Region { buffer, pieces }
    }

    /// Where `Avg` divides on `rank`: its result, once the call is done.
    fn divide(&self, rank: Rank) -> Option<Region> {
        if self.call.op != ReduceOp::Avg || !self.call.collective.reduces() {
            return None;
        }
        let block = self.call.count as u64 * self.elem;
        let offset = match self.call.collective {
            Collective::Reduce { root } if root != rank => return None,
            c if self.call.in_place => match c.in_place_alias(rank) {
                Some(InPlaceAlias::OutputIsInputBlock(b)) => u64::from(b) * block,
                _ => 0,
            },
            _ => 0,
        };
        let pieces = (block > 0)
            .then_some(Piece {
                offset,
                bytes: block,
            })
            .into_iter()
            .collect();
        Some(Region {
            buffer: Buffer::Output,
            pieces,
        })
    }
}

/// Where an instruction sits: (rank, channel, index).
type At = (usize, usize, usize);

/// Give every forwarding instruction (no region of its own) the length of
/// the message it forwards, following chains of forwards to their source.
fn resolve_forwarded_bytes(ranks: &mut [RankPlan]) -> Result<(), PlanError> {
    let mut producer: std::collections::HashMap<(Link, u64), At> = Default::default();
    for (r, rp) in ranks.iter().enumerate() {
        for (c, list) in rp.channels.iter().enumerate() {
            for (i, ins) in list.iter().enumerate() {
                for m in &ins.send {
                    producer.insert((link(r, m.peer, c), m.index), (r, c, i));
                }
            }
        }
    }
    let forwards = |ins: &Instruction| ins.read.is_none() && ins.write.is_none();
    let total: usize = ranks.iter().flat_map(|r| &r.channels).map(Vec::len).sum();
    let mut todo: Vec<At> = Vec::new();
    for (r, rp) in ranks.iter().enumerate() {
        for (c, list) in rp.channels.iter().enumerate() {
            todo.extend(
                (0..list.len())
                    .filter(|&i| forwards(&list[i]))
                    .map(|i| (r, c, i)),
            );
        }
    }
    for start in todo {
        // Walk back to an instruction with a region, then set the chain.
        let mut chain = vec![start];
        let bytes = loop {
            let (r, c, i) = *chain.last().expect("non-empty");
            let ins = &ranks[r].channels[c][i];
            if !forwards(ins) || (chain.len() > 1 && ins.bytes > 0) {
                break ins.bytes;
            }
            let Some(m) = ins.recv.first() else {
                return Err(PlanError::Invalid(format!(
                    "rank {r} channel {c} instruction {i} has neither a region nor a message"
                )));
            };
            let from = producer
                .get(&(link(m.peer as usize, r as Rank, c), m.index))
                .copied()
                .ok_or_else(|| {
                    PlanError::Invalid(format!(
                        "rank {r} channel {c} instruction {i} receives a message nobody sends"
                    ))
                })?;
            if chain.len() > total {
                return Err(PlanError::Invalid("messages forwarded in a cycle".into()));
            }
            chain.push(from);
        };
        for (r, c, i) in chain {
            let ins = &mut ranks[r].channels[c][i];
            if forwards(ins) {
                ins.bytes = bytes;
            }
        }
    }
    Ok(())
}

fn link(from: usize, to: Rank, channel: usize) -> Link {
    Link {
        from: from as Rank,
        to,
        channel: channel as u32,
    }
}

/// Every link some instruction sends on, with its traffic, in link order.
fn link_loads(ranks: &[RankPlan]) -> Vec<LinkLoad> {
    let mut loads: std::collections::BTreeMap<Link, LinkLoad> = Default::default();
    for (r, rp) in ranks.iter().enumerate() {
        for (c, list) in rp.channels.iter().enumerate() {
            for ins in list {
                for m in &ins.send {
                    let l = link(r, m.peer, c);
                    loads.entry(l).or_insert(LinkLoad::new(l)).count(ins.bytes);
                }
            }
        }
    }
    loads.into_values().collect()
}
