//! Small calls in one step: the one-shot protocol of
//! `ferrocoll_core::plan::OneShot`, as the threads run it. A rank copies
//! its input into its staging (over shared memory, a half in its own
//! segment that peers map; over TCP, a buffer its announcement of the
//! call carries to every peer) and announces the call; once every rank
//! has announced it, each builds its output from the staged inputs — one
//! announcement and one pass, instead of a message, a wake-up and an
//! acknowledgement per step.
//!
//! Staging half `c % 2` is written again only in call `c + 2`, which a
//! rank starts after passing the agreement of call `c + 1`, which every
//! peer announces only after finishing call `c`; a rank whose call fails
//! is poisoned and never writes its staging again. TCP keeps the inputs
//! peers' announcements carried by the same parity.

use std::sync::Arc;
use std::time::Instant;

use ferrocoll_core::Rank;
use ferrocoll_core::Reduce;
use ferrocoll_core::comm::{CommError, HostSlice, HostSliceMut};
use ferrocoll_core::plan::{OneShot, one_shot_describe};
use ferrocoll_core::types::{Buffer, CallShape};

use crate::ProcessCommunicator;

impl ProcessCommunicator {
    /// Whether `shape` takes the one-shot protocol: small enough for the
    /// rule, and the transport has the staging (the same answer on every
    /// rank, whose settings are the same).
    pub(crate) fn one_shot(&self, shape: &CallShape) -> bool {
        let n = self.n;
        let rule = self.planner.settings().one_shot_rule(n);
        rule.applies(shape, n)
            && self
                .transport
                .staging(self.rank, 0)
                .is_some_and(|(_, room)| room >= rule.staging_bytes(n))
    }

    pub(crate) fn run_one_shot(
        &mut self,
        shape: &CallShape,
        input: Option<HostSlice<'_>>,
        mut output: HostSliceMut<'_>,
    ) -> Result<(), CommError> {
        // No health check first: the agreement does it, and explains a
        // failure that is a peer's report of this very call's mismatch.
        let number = self.calls;
        self.calls += 1;
        let (n, rank) = (self.n, self.rank);
        let memo = match &self.one_shot_memo {
            Some((cached, memo)) if cached == shape => memo.clone(),
            _ => {
                let memo = Arc::new((OneShot::new(shape, n, rank), one_shot_describe(shape)));
                self.one_shot_memo = Some((*shape, memo.clone()));
                memo
            }
        };
        let (shot, signature) = (&memo.0, memo.1.as_str());
        self.recorder().planned(number, "one-shot", None);
        let output_base = output.as_mut_ptr() as usize;
        let input_base = input.map_or(output_base, |i| i.as_ptr() as usize);
        let from = match shot.input_buffer {
            Buffer::Input => input_base,
            _ => output_base,
        } + shot.input_offset as usize;
        let (mine, room) = self
            .transport
            .staging(rank, number)
            .expect("checked by one_shot");
        let bytes = shot.input_bytes as usize;
        assert!(bytes <= room, "the rule sized the staging");
        // SAFETY: `from` is the caller's input (`bytes` long, checked by
        // `Call::check`); this half of our staging is ours to write (module
        // docs) and holds `room >= bytes`.
        unsafe { std::ptr::copy_nonoverlapping(from as *const u8, mine, bytes) };
        self.transport.stage(number, bytes);
        let started = Instant::now();
        self.agreement.agree(
            self.transport.as_mut(),
            number,
            signature,
            self.config.planning.timeout,
        )?;
        tracing::debug!(
            rank,
            call = number,
            transport = %self.config.transport,
            "{} {} B {}: protocol=one-shot ({n} ranks x {bytes} B published)",
            shape.collective,
            shape.size_bytes(n),
            shape.dtype,
        );
        let staged = self.staged_inputs(shot, number)?;
        ferrocoll_core::with_element_type!(shape.dtype, T => {
            // SAFETY: every rank announced this one-shot call, so each
            // peer's staged input (checked to hold `bytes`) stays until it
            // announces call `number + 2`, which waits for our next
            // announcement.
            unsafe {
                let staged = |r: Rank| staged[r as usize];
                shot.build_output(staged, output_base, (shape.op, n), T::reduce, T::divide)
            };
        });
        self.one_shot_calls += 1;
        tracing::trace!(
            rank,
            call = number,
            elapsed_us = started.elapsed().as_micros() as u64,
            "done"
        );
        Ok(())
    }

    /// Where every rank's input for one-shot call `number` lies here, each
    /// checked to hold what `shot` reads of it: a peer whose announcement
    /// carried less (or nothing) broke the protocol, and is named instead
    /// of read past.
    fn staged_inputs(&self, shot: &OneShot, number: u64) -> Result<Vec<*const u8>, CommError> {
        let needed = shot.read_extents(self.n);
        (0..self.n as Rank)
            .map(|r| {
                let need = needed[r as usize] as usize;
                match self.transport.staging(r, number) {
                    Some((at, room)) if room >= need => Ok(at.cast_const()),
                    other => Err(CommError::PeerFailed {
                        rank: r,
                        reason: format!(
                            "protocol error: call #{number} reads {need} bytes of its one-shot input, it published {}",
                            other.map_or(0, |(_, room)| room)
                        ),
                    }),
                }
            })
            .collect()
    }
}
