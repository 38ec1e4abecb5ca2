//! Symbolic execution: every chunk holds "input chunk `c`, summed over this
//! set of ranks" instead of numbers, so one run proves the schedule for
//! every element count and every reduction op.

use super::violation::{Mode, Violation, ViolationKind as K, Violations};
use crate::flow::Semantics;
use crate::schedule::{Schedule, Slice, Step, StepAt};
use crate::types::{Buffer, Contributors, InPlaceAlias, Rank};

/// No step has written this cell.
const UNSET: u32 = u32::MAX;
/// Built from bad data; already reported where it was built.
const POISON: u32 = u32::MAX - 1;

/// A run of symbolic values: for each cell, the input chunk it derives from
/// and the set of ranks whose copies it combines. Stored flat, one header
/// word (origin in the low half, the double-count flag in bit 32) and then
/// `words` bitset words per cell, so a message is one allocation.
#[derive(Debug, Clone)]
pub(crate) struct Cells {
    stride: usize,
    data: Vec<u64>,
}

const DOUBLED: u64 = 1 << 32;

impl Cells {
    fn new(len: usize, words: usize) -> Self {
        let stride = words + 1;
        let mut data = vec![0; len * stride];
        for i in 0..len {
            data[i * stride] = u64::from(UNSET);
        }
        Cells { stride, data }
    }

    fn len(&self) -> usize {
        self.data.len() / self.stride
    }

    fn origin(&self, i: usize) -> u32 {
        self.data[i * self.stride] as u32
    }

    fn set_origin(&mut self, i: usize, origin: u32) {
        let h = &mut self.data[i * self.stride];
        *h = (*h & DOUBLED) | u64::from(origin);
    }

    fn doubled(&self, i: usize) -> bool {
        self.data[i * self.stride] & DOUBLED != 0
    }

    fn bits(&self, i: usize) -> &[u64] {
        &self.data[i * self.stride + 1..(i + 1) * self.stride]
    }

    fn seed(&mut self, i: usize, origin: u32, rank: Rank) {
        self.set_origin(i, origin);
        self.data[i * self.stride + 1 + rank as usize / 64] |= 1 << (rank % 64);
    }

    fn copy_from(&mut self, i: usize, src: &Cells, j: usize) {
        let w = self.stride;
        self.data[i * w..(i + 1) * w].copy_from_slice(&src.data[j * w..(j + 1) * w]);
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
    /// Every value built by a step that sends it; messages point into it.
    arena: Vec<u64>,
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
            // Every sent value lives in the arena until the run ends; a
            // value that is not sent passes through it (pushed, then
            // truncated), so room for the widest one too: without it the
            // last push doubles a multi-gigabyte arena on large schedules.
            arena: Vec::with_capacity(
                (schedule
                    .steps()
                    .filter(|(_, s)| !s.send_to.is_empty())
                    .map(|(_, s)| s.chunks as usize)
                    .sum::<usize>()
                    + schedule
                        .steps()
                        .map(|(_, s)| s.chunks as usize)
                        .max()
                        .unwrap_or(0))
                    * (words + 1),
            ),
            accesses: multi_channel.then(Vec::new),
        }
    }

    /// The physical (region, first cell) of `buffer` chunk `chunk` on `rank`.
    fn locate(&self, rank: Rank, buffer: Buffer, chunk: u32) -> (usize, u32) {
        let (buffer, chunk) =
            self.schedule
                .physical(self.mode == Mode::InPlace, rank, buffer, chunk);
        (buffer as usize, chunk)
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

    /// The word range of `cells` cells starting at cell `start`.
    fn words_of(&self, start: u32, cells: usize) -> (usize, usize) {
        let w = self.words + 1;
        (start as usize * w, (start as usize + cells) * w)
    }

    /// Append the value a step reads from memory to the arena, or combine it
    /// into the value already there; flags unwritten cells.
    fn take_read(&mut self, at: StepAt, slice: Slice, k: usize, value: Option<usize>) -> Option<K> {
        let (region, start) = self.locate(at.rank, slice.buffer, slice.chunk);
        let (lo, hi) = self.words_of(start, k);
        let w = self.words + 1;
        let mem = &self.memory[at.rank as usize][region].data[lo..hi];
        let unwritten = (0..k).find(|&i| mem[i * w] as u32 == UNSET);
        let mut fault = None;
        match value {
            None => {
                let from = self.arena.len();
                self.arena.extend_from_slice(mem);
                for i in 0..k {
                    let h = &mut self.arena[from + i * w];
                    if *h as u32 == UNSET {
                        *h = (*h & DOUBLED) | u64::from(POISON);
                    }
                }
            }
            Some(base) => {
                for i in 0..k {
                    let x = &mut self.arena[base + i * w..base + (i + 1) * w];
                    fault = fault.or(combine(x, &mem[i * w..(i + 1) * w]));
                }
            }
        }
        if let Some(i) = unwritten {
            self.flag(
                at,
                K::ReadsUnwritten {
                    buffer: slice.buffer,
                    chunk: slice.chunk + i as u32,
                },
            );
        }
        fault
    }

    fn store(&mut self, at: StepAt, slice: Slice, base: usize, k: usize) {
        let cpb = self.schedule.chunks_per_block;
        let (region, start) = self.locate(at.rank, slice.buffer, slice.chunk);
        let (lo, hi) = self.words_of(start, k);
        let w = self.words + 1;
        let value = &self.arena[base..base + k * w];
        let mismatch = (0..k).find_map(|i| {
            let origin = value[i * w] as u32;
            let slot = slice.chunk + i as u32;
            (origin < POISON && origin % cpb != slot % cpb).then_some((origin, slot))
        });
        self.memory[at.rank as usize][region].data[lo..hi].copy_from_slice(value);
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
                        Mode::InPlace => mem.origin(i) == c && mem.ranks(i) == [r],
                        _ => mem.origin(i) == UNSET,
                    };
                    if !untouched {
                        self.violations.push(at_chunk(K::WritesNonRootOutput));
                    }
                    continue;
                };
                if mem.doubled(i) {
                    continue; // reported where the double count happened
                }
                let count = mem.count(i);
                let right_set = match expected.contributors {
                    Contributors::All => count == n,
                    Contributors::One(k) => {
                        count == 1 && mem.bits(i)[k as usize / 64] >> (k % 64) & 1 == 1
                    }
                };
                if mem.origin(i) == expected.input_chunk && right_set {
                    continue;
                }
                let want = describe(
                    expected.input_chunk,
                    &expected_ranks(expected.contributors, n),
                    n,
                );
                let found = match mem.origin(i) {
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
            ranks
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )
    } else {
        let missing: Vec<String> = (0..n)
            .filter(|r| !ranks.contains(r))
            .take(8)
            .map(|r| r.to_string())
            .collect();
        format!(
            "{} of {n} ranks (missing {}…)",
            ranks.len(),
            missing.join(",")
        )
    };
    format!("input chunk {input_chunk} from {who}")
}

