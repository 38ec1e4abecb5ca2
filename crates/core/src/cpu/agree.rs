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
        // SAFETY: only this rank's thread announces for it, call numbers
        // are consecutive, and the previous call's agreement passed (or
        // the group failed, and then `check_before` let nothing through
        // but a call whose mismatch is on the board); `input` points into
        // the caller's buffer, within the one-shot budget.
        unsafe { self.group.posts.announce(me, number, signature, input) };
        for r in (0..n).filter(|&r| r != me) {
            self.group.ring(r);
        }
        let deadline = Instant::now() + self.config.timeout;
        loop {
            let seen = self.group.generation(me);
            let (mut differs, mut arrived) = (false, 0);
            for r in 0..n {
                if let Some(s) = self.group.posts.announced(r, number) {
                    arrived += 1;
                    differs |= s != signature;
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
            let waited = self
                .group
                .wait(me, seen, deadline, never_arrived, self.config.timeout);
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
        let deadline = Instant::now() + self.config.timeout;
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
                // collision could get here.
                Agreement::Agreed => return Ok(()),
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
                self.config.timeout,
            );
            if let Err(e) = waited {
                self.group.agreement(number, self.rank)?;
                return Err(e);
            }
        }
    }
}
