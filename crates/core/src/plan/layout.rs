//! From chunks to elements: the one place where remainders are handled.
//!
//! A buffer of `blocks × count` elements is cut, inside each block, into
//! `segments × chunks_per_block` parts by [`partition`]. Segment `s` of the
//! schedule owns parts `s·cpb .. (s+1)·cpb` of every block, so each segment
//! is a contiguous range of every block and the schedule runs once per
//! segment. Chunk `c` of segment `s` is part `s·cpb + c % cpb` of block
//! `c / cpb`.
//!
//! [`partition`] splits `count` into parts whose sizes differ by at most one
//! and which tile `0..count` exactly; when `count` is smaller than the number
//! of parts some parts are empty, and plans move empty chunks as
//! zero-length messages so that every rank stays in step.
//!
//! Compiled plans cut at [`ALIGN_BYTES`] within each block instead
//! ([`partition_aligned`]), where parts are large enough for that to cost
//! nothing (no extra segment, no chunk past a byte budget): a boundary in the middle of a 16-byte word sends every vector
//! kernel (a CPU's, a GPU's 16-byte loads and stores of f16 and bf16) down
//! its element-by-element path for the whole chunk. Block starts are
//! aligned only where the block's bytes are a multiple of 16.

use std::ops::Range;

/// Part `i` of `0..count` cut into `parts` balanced, contiguous parts.
///
/// Part `i` starts at `⌊i·count/parts⌋`; sizes are `⌊count/parts⌋` or one
/// more, the parts are in order and cover every element exactly once.
///
/// # Panics
/// If `parts` is 0 or `i >= parts` (a caller bug: schedules always have at
/// least one part).
pub fn partition(count: usize, parts: usize, i: usize) -> Range<usize> {
    assert!(i < parts, "part {i} of {parts}");
    let start = |k: usize| ((k as u128 * count as u128) / parts as u128) as usize;
    start(i)..start(i + 1)
}

/// Bytes chunk boundaries are aligned to inside a block: one vector load
/// or store on CPUs and GPUs.
pub const ALIGN_BYTES: usize = 16;

/// Part `i` of `0..count` cut into `parts` contiguous parts whose starts
/// (all but the end of the last) are multiples of `granule`: each
/// [`partition`] boundary rounded down to one. A part is at most the
/// longest balanced part rounded up to the granule (the last: plus less
/// than a granule); some parts may be empty.
///
/// # Panics
/// As [`partition`], and if `granule` is 0.
pub fn partition_aligned(count: usize, parts: usize, i: usize, granule: usize) -> Range<usize> {
    assert!(
        i < parts && granule > 0,
        "part {i} of {parts}, granule {granule}"
    );
    let start = |k: usize| {
        if k == parts {
            count
        } else {
            let s = partition(count, parts, k).start;
            s - s % granule
        }
    };
    start(i)..start(i + 1)
}

/// The chunk-to-element map of one collective call. Outside this crate
/// it is a value to compare ([`Compiler::layout`]): equal layouts of one
/// schedule compile to the same plan.
///
/// [`Compiler::layout`]: super::Compiler::layout
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    count: usize,
    chunks_per_block: u32,
    segments: u32,
    /// Elements each part boundary is a multiple of (1: unaligned).
    granule: usize,
}

/// Parts average at least this many granules before boundaries are
/// aligned: below, rounding would unbalance them for no gain.
const MIN_GRANULES_PER_PART: usize = 4;

/// Elements in [`ALIGN_BYTES`] of `elem_bytes`-byte elements (at least 1).
fn granule_of(elem_bytes: usize) -> usize {
    (ALIGN_BYTES / elem_bytes.max(1)).max(1)
}

impl Layout {
    /// A layout for `count` elements per block.
    ///
    /// `segments` is clamped to at least 1.
    pub(crate) fn new(count: usize, chunks_per_block: u32, segments: u32) -> Self {
        assert!(
            chunks_per_block > 0,
            "a schedule has at least one chunk per block"
        );
        Layout {
            count,
            chunks_per_block,
            segments: segments.max(1),
            granule: 1,
        }
    }

    /// [`Layout::new`] with part boundaries at [`ALIGN_BYTES`] of
    /// `elem_bytes`-byte elements, where parts are large enough.
    pub(crate) fn aligned(
        count: usize,
        chunks_per_block: u32,
        segments: u32,
        elem_bytes: usize,
    ) -> Self {
        Layout::new(count, chunks_per_block, segments).align(elem_bytes, usize::MAX)
    }

