//! Symbolic execution: every chunk holds "input chunk `c`, summed over this
//! set of ranks" instead of numbers, so one run proves the schedule for
//! every element count and every reduction op.

use super::violation::{Mode, Violation, ViolationKind as K, Violations};
use crate::flow::Semantics;
use crate::schedule::{Buffer, Schedule, Slice, Step, StepAt};
use crate::types::{Contributors, InPlaceAlias, Rank};

/// No step has written this cell.
const UNSET: u32 = u32::MAX;
/// Built from bad data; already reported where it was built.
const POISON: u32 = u32::MAX - 1;

/// A run of symbolic values: for each cell, the input chunk it derives from
/// and the set of ranks whose copies it combines (a bitset of `words` words).
#[derive(Debug, Clone)]
pub(crate) struct Cells {
    words: usize,
    origin: Vec<u32>,
    doubled: Vec<bool>,
    bits: Vec<u64>,
}

impl Cells {
    fn new(len: usize, words: usize) -> Self {
        Cells {
            words,
            origin: vec![UNSET; len],
            doubled: vec![false; len],
            bits: vec![0; len * words],
        }
    }

    fn len(&self) -> usize {
        self.origin.len()
    }

    fn bits(&self, i: usize) -> &[u64] {
        &self.bits[i * self.words..(i + 1) * self.words]
    }

    fn seed(&mut self, i: usize, origin: u32, rank: Rank) {
        self.origin[i] = origin;
        let w = rank as usize / 64;
        self.bits[i * self.words + w] |= 1 << (rank % 64);
    }

    fn copy_from(&mut self, i: usize, src: &Cells, j: usize) {
        self.origin[i] = src.origin[j];
        self.doubled[i] = src.doubled[j];
        let w = self.words;
        self.bits[i * w..(i + 1) * w].copy_from_slice(&src.bits[j * w..(j + 1) * w]);
    }

    fn count(&self, i: usize) -> u32 {
        self.bits(i).iter().map(|w| w.count_ones()).sum()
    }

    fn ranks(&self, i: usize) -> Vec<Rank> {
        bit_list(self.bits(i))
    }
}

fn bit_list(words: &[u64]) -> Vec<Rank> {
    let mut out = Vec::new();
    for (wi, &w) in words.iter().enumerate() {
        let mut w = w;
        while w != 0 {
            let b = w.trailing_zeros();
            out.push(wi as Rank * 64 + b);
            w &= w - 1;
        }
    }
    out
}

/// A buffer access, for the race check.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Access {
    pub at: StepAt,
    /// The buffer as the step names it.
    pub buffer: Buffer,
    /// The physical region (0 input, 1 output, 2 scratch) after aliasing.
    pub region: usize,
    pub start: u32,
    pub end: u32,
    pub write: bool,
}

pub(crate) struct Symbolic<'a> {
    schedule: &'a Schedule,
    mode: Mode,
    words: usize,
    /// Per rank: the input, output and scratch regions.
    memory: Vec<[Cells; 3]>,
    pub violations: Violations,
    /// Filled only when the schedule uses several channels.
    pub accesses: Option<Vec<Access>>,
}

impl<'a> Symbolic<'a> {
    pub(crate) fn new(schedule: &'a Schedule, mode: Mode) -> Self {
        let n = schedule.world_size;
        let words = (n as usize).div_ceil(64).max(1);
        let cpb = schedule.chunks_per_block;
        let memory = (0..n)
            .map(|r| {
                let mut input = Cells::new(schedule.buffer_chunks(Buffer::Input) as usize, words);
                let mut output = Cells::new(schedule.buffer_chunks(Buffer::Output) as usize, words);
                for c in 0..input.len() {
                    input.seed(c, c as u32, r);
                }
                // In place, the aliased part of the bigger buffer starts out
                // holding the caller's input.
                if mode == Mode::InPlace
                    && let Some(InPlaceAlias::InputIsOutputBlock(b)) =
                        schedule.collective.in_place_alias(r)
                {
                    for c in 0..input.len() {
                        output.copy_from((b * cpb) as usize + c, &input, c);
                    }
                }
                let scratch = Cells::new(schedule.scratch_chunks as usize, words);
                [input, output, scratch]
            })
            .collect();
        let multi_channel = schedule.channel_count() > 1;
        Symbolic {
            schedule,
            mode,
            words,
            memory,
            violations: Violations::default(),
            accesses: multi_channel.then(Vec::new),
        }
    }

