//! Agreement on threads: announce the call on the board, wait until every
//! rank has announced the same one; when announcements differ, the call
//! board names the difference.

use std::time::Instant;

use super::CpuCommunicator;
use super::group::Agreement;
use crate::comm::CommError;

impl CpuCommunicator {
    /// Announce call `number` (with `signature`; a one-shot call also
    /// publishes its input) and wait until every rank has announced the
    /// same call: no data moves before the whole group agrees. When the
    /// announcements differ, the call board names the difference: every
    /// rank sees some peer differ, so every rank registers `what`.
    pub(super) fn agree(
        &self,
        number: u64,
        signature: u64,
        input: Option<(*const u8, usize)>,
        what: &dyn Fn() -> String,
    ) -> Result<(), CommError> {
        let (n, me) = (self.group.n, self.rank);
        // After an error that left the group usable (a peer that left),
        // this rank may be a call ahead of a peer still reading its
        // previous staging half: wait until every peer has announced the
        // previous call, which it does only after finishing the one
        // before — the board's invariant. On the normal path the
        // previous agreement already saw that, and this is one scan.
        if let Some(previous) = number.checked_sub(1) {
            let earlier = || {
                format!(
                    "the end of call #{previous}, before call #{number} ({})",
                    what()
                )
            };
            self.await_posts(previous, None, &earlier)?;
        }
        // SAFETY: only this rank's thread announces for it, call numbers
        // are consecutive, and every peer has announced the previous call
        // (just checked), so none still reads the half this call writes;
        // `input` points into the caller's buffer, within the one-shot
        // budget.
        unsafe { self.group.posts.announce(me, number, signature, input) };
        for r in (0..n).filter(|&r| r != me) {
            self.group.ring(r);
        }
        self.await_posts(number, Some(signature), what)
    }

    /// Wait until every rank has announced call `number` — with
    /// `signature`, when given (a different one is a mismatch).
    fn await_posts(
        &self,
        number: u64,
        signature: Option<u64>,
        what: &dyn Fn() -> String,
    ) -> Result<(), CommError> {
        let (n, me) = (self.group.n, self.rank);
        let deadline = Instant::now() + self.config.planning.timeout;
        loop {
            let seen = self.group.generation(me);
            let (mut differs, mut arrived) = (false, 0);
            for r in 0..n {
                if let Some(s) = self.group.posts.announced(r, number) {
                    arrived += 1;
                    differs |= signature.is_some_and(|mine| s != mine);
                }
            }
            if differs {
                return self.name_mismatch(number, &what());
            }
            if arrived == n {
                return Ok(());
            }
            let missing = super::oneshot::missing(&self.group.posts, number, n);
            if let Err(failed) = self.group.check() {
                // The failure may be a peer's report of this very call's
                // mismatch: report the mismatch itself on this rank too.
                if self.group.has_conflict(number) {
                    return self.name_mismatch(number, &what());
                }
                return Err(failed);
            }
            let posts = &self.group.posts;
            self.group.departed_among(&missing, number, &what(), |r| {
                posts.announced(r, number).is_none()
            })?;
            let never_arrived = || {
                format!(
                    "ranks {missing:?} to make call #{number} ({}); they never arrived",
                    what()
                )
            };
            let waited = self.group.wait(
                me,
                seen,
                deadline,
                never_arrived,
                self.config.planning.timeout,
            );
            if let Err(e) = waited {
                if self.group.has_conflict(number) {
                    return self.name_mismatch(number, &what());
                }
                return Err(e);
            }
        }
    }

    /// Register call `number` as `what` on the call board and wait until
    /// every rank has: the board reports which rank called what.
    fn name_mismatch(&self, number: u64, what: &str) -> Result<(), CommError> {
        self.group.register_call(number, self.rank, what)?;
        let deadline = Instant::now() + self.config.planning.timeout;
        let never_arrived = || match self.group.agreement(number, self.rank) {
            Ok(Agreement::Waiting(missing)) => {
                format!("ranks {missing:?} to make call #{number} ({what}); they never arrived")
            }
            _ => format!("every rank to make call #{number} ({what})"),
        };
        loop {
            let seen = self.group.generation(self.rank);
            let missing = match self.group.agreement(number, self.rank)? {
                // Different signatures, same description: only a hash
                // collision gets here; the calls may still differ.
                Agreement::Agreed => {
                    return Err(CommError::Mismatch {
                        call: number,
                        rank: self.rank,
                        other: self.rank,
                        expected: what.to_owned(),
                        got: "a call with the same description but another signature".to_owned(),
                    });
                }
                Agreement::Waiting(missing) => missing,
            };
            if let Err(failed) = self.group.check() {
                self.group.agreement(number, self.rank)?;
                return Err(failed);
            }
            self.group.departed_among(&missing, number, what, |r| {
                !self.group.registered(number, r)
            })?;
            let waited = self.group.wait(
                self.rank,
                seen,
                deadline,
                never_arrived,
                self.config.planning.timeout,
            );
            if let Err(e) = waited {
                self.group.agreement(number, self.rank)?;
                return Err(e);
            }
        }
    }
}
