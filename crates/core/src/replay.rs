//! A serial run of an [`ExecutionPlan`] on concrete values: every rank's
//! instructions fired one at a time under the plan's model, with real
//! elements in real buffers.
//!
//! It is the oracle for executors and for the plan itself: it moves real
//! elements through the plan's byte regions, so it catches what the
//! symbolic proof cannot see (an element mapped to the wrong place for some
//! count, a message numbered wrong). It is written for clarity, not speed.

use std::collections::{HashMap, VecDeque};

use crate::plan::{ExecutionPlan, Instruction, Region, Walk};
use crate::types::{Buffer, InPlaceAlias, Link, Rank};

/// Run `plan` on `inputs` (one vector of `input_blocks × count` elements
/// per rank), starting from `outputs` (one vector of `output_blocks ×
/// count` per rank, typically poisoned), and return the outputs. In place,
/// each rank's one buffer is prepared as the collective's in-place call
/// defines (the input inside the output, or the output inside the input)
/// and the output part of it is returned. `reduce` combines two values;
/// the division of `Avg` is not applied.
///
/// # Panics
/// If `T`'s size is not the plan's element size, buffer lengths do not
/// match the plan, or the plan stalls (a plan compiled from a verified
/// schedule never does).
pub fn replay<T: Copy>(
    plan: &ExecutionPlan,
    inputs: Vec<Vec<T>>,
    outputs: Vec<Vec<T>>,
    reduce: impl Fn(T, T) -> T,
) -> Vec<Vec<T>> {
    assert_eq!(
        std::mem::size_of::<T>(),
        plan.element_bytes(),
        "element size"
    );
    let mut memory: Vec<Memory<T>> = inputs
        .into_iter()
        .zip(outputs)
        .enumerate()
        .map(|(r, (input, output))| Memory::new(plan, r as Rank, input, output))
        .collect();
    let mut links: HashMap<Link, VecDeque<Vec<T>>> = HashMap::new();
    let mut walks: Vec<Walk> = plan.ranks.iter().map(Walk::new).collect();
    loop {
        let mut progressed = false;
        for (r, walk) in walks.iter_mut().enumerate() {
            for c in 0..walk.channels() {
                while let Some((_, ins)) = walk.ready(c) {
                    if !can_fire(plan, &links, r as Rank, c as u32, ins) {
                        break;
                    }
                    fire(
                        &mut memory[r],
                        &mut links,
                        r as Rank,
                        c as u32,
                        ins,
                        &reduce,
                    );
                    walk.advance(c);
                    progressed = true;
                }
            }
        }
        if !progressed {
            break;
        }
    }
    assert!(
        walks.iter().all(Walk::done) && links.values().all(VecDeque::is_empty),
        "a compiled plan stalled in replay"
    );
    memory
        .into_iter()
        .enumerate()
        .map(|(r, m)| m.result(plan, r as Rank))
        .collect()
}

/// One rank's buffers, as the plan names them.
struct Memory<T> {
    input: Vec<T>,
    output: Vec<T>,
    scratch: Vec<T>,
}

impl<T: Copy> Memory<T> {
    fn new(plan: &ExecutionPlan, rank: Rank, input: Vec<T>, output: Vec<T>) -> Self {
        let size = plan.element_bytes();
        let count = plan.count as usize;
        let (input, output) = match plan.collective.in_place_alias(rank) {
            _ if !plan.in_place => (input, output),
            Some(InPlaceAlias::InputIsOutputBlock(b)) => {
                let mut one = output;
                let at = b as usize * count;
                one[at..at + count].copy_from_slice(&input);
                (Vec::new(), one)
            }
            Some(InPlaceAlias::OutputIsInputBlock(_)) => (Vec::new(), input),
            None => panic!("{} has no in-place form", plan.collective),
        };
        assert_eq!(
            input.len() * size,
            plan.input_bytes as usize,
            "rank {rank} input length"
        );
        assert_eq!(
            output.len() * size,
            plan.output_bytes as usize,
            "rank {rank} output length"
        );
        // Scratch starts as a copy of some value; plans never read scratch
        // before writing it (the verifier proves that).
        let fill = output.first().or(input.first()).copied();
        let scratch = fill.map_or_else(Vec::new, |f| vec![f; plan.scratch_bytes as usize / size]);
        Memory {
            input,
            output,
            scratch,
        }
    }