    /// The physical (region, first cell) of `buffer` chunk `chunk` on `rank`.
    fn locate(&self, rank: Rank, buffer: Buffer, chunk: u32) -> (usize, u32) {
        let cpb = self.schedule.chunks_per_block;
        let alias = match self.mode {
            Mode::InPlace => self.schedule.collective.in_place_alias(rank),
            _ => None,
        };
        match (buffer, alias) {
            (Buffer::Input, Some(InPlaceAlias::InputIsOutputBlock(b))) => (1, b * cpb + chunk),
            (Buffer::Output, Some(InPlaceAlias::OutputIsInputBlock(b))) => (0, b * cpb + chunk),
            (Buffer::Input, _) => (0, chunk),
            (Buffer::Output, _) => (1, chunk),
            (Buffer::Scratch, _) => (2, chunk),
        }
    }

    fn record(&mut self, at: StepAt, slice: Slice, chunks: u32, write: bool) {
        let (region, start) = self.locate(at.rank, slice.buffer, slice.chunk);
        if let Some(acc) = &mut self.accesses {
            acc.push(Access {
                at,
                buffer: slice.buffer,
                region,
                start,
                end: start + chunks,
                write,
            });
        }
    }

    fn flag(&mut self, at: StepAt, kind: K) {
        self.violations.push(Violation::at(self.mode, at, kind));
    }

    /// Combine `other[j]` into `acc[i]`, returning what went wrong, if anything.
    fn combine(&self, acc: &mut Cells, i: usize, other: &Cells, j: usize) -> Option<K> {
        let (a, b) = (acc.origin[i], other.origin[j]);
        if a == POISON || b == POISON {
            acc.origin[i] = POISON;
            return None;
        }
        if a != b {
            acc.origin[i] = POISON;
            return Some(K::MixedChunks { first: a, second: b });
        }
        let w = self.words;
        let mut overlap = vec![0u64; w];
        let mut any = false;
        for k in 0..w {
            let (x, y) = (acc.bits[i * w + k], other.bits[j * w + k]);
            overlap[k] = x & y;
            any |= x & y != 0;
            acc.bits[i * w + k] = x | y;
        }
        acc.doubled[i] |= any || other.doubled[j];
        any.then(|| K::DoubleCounted {
            ranks: bit_list(&overlap),
        })
    }

    /// Copy a slice out of memory, flagging (and poisoning) unwritten cells.
    fn load(&mut self, at: StepAt, slice: Slice, chunks: u32) -> Cells {
        let (region, start) = self.locate(at.rank, slice.buffer, slice.chunk);
        let mut out = Cells::new(chunks as usize, self.words);
        let mut unwritten = None;
        {
            let mem = &self.memory[at.rank as usize][region];
            for i in 0..chunks as usize {
                out.copy_from(i, mem, start as usize + i);
                if out.origin[i] == UNSET {
                    out.origin[i] = POISON;
                    unwritten.get_or_insert(slice.chunk + i as u32);
                }
            }
        }
        if let Some(chunk) = unwritten {
            self.flag(
                at,
                K::ReadsUnwritten {
                    buffer: slice.buffer,
                    chunk,
                },
            );
        }
        out
    }

    fn store(&mut self, at: StepAt, slice: Slice, value: &Cells) {
        let cpb = self.schedule.chunks_per_block;
        let (region, start) = self.locate(at.rank, slice.buffer, slice.chunk);
        let mut mismatch = None;
        for i in 0..value.len() {
            let origin = value.origin[i];
            let slot = slice.chunk + i as u32;
            if origin < POISON && origin % cpb != slot % cpb {
                mismatch.get_or_insert((origin, slot));
            }
            self.memory[at.rank as usize][region].copy_from(start as usize + i, value, i);
        }
        if let Some((value_chunk, slot_chunk)) = mismatch {
            self.flag(
                at,
                K::ShapeMismatch {
                    value_chunk,
                    slot_chunk,
                },
            );
        }
    }