    /// A layout whose chunks hold at most `max_chunk_bytes` bytes (of
    /// `elem_bytes`-byte elements): as few segments as that allows, with
    /// boundaries at [`ALIGN_BYTES`] where that keeps every chunk within
    /// the budget (rounding boundaries can lengthen a part).
    pub(crate) fn with_max_chunk_bytes(
        count: usize,
        chunks_per_block: u32,
        elem_bytes: usize,
        max_chunk_bytes: usize,
    ) -> Self {
        let max_chunk_elems = (max_chunk_bytes / elem_bytes.max(1)).max(1);
        let parts_needed = count.div_ceil(max_chunk_elems);
        let segments = parts_needed.div_ceil(chunks_per_block as usize).max(1);
        Layout::new(
            count,
            chunks_per_block,
            u32::try_from(segments).unwrap_or(u32::MAX),
        )
        .align(elem_bytes, max_chunk_elems)
    }

    /// Align the boundaries to [`ALIGN_BYTES`] where parts hold enough
    /// granules to stay balanced and no part grows past `max_part`
    /// elements; otherwise keep them balanced to one element.
    fn align(self, elem_bytes: usize, max_part: usize) -> Self {
        let g = granule_of(elem_bytes);
        let parts = (self.segments as usize).saturating_mul(self.chunks_per_block as usize);
        let longest = self.count.div_ceil(parts);
        // A part between two rounded boundaries is a multiple of the
        // granule no longer than the longest balanced part rounded up; the
        // last ends at `count`.
        let last = self.count - {
            let s = partition(self.count, parts, parts - 1).start;
            s - s % g
        };
        let fits = longest.div_ceil(g) * g <= max_part && last <= max_part;
        let balanced = self.count / parts >= MIN_GRANULES_PER_PART * g;
        Layout {
            granule: if g > 1 && fits && balanced { g } else { 1 },
            ..self
        }
    }

    /// Elements of the longest chunk.
    pub(crate) fn longest_chunk(&self) -> usize {
        let parts = (self.segments as usize).saturating_mul(self.chunks_per_block as usize);
        (0..parts)
            .map(|i| partition_aligned(self.count, parts, i, self.granule).len())
            .max()
            .unwrap_or(0)
    }

    /// Segments the schedule runs over.
    pub fn segments(&self) -> u32 {
        self.segments
    }

    /// The elements of `chunk` in `segment`, as offsets into its buffer.
    pub(crate) fn chunk_range(&self, segment: u32, chunk: u32) -> Range<usize> {
        let cpb = self.chunks_per_block as usize;
        let block = chunk as usize / cpb;
        let part = segment as usize * cpb + chunk as usize % cpb;
        let parts = self.segments as usize * cpb;
        let r = partition_aligned(self.count, parts, part, self.granule);
        block * self.count + r.start..block * self.count + r.end
    }