    fn buffer(&mut self, b: Buffer) -> &mut Vec<T> {
        match b {
            Buffer::Input => &mut self.input,
            Buffer::Output => &mut self.output,
            Buffer::Scratch => &mut self.scratch,
        }
    }

    fn load(&mut self, region: &Region) -> Vec<T> {
        let size = std::mem::size_of::<T>() as u64;
        let buf = self.buffer(region.buffer);
        region
            .pieces
            .iter()
            .flat_map(|p| {
                buf[(p.offset / size) as usize..((p.offset + p.bytes) / size) as usize]
                    .iter()
                    .copied()
            })
            .collect()
    }

    fn store(&mut self, region: &Region, values: &[T]) {
        let size = std::mem::size_of::<T>() as u64;
        let buf = self.buffer(region.buffer);
        let mut next = values.iter().copied();
        for p in &region.pieces {
            for slot in &mut buf[(p.offset / size) as usize..((p.offset + p.bytes) / size) as usize]
            {
                *slot = next.next().expect("regions are as long as the value");
            }
        }
    }

    /// The output as the caller sees it (in place reduce-scatter: its block).
    fn result(self, plan: &ExecutionPlan, rank: Rank) -> Vec<T> {
        match plan.collective.in_place_alias(rank) {
            Some(InPlaceAlias::OutputIsInputBlock(b)) if plan.in_place => {
                let count = plan.count as usize;
                self.output[b as usize * count..(b as usize + 1) * count].to_vec()
            }
            _ => self.output,
        }
    }
}

fn link(from: Rank, to: Rank, channel: u32) -> Link {
    Link { from, to, channel }
}

fn can_fire<T>(
    plan: &ExecutionPlan,
    links: &HashMap<Link, VecDeque<Vec<T>>>,
    rank: Rank,
    c: u32,
    ins: &Instruction,
) -> bool {
    let queued = |l: Link| links.get(&l).map_or(0, VecDeque::len);
    ins.recv.iter().all(|m| queued(link(m.peer, rank, c)) > 0)
        && ins
            .send
            .iter()
            .all(|m| queued(link(rank, m.peer, c)) < plan.slots_per_link as usize)
}

fn fire<T: Copy>(
    memory: &mut Memory<T>,
    links: &mut HashMap<Link, VecDeque<Vec<T>>>,
    rank: Rank,
    c: u32,
    ins: &Instruction,
    reduce: &impl Fn(T, T) -> T,
) {
    let mut inputs: Vec<Vec<T>> = ins
        .recv
        .iter()
        .map(|m| {
            links
                .get_mut(&link(m.peer, rank, c))
                .and_then(VecDeque::pop_front)
                .expect("checked")
        })
        .collect();
    if let Some(r) = &ins.read {
        inputs.push(memory.load(r));
    }
    let mut rest = inputs.into_iter();
    let mut value = rest.next().expect("instructions have an input");
    for other in rest {
        assert_eq!(
            value.len(),
            other.len(),
            "values of one instruction differ in length"
        );
        for (a, b) in value.iter_mut().zip(other) {
            *a = reduce(*a, b);
        }
    }
    assert_eq!(
        value.len() * std::mem::size_of::<T>(),
        ins.bytes as usize,
        "value length"
    );
    if let Some(w) = &ins.write {
        memory.store(w, &value);
    }
    for m in &ins.send {
        links
            .entry(link(rank, m.peer, c))
            .or_default()
            .push_back(value.clone());
    }
}
