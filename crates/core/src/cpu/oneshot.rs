//! A one-shot call on threads: publish the input with the announcement,
//! then build this rank's output from the inputs its peers published on
//! the board (see
//! [`crate::plan::OneShot`] for what, [`super::board`] for why the reads
//! are safe without a lock).

use std::sync::Arc;

use super::CpuCommunicator;
use super::board::Board;
use crate::comm::{CommError, HostSlice, HostSliceMut};
use crate::kernels::Reduce;
use crate::plan::{OneShot, one_shot_describe};
use crate::types::{Buffer, CallShape, Rank};

impl CpuCommunicator {
    /// A call small enough for the one-shot protocol: the input travels
    /// with the announcement, and the output is built in one pass.
    pub(super) fn run_one_shot(
        &mut self,
        number: u64,
        shape: &CallShape,
        input: Option<HostSlice<'_>>,
        mut output: HostSliceMut<'_>,
    ) -> Result<(), CommError> {
        let n = self.group.n;
        let shot = match &self.one_shot {
            Some((cached, shot)) if cached == shape => shot.clone(),
            _ => {
                let shot = Arc::new(OneShot::new(shape, n, self.rank));
                self.one_shot = Some((*shape, shot.clone()));
                shot
            }
        };
        let output_base = output.as_mut_ptr() as usize;
        let input_base = input.map_or(output_base, |i| i.as_ptr() as usize);
        let base = match shot.input_buffer {
            Buffer::Input => input_base,
            _ => output_base,
        };
        let published = (
            (base + shot.input_offset as usize) as *const u8,
            shot.input_bytes as usize,
        );
        self.agree(number, shot.signature, Some(published), &|| {
            one_shot_describe(shape)
        })?;
        self.recorder()
            .planned(number, "one-shot", Some(shot.signature));
        tracing::debug!(
            rank = self.rank,
            call = number,
            kernels = %crate::kernels::chosen(),
            "{} {} B {}: protocol=one-shot ({n} ranks x {} B published <= {} B budget)",
            shape.collective,
            shape.size_bytes(n),
            shape.dtype,
            shot.input_bytes,
            self.group.one_shot.budget(),
        );
        crate::with_element_type!(shape.dtype, T => {
            // SAFETY: every rank announced this call in one-shot form (the
            // agreement passed) and this rank announces nothing more until
            // it returns; `output` is the caller's, exclusively borrowed,
            // and the staging is the group's own memory.
            unsafe {
                let posts = &self.group.posts;
                let staged = |r| posts.staged(r, number);
                shot.build_output(staged, output_base, (shape.op, n), T::reduce, T::divide)
            };
        });
        Ok(())
    }
}

/// The ranks that have not announced call `call` yet, those that stopped
/// earliest first (a rank that left is then blamed before the ones that
/// stopped because of it).
pub(crate) fn missing(posts: &Board, call: u64, world: u32) -> Vec<Rank> {
    // Read each rank's progress once: it moves while we look, and a sort
    // whose keys change under it has no order to find.
    let mut missing: Vec<(u64, Rank)> = (0..world)
        .filter(|&r| posts.announced(r, call).is_none())
        .map(|r| (posts.progress(r), r))
        .collect();
    missing.sort_unstable();
    missing.into_iter().map(|(_, r)| r).collect()
}
