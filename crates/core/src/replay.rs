//! A serial replay of a [`Verified`] schedule on concrete values, segment by
//! segment, through the same buffering model the verifier uses.
//!
//! It is the oracle for executors and for the chunk-to-element
//! [`Layout`]: it moves real elements, so it catches what the
//! symbolic proof cannot see (an element mapped to the wrong place for some
//! count). It is written for clarity, not speed.

use crate::flow::{self, Semantics};
use crate::schedule::layout::Layout;
use crate::schedule::{Buffer, Slice, Step, StepAt};
use crate::types::InPlaceAlias;
use crate::verify::Verified;

/// Run `verified` on `inputs` (one vector of `input_blocks × count`
/// elements per rank), starting from `outputs` (one vector of
/// `output_blocks × count` per rank, typically poisoned), and return the
/// outputs. With `in_place`, the input lives inside the output (or the
/// output inside the input) as the collective defines, and `outputs` is
/// only used where it does not overlap the input. `reduce` combines two
/// values.
///
/// # Panics
/// If buffer lengths do not match `layout`, or `in_place` is asked of a
/// schedule not verified for it.
pub fn replay<T: Copy>(
    verified: &Verified,
    layout: Layout,
    in_place: bool,
    inputs: Vec<Vec<T>>,
    outputs: Vec<Vec<T>>,
    reduce: impl Fn(T, T) -> T,
) -> Vec<Vec<T>> {
    let schedule = verified.schedule();
    let n = schedule.world_size;
    let count = layout.count();
    assert_eq!(layout.chunks_per_block(), schedule.chunks_per_block);
    assert!(
        !in_place || verified.supports_in_place(),
        "schedule not verified in place"
    );
    let blocks = |b: Buffer| (schedule.buffer_chunks(b) / schedule.chunks_per_block) as usize;
    let scratch_len = schedule.scratch_len(count);
    let mut memory: Vec<Memory<T>> = Vec::with_capacity(n as usize);
    for (r, (input, mut output)) in inputs.into_iter().zip(outputs).enumerate() {
        assert_eq!(
            input.len(),
            blocks(Buffer::Input) * count,
            "rank {r} input length"
        );
        assert_eq!(
            output.len(),
            blocks(Buffer::Output) * count,
            "rank {r} output length"
        );
        let alias = if in_place {
            schedule.collective.in_place_alias(r as u32)
        } else {
            None
        };
        let mut input = input;
        if let Some(InPlaceAlias::InputIsOutputBlock(b)) = alias {
            let at = b as usize * count;
            output[at..at + count].copy_from_slice(&input);
            input.clear();
        }
        // Scratch starts as a copy of some output value; schedules never read
        // scratch before writing it (the verifier proves that).
        let scratch = match output.first().or(input.first()) {
            Some(&fill) => vec![fill; scratch_len],
            None => Vec::new(),
        };
        memory.push(Memory {
            input,
            output,
            scratch,
            alias,
        });
    }
    let mut state = Replay {
        layout,
        segment: 0,
        memory,
        reduce,
    };
    for segment in 0..layout.segments() {
        state.segment = segment;
        let outcome = flow::run(schedule, verified.slots_per_link(), &mut state, false);
        assert!(
            outcome.stalled.is_empty() && outcome.leftover.is_empty(),
            "a verified schedule stalled in replay"
        );
    }
    state
        .memory
        .into_iter()
        .map(|m| match m.alias {
            Some(InPlaceAlias::OutputIsInputBlock(b)) => {
                let at = b as usize * count;
                m.input[at..at + count].to_vec()
            }
            _ => m.output,
        })
        .collect()
}

struct Memory<T> {
    input: Vec<T>,
    output: Vec<T>,
    scratch: Vec<T>,
    alias: Option<InPlaceAlias>,
}

struct Replay<T, F> {
    layout: Layout,
    segment: u32,
    memory: Vec<Memory<T>>,
    reduce: F,
}

impl<T: Copy, F: Fn(T, T) -> T> Replay<T, F> {
    /// The physical vector and element offset a slice resolves to.
    fn resolve(&mut self, rank: u32, buffer: Buffer) -> (&mut Vec<T>, usize) {
        let count = self.layout.count();
        let m = &mut self.memory[rank as usize];
        match (buffer, m.alias) {
            (Buffer::Input, Some(InPlaceAlias::InputIsOutputBlock(b))) => {
                (&mut m.output, b as usize * count)
            }
            (Buffer::Output, Some(InPlaceAlias::OutputIsInputBlock(b))) => {
                (&mut m.input, b as usize * count)
            }
            (Buffer::Input, _) => (&mut m.input, 0),
            (Buffer::Output, _) => (&mut m.output, 0),
            (Buffer::Scratch, _) => (&mut m.scratch, 0),
        }
    }

    fn load(&mut self, rank: u32, slice: Slice, chunks: u32) -> Vec<T> {
        let ranges = self.layout.slice_ranges(self.segment, slice.chunk, chunks);
        let (buf, offset) = self.resolve(rank, slice.buffer);
        ranges
            .into_iter()
            .flat_map(|r| buf[offset + r.start..offset + r.end].iter().copied())
            .collect()
    }

    fn store(&mut self, rank: u32, slice: Slice, chunks: u32, values: &[T]) {
        let ranges = self.layout.slice_ranges(self.segment, slice.chunk, chunks);
        let (buf, offset) = self.resolve(rank, slice.buffer);
        let mut next = values.iter().copied();
        for r in ranges {
            for slot in &mut buf[offset + r.start..offset + r.end] {
                *slot = next.next().expect("message length matches the slice");
            }
        }
    }
}

impl<T: Copy, F: Fn(T, T) -> T> Semantics for Replay<T, F> {
    type Payload = Vec<T>;

    fn fire(&mut self, at: StepAt, step: &Step, received: &mut Vec<Vec<T>>) -> Option<Vec<T>> {
        let mut inputs = std::mem::take(received);
        if let Some(slice) = step.read {
            inputs.push(self.load(at.rank, slice, step.chunks));
        }
        let mut rest = inputs.into_iter();
        let mut value = rest.next().expect("verified steps have an input");
        for other in rest {
            for (a, b) in value.iter_mut().zip(other) {
                *a = (self.reduce)(*a, b);
            }
        }
        if let Some(slice) = step.write {
            self.store(at.rank, slice, step.chunks, &value);
        }
        (!step.send_to.is_empty()).then_some(value)
    }
}