    /// Compare every output with what the collective requires.
    pub(crate) fn check_results(&mut self) {
        let schedule = self.schedule;
        let n = schedule.world_size;
        let cpb = schedule.chunks_per_block;
        let collective = schedule.collective;
        for r in 0..n {
            for c in 0..schedule.buffer_chunks(Buffer::Output) {
                let (region, cell) = self.locate(r, Buffer::Output, c);
                let mem = &self.memory[r as usize][region];
                let i = cell as usize;
                let at_chunk = |kind| Violation {
                    mode: self.mode,
                    rank: Some(r),
                    channel: None,
                    step: None,
                    chunk: Some(c),
                    kind,
                };
                let Some(expected) = collective.expected(n, cpb, r, c) else {
                    // Reduce leaves non-root outputs alone.
                    let untouched = match self.mode {
                        Mode::InPlace => {
                            mem.origin[i] == c && mem.count(i) == 1 && mem.bits(i)[r as usize / 64] >> (r % 64) & 1 == 1
                        }
                        _ => mem.origin[i] == UNSET,
                    };
                    if !untouched {
                        self.violations.push(at_chunk(K::WritesNonRootOutput));
                    }
                    continue;
                };
                if mem.doubled[i] {
                    continue; // reported where the double count happened
                }
                let count = mem.count(i);
                let right_set = match expected.contributors {
                    Contributors::All => count == n,
                    Contributors::One(k) => count == 1 && mem.ranks(i) == [k],
                };
                if mem.origin[i] == expected.input_chunk && right_set {
                    continue;
                }
                let want = describe(expected.input_chunk, &expected_ranks(expected.contributors, n), n);
                let found = match mem.origin[i] {
                    UNSET => "nothing (never written)".to_owned(),
                    POISON => "a value built from unwritten or mismatched data".to_owned(),
                    o => describe(o, &mem.ranks(i), n),
                };
                let v = at_chunk(K::WrongResult {
                    expected: want,
                    found,
                });
                self.violations.push(v);
            }
        }
    }
}

fn expected_ranks(c: Contributors, n: u32) -> Vec<Rank> {
    match c {
        Contributors::All => (0..n).collect(),
        Contributors::One(k) => vec![k],
    }
}

fn describe(input_chunk: u32, ranks: &[Rank], n: u32) -> String {
    let who = if ranks.len() == n as usize && n > 1 {
        format!("all {n} ranks")
    } else if ranks.len() <= 8 {
        format!(
            "rank{} {}",
            if ranks.len() == 1 { "" } else { "s" },
            ranks.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
        )
    } else {
        let missing: Vec<String> = (0..n)
            .filter(|r| !ranks.contains(r))
            .take(8)
            .map(|r| r.to_string())
            .collect();
        format!("{} of {n} ranks (missing {}…)", ranks.len(), missing.join(","))
    };
    format!("input chunk {input_chunk} from {who}")
}

impl Semantics for Symbolic<'_> {
    type Payload = Cells;

    fn fire(&mut self, at: StepAt, step: &Step, received: Vec<Cells>) -> Option<Cells> {
        let k = step.chunks as usize;
        let mut inputs: Vec<Cells> = Vec::with_capacity(step.input_count());
        for (msg, &from) in received.into_iter().zip(&step.recv_from) {
            if msg.len() != k {
                self.flag(
                    at,
                    K::MessageSizeMismatch {
                        from,
                        expected: step.chunks,
                        got: msg.len() as u32,
                    },
                );
                let mut fixed = Cells::new(k, self.words);
                for i in 0..k {
                    if i < msg.len() {
                        fixed.copy_from(i, &msg, i);
                    } else {
                        fixed.origin[i] = POISON;
                    }
                }
                inputs.push(fixed);
            } else {
                inputs.push(msg);
            }
        }
        if let Some(slice) = step.read {
            self.record(at, slice, step.chunks, false);
            inputs.push(self.load(at, slice, step.chunks));
        }
        if inputs.len() > 1 && !self.schedule.collective.reduces() {
            self.flag(
                at,
                K::ReductionWithoutOp {
                    collective: self.schedule.collective.kind().to_string(),
                },
            );
        }
        let mut rest = inputs.into_iter();
        let mut value = rest.next()?;
        for other in rest {
            // One report per step and kind of fault, at its first chunk.
            let mut first: Vec<(u32, K)> = Vec::new();
            for i in 0..k {
                if let Some(kind) = self.combine(&mut value, i, &other, i)
                    && !first
                        .iter()
                        .any(|(_, f)| std::mem::discriminant(f) == std::mem::discriminant(&kind))
                {
                    first.push((i as u32, kind));
                }
            }
            let base = step.write.or(step.read).map_or(0, |s| s.chunk);
            for (offset, kind) in first {
                let v = Violation::at(self.mode, at, kind).with_chunk(base + offset);
                self.violations.push(v);
            }
        }
        if let Some(slice) = step.write {
            self.record(at, slice, step.chunks, true);
            self.store(at, slice, &value);
        }
        (!step.send_to.is_empty()).then_some(value)
    }
}