/// Combine cell `y` into cell `x` (header word then bitset words each);
/// returns what went wrong, if anything.
fn combine(x: &mut [u64], y: &[u64]) -> Option<K> {
    let (a, b) = (x[0] as u32, y[0] as u32);
    if a >= POISON || b >= POISON {
        x[0] = (x[0] & DOUBLED) | u64::from(POISON);
        return None;
    }
    if a != b {
        x[0] = (x[0] & DOUBLED) | u64::from(POISON);
        return Some(K::MixedChunks {
            first: a,
            second: b,
        });
    }
    let overlaps = x[1..].iter().zip(&y[1..]).any(|(p, q)| p & q != 0);
    let report = overlaps.then(|| {
        let both: Vec<u64> = x[1..].iter().zip(&y[1..]).map(|(p, q)| p & q).collect();
        K::DoubleCounted {
            ranks: bit_list(&both),
        }
    });
    for (p, q) in x[1..].iter_mut().zip(&y[1..]) {
        *p |= q;
    }
    if overlaps || y[0] & DOUBLED != 0 {
        x[0] |= DOUBLED;
    }
    report
}

/// A message: `cells` cells of the arena from word `start`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    start: usize,
    cells: usize,
}

impl Semantics for Symbolic<'_> {
    type Payload = Span;

    fn fire(&mut self, at: StepAt, step: &Step, received: &mut Vec<Span>) -> Option<Span> {
        let k = step.chunks as usize;
        let w = self.words + 1;
        let base = self.arena.len();
        let mut have_value = false;
        // One report per step and kind of fault, at its first chunk.
        let mut faults: Vec<K> = Vec::new();
        let note = |faults: &mut Vec<K>, f: Option<K>| {
            if let Some(f) = f
                && !faults
                    .iter()
                    .any(|g| std::mem::discriminant(g) == std::mem::discriminant(&f))
            {
                faults.push(f);
            }
        };
        for (span, &from) in received.drain(..).zip(&step.recv_from) {
            if span.cells != k {
                self.flag(
                    at,
                    K::MessageSizeMismatch {
                        from,
                        expected: step.chunks,
                        got: span.cells as u32,
                    },
                );
            }
            let shared = span.cells.min(k);
            if !have_value {
                self.arena
                    .extend_from_within(span.start..span.start + shared * w);
                for _ in shared..k {
                    self.arena.push(u64::from(POISON));
                    self.arena.extend(std::iter::repeat_n(0, w - 1));
                }
                have_value = true;
                continue;
            }
            let (old, new) = self.arena.split_at_mut(base);
            for i in 0..k {
                let x = &mut new[i * w..(i + 1) * w];
                if i < shared {
                    let y = &old[span.start + i * w..span.start + (i + 1) * w];
                    note(&mut faults, combine(x, y));
                } else {
                    x[0] = u64::from(POISON);
                }
            }
        }
        if let (Some(r), Some(w)) = (step.read, step.write) {
            let (rr, rs) = self.locate(at.rank, r.buffer, r.chunk);
            let (wr, ws) = self.locate(at.rank, w.buffer, w.chunk);
            let overlap = rr == wr && rs < ws + step.chunks && ws < rs + step.chunks;
            if overlap && rs != ws {
                self.flag(
                    at,
                    K::OverlappingSlices {
                        read: rs,
                        write: ws,
                    },
                );
            }
        }
        if let Some(slice) = step.read {
            self.record(at, slice, step.chunks, false);
            let f = self.take_read(at, slice, k, have_value.then_some(base));
            note(&mut faults, f);
            have_value = true;
        }
        if !have_value {
            return None;
        }
        if step.input_count() > 1 && !self.schedule.collective.reduces() {
            self.flag(
                at,
                K::ReductionWithoutOp {
                    collective: self.schedule.collective.kind().to_string(),
                },
            );
        }
        let chunk = step.write.or(step.read).map_or(0, |s| s.chunk);
        for f in faults {
            let v = Violation::at(self.mode, at, f).with_chunk(chunk);
            self.violations.push(v);
        }
        if let Some(slice) = step.write {
            self.record(at, slice, step.chunks, true);
            self.store(at, slice, base, k);
        }
        if step.send_to.is_empty() {
            self.arena.truncate(base);
            None
        } else {
            Some(Span {
                start: base,
                cells: k,
            })
        }
    }
}
