use super::{RankProgram, Schedule, Step, StepRef};
use crate::types::{Collective, Rank};

/// Assembles a [`Schedule`] step by step; the algorithms use it, and so can
/// anyone writing a schedule in Rust rather than JSON.
#[derive(Debug, Clone)]
pub struct ScheduleBuilder {
    schedule: Schedule,
}

impl ScheduleBuilder {
    /// An empty schedule for `world_size` ranks with `channels` channels each.
    pub fn new(
        name: impl Into<String>,
        collective: Collective,
        world_size: u32,
        chunks_per_block: u32,
        channels: u32,
    ) -> Self {
        let program = RankProgram {
            channels: vec![Vec::new(); channels as usize],
        };
        ScheduleBuilder {
            schedule: Schedule {
                name: name.into(),
                collective,
                world_size,
                chunks_per_block,
                scratch_chunks: 0,
                ranks: vec![program; world_size as usize],
            },
        }
    }

    /// Reserve `chunks` chunks of scratch per rank.
    pub fn scratch_chunks(mut self, chunks: u32) -> Self {
        self.schedule.scratch_chunks = chunks;
        self
    }

    /// Append `step` to `rank`'s `channel`; returns where it landed, for `after`.
    pub fn push(&mut self, rank: Rank, channel: u32, step: Step) -> StepRef {
        let steps = &mut self.schedule.ranks[rank as usize].channels[channel as usize];
        steps.push(step);
        StepRef {
            channel,
            step: steps.len() as u32 - 1,
        }
    }

    /// The finished schedule (unverified).
    pub fn build(self) -> Schedule {
        self.schedule
    }
}
