//! The schedule IR: what every rank does, step by step, on each channel.
//!
//! A [`Schedule`] is independent of the element count. It moves *chunks*:
//! every buffer is cut into blocks of `count` elements (one block for most
//! buffers, `n` for the all-gather output, the reduce-scatter input and both
//! all-to-all buffers) and every block into `chunks_per_block` chunks. The
//! [execution plan](crate::plan) maps chunks to bytes for one call and
//! unrolls the schedule once per *segment*, which is how large buffers
//! pipeline.
//!
//! Each [`Step`] is described by orthogonal fields — receive from whom, read
//! which local chunks, write which local chunks, send to whom — rather than
//! by a zoo of primitive names; [`Step::primitive_name`] gives the familiar
//! NCCL-style name back.

mod builder;
mod json;
pub mod msccl;
mod render;
mod step;

pub use builder::ScheduleBuilder;
pub use json::FORMAT_VERSION;
pub use render::render_grid;
pub(crate) use step::primitive_name;
pub use step::{Slice, Step, StepAt, StepRef};

use serde::{Deserialize, Serialize};

use crate::types::{Buffer, Collective, InPlaceAlias, Rank};

/// A complete schedule: one program per rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// A human-readable name (`ring`, `tree`, or a user's own).
    pub name: String,
    /// The collective the schedule computes.
    pub collective: Collective,
    /// Number of ranks, `n`.
    pub world_size: u32,
    /// Chunks in each block of `count` elements.
    pub chunks_per_block: u32,
    /// Chunks of per-rank scratch space (each shaped like chunk `i % chunks_per_block`).
    pub scratch_chunks: u32,
    /// `ranks[r]` is rank `r`'s program.
    pub ranks: Vec<RankProgram>,
}

/// One rank's program: an ordered list of steps per channel.
///
/// Channels of a rank run concurrently (like CUDA streams or NCCL's
/// channels); steps within a channel run in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankProgram {
    /// `channels[c]` is the ordered step list of channel `c`.
    pub channels: Vec<Vec<Step>>,
}

impl Schedule {
    /// Chunks in `buffer` of one rank (saturating at `u32::MAX`; the
    /// verifier refuses schedules that large).
    pub fn buffer_chunks(&self, buffer: Buffer) -> u32 {
        let blocks = match buffer {
            Buffer::Input => self.collective.input_blocks(self.world_size),
            Buffer::Output => self.collective.output_blocks(self.world_size),
            Buffer::Scratch => return self.scratch_chunks,
        };
        blocks.saturating_mul(self.chunks_per_block)
    }

    /// The step at `at`, if it exists.
    pub fn step(&self, at: StepAt) -> Option<&Step> {
        self.ranks
            .get(at.rank as usize)?
            .channels
            .get(at.channel as usize)?
            .get(at.index as usize)
    }

    /// Every step with its position, rank by rank, channel by channel.
    pub fn steps(&self) -> impl Iterator<Item = (StepAt, &Step)> + '_ {
        self.ranks.iter().enumerate().flat_map(|(r, prog)| {
            prog.channels
                .iter()
                .enumerate()
                .flat_map(move |(c, steps)| {
                    steps.iter().enumerate().map(move |(i, s)| {
                        (
                            StepAt {
                                rank: r as Rank,
                                channel: c as u32,
                                index: i as u32,
                            },
                            s,
                        )
                    })
                })
        })
    }

    /// Total number of steps over all ranks and channels.
    pub fn step_count(&self) -> usize {
        self.ranks
            .iter()
            .flat_map(|p| p.channels.iter())
            .map(Vec::len)
            .sum()
    }

    /// Elements of scratch one rank needs for a call of `count` elements
    /// per block (scratch is laid out in blocks, like the buffers).
    pub fn scratch_len(&self, count: usize) -> usize {
        self.scratch_chunks.div_ceil(self.chunks_per_block) as usize * count
    }

    /// The most chunks one step covers (at least 1): a message is at most
    /// this many chunks long, which bounds the chunk size an executor with
    /// fixed-size message buffers may use.
    pub fn widest_step(&self) -> u32 {
        self.steps()
            .map(|(_, s)| s.chunks)
            .max()
            .unwrap_or(1)
            .max(1)
    }

    /// Total number of messages (one per send target of every step).
    pub fn message_count(&self) -> usize {
        self.steps().map(|(_, s)| s.send_to.len()).sum()
    }

    /// Where chunk `chunk` of `buffer` lives on `rank`: the buffer that
    /// holds it and the chunk index there. In place, the input sits inside
    /// the output (or the output inside the input) as the collective
    /// defines; otherwise every buffer is its own.
    pub fn physical(
        &self,
        in_place: bool,
        rank: Rank,
        buffer: Buffer,
        chunk: u32,
    ) -> (Buffer, u32) {
        let cpb = self.chunks_per_block;
        let alias = if in_place {
            self.collective.in_place_alias(rank)
        } else {
            None
        };
        match (buffer, alias) {
            (Buffer::Input, Some(InPlaceAlias::InputIsOutputBlock(b))) => {
                (Buffer::Output, b * cpb + chunk)
            }
            (Buffer::Output, Some(InPlaceAlias::OutputIsInputBlock(b))) => {
                (Buffer::Input, b * cpb + chunk)
            }
            _ => (buffer, chunk),
        }
    }

    /// The largest number of channels any rank uses.
    pub fn channel_count(&self) -> usize {
        self.ranks
            .iter()
            .map(|p| p.channels.len())
            .max()
            .unwrap_or(0)
    }
}