    /// The elements of a step's slice (`chunks` chunks from `first`) in
    /// `segment`, merged into as few contiguous ranges as possible.
    pub(crate) fn slice_ranges(&self, segment: u32, first: u32, chunks: u32) -> Vec<Range<usize>> {
        let mut out: Vec<Range<usize>> = Vec::new();
        for c in first..first + chunks {
            let r = self.chunk_range(segment, c);
            match out.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => out.push(r),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn five_elements_over_four_parts_never_run_backwards() {
        let parts: Vec<_> = (0..4).map(|i| partition(5, 4, i)).collect();
        assert_eq!(parts, vec![0..1, 1..2, 2..3, 3..5]);
    }

    #[test]
    fn fewer_elements_than_parts_gives_empty_parts_not_inverted_ones() {
        let parts: Vec<_> = (0..4).map(|i| partition(2, 4, i)).collect();
        assert_eq!(parts, vec![0..0, 0..1, 1..1, 1..2]);
        assert!(parts.iter().all(|r| r.start <= r.end));
    }

    #[test]
    fn max_chunk_bytes_bounds_every_chunk() {
        let l = Layout::with_max_chunk_bytes(1000, 4, 4, 64);
        for s in 0..l.segments() {
            for c in 0..4 {
                assert!(l.chunk_range(s, c).len() * 4 <= 64);
            }
        }
        assert_eq!(Layout::with_max_chunk_bytes(0, 4, 4, 64).segments(), 1);
    }

    #[test]
    fn an_exact_fit_keeps_its_segments_and_is_aligned() {
        // 4096 f32 in 16 KiB chunks: one segment, as before alignment.
        let l = Layout::with_max_chunk_bytes(4096, 1, 4, 16384);
        assert_eq!(l.segments(), 1);
        let ring = Layout::with_max_chunk_bytes(1 << 20, 8, 4, 512 << 10);
        assert_eq!(ring.segments(), 1);
        assert_eq!(ring.longest_chunk(), 1 << 17);
    }

    #[test]
    fn compiled_layouts_cut_at_16_bytes_where_chunks_are_large() {
        // 1000 f16 over 6 parts: unaligned, boundaries at 166, 333, 500...
        let l = Layout::aligned(1000, 6, 1, 2);
        for c in 0..6 {
            let r = l.chunk_range(0, c);
            assert_eq!(r.start % 8, 0, "{r:?}");
        }
        assert_eq!(l.chunk_range(0, 5).end, 1000);
        // Tiny parts stay balanced.
        let tiny = Layout::aligned(20, 6, 1, 2);
        assert_eq!(tiny.chunk_range(0, 1), partition(20, 6, 1));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn aligned_partitions_tile_and_align(
            count in 0usize..5000, parts in 1usize..300, granule in 1usize..17,
        ) {
            let mut next = 0;
            for i in 0..parts {
                let r = partition_aligned(count, parts, i, granule);
                prop_assert_eq!(r.start, next);
                prop_assert!(r.end >= r.start);
                prop_assert_eq!(r.start % granule, 0);
                let longest = count.div_ceil(parts).div_ceil(granule) * granule;
                if i + 1 < parts {
                    prop_assert!(r.len() <= longest);
                } else {
                    prop_assert!(r.len() < count.div_ceil(parts) + granule);
                }
                next = r.end;
            }
            prop_assert_eq!(next, count);
        }

        #[test]
        fn max_chunk_bytes_holds_with_alignment(
            count in 0usize..20_000, elem in prop::sample::select(vec![1usize, 2, 4, 8]),
            max in 1usize..4096, cpb in 1u32..12,
        ) {
            let l = Layout::with_max_chunk_bytes(count, cpb, elem, max);
            // Alignment never costs a segment.
            prop_assert_eq!(
                l.segments() as usize,
                count.div_ceil((max / elem).max(1)).div_ceil(cpb as usize).max(1)
            );
            prop_assert!(l.longest_chunk() * elem <= max.max(elem));
            for s in 0..l.segments().min(4) {
                for c in 0..cpb {
                    let len = l.chunk_range(s, c).len();
                    prop_assert!(len * elem <= max.max(elem), "{} elements of {} bytes over {}", len, elem, max);
                }
            }
        }

        #[test]
        fn partition_tiles_exactly(count in 0usize..5000, parts in 1usize..300) {
            let mut next = 0;
            for i in 0..parts {
                let r = partition(count, parts, i);
                prop_assert_eq!(r.start, next);
                prop_assert!(r.end >= r.start);
                let len = r.len();
                prop_assert!(len == count / parts || len == count / parts + 1);
                next = r.end;
            }
            prop_assert_eq!(next, count);
        }

        #[test]
        fn layout_covers_every_element_of_every_block_once(
            count in 0usize..700,
            cpb in 1u32..20,
            segments in 1u32..6,
            blocks in 1u32..5,
        ) {
            let l = Layout::new(count, cpb, segments);
            let mut seen = vec![0u8; count * blocks as usize];
            for s in 0..segments {
                for c in 0..cpb * blocks {
                    for e in l.chunk_range(s, c) {
                        seen[e] += 1;
                    }
                }
                // Each segment is one contiguous range per block.
                let r = l.slice_ranges(s, 0, cpb);
                prop_assert!(r.len() <= 1);
            }
            prop_assert!(seen.iter().all(|&k| k == 1));
        }

        #[test]
        fn chunks_with_the_same_position_in_their_block_have_the_same_size(
            count in 0usize..500, cpb in 1u32..10, segments in 1u32..4, s in 0u32..4,
        ) {
            let l = Layout::new(count, cpb, segments);
            let s = s % segments;
            for c in 0..cpb {
                let len = l.chunk_range(s, c).len();
                prop_assert_eq!(l.chunk_range(s, c + 3 * cpb).len(), len);
            }
        }
    }
}
