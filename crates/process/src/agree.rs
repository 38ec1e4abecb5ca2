//! Agreement before data: before any rank writes into another's memory
//! for a call, every rank has announced the same call (number and
//! signature, whose plan hash covers collective, root, count, type, op,
//! algorithm and in place or not).
//!
//! Each rank announces its call to every peer and waits until every peer
//! has announced either the same call or a later one. A later one is
//! enough: a peer only moves on after seeing every rank's announcement of
//! this call equal to its own, ours included. So the first rank to pass
//! compared everyone, and if the signatures differ nobody passes: every
//! rank sees at least one announcement unlike its own and reports
//! [`CommError::Mismatch`] — the announcement stays visible after the rank
//! that found the mismatch fails the group, so none of them reports a
//! mere `PeerFailed`.

use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use crate::transport::Transport;
use crate::wire::Header;

/// How long a rank that finds the group failed mid-agreement keeps
/// looking for the announcement that explains it.
const EXPLAIN_GRACE: Duration = Duration::from_millis(200);

/// The newest announcement seen from each peer.
pub(crate) struct Agreement {
    rank: Rank,
    newest: Vec<Option<Header>>,
}

impl Agreement {
    pub fn new(rank: Rank, world_size: u32) -> Self {
        Agreement {
            rank,
            newest: vec![None; world_size as usize],
        }
    }

    fn peers(&self) -> impl Iterator<Item = Rank> + use<> {
        let rank = self.rank;
        (0..self.newest.len() as Rank).filter(move |&p| p != rank)
    }

    /// Announce call `number` (described by `signature`) and wait until
    /// every rank has made the same call.
    pub fn agree(
        &mut self,
        t: &mut dyn Transport,
        number: u64,
        signature: &str,
        timeout: Duration,
    ) -> Result<(), CommError> {
        // A group that failed before this call hears nothing more from
        // this rank: an announcement now could read as a mismatch to a
        // peer still inside an earlier call.
        if let Err(failed) = t.check() {
            return Err(self.explain(t, number, signature, failed));
        }
        let header = Header::new(number, 0, signature);
        let mut unsent: Vec<Rank> = self.peers().collect();
        let deadline = Instant::now() + timeout;
        loop {
            let seen = t.ticket();
            let mut send_error = None;
            unsent.retain(|&p| match t.announce(p, &header) {
                Ok(sent) => !sent,
                Err(e) => {
                    send_error.get_or_insert(e);
                    true
                }
            });
            // Announcements first: a mismatch must be reported as one even
            // when the rank that found it first has failed the group.
            let missing = self.missing(t, number, signature)?;
            if let Some(e) = send_error {
                return Err(e);
            }
            if let Err(failed) = t.check() {
                return Err(self.explain(t, number, signature, failed));
            }
            if missing.is_empty() && unsent.is_empty() {
                return Ok(());
            }
            self.departed(t, &missing, number, signature)?;
            if Instant::now() >= deadline {
                return Err(CommError::Timeout {
                    rank: self.rank,
                    timeout,
                    what: format!(
                        "ranks {missing:?} to make call #{number} ({signature}); they never arrived"
                    ),
                });
            }
            t.wait(seen, deadline);
        }
    }

    /// The group failed while this rank waited for announcements: if the
    /// failure is a peer's report of this call's mismatch, the disagreeing
    /// announcement is on its way (over TCP it may trail the failure
    /// notice, which travels another connection), so give it a moment and
    /// report the mismatch itself; otherwise the failure.
    fn explain(
        &mut self,
        t: &mut dyn Transport,
        number: u64,
        signature: &str,
        failed: CommError,
    ) -> CommError {
        // Only a peer's mismatch report for this very call is worth the
        // wait (its reason is the mismatch's text); a lost or departed
        // peer is reported at once.
        let about_this_call = matches!(&failed, CommError::PeerFailed { reason, .. }
            if reason.starts_with(&format!("call #{number}:")));
        let grace = if about_this_call {
            EXPLAIN_GRACE
        } else {
            Duration::ZERO
        };
        let until = Instant::now() + grace;
        loop {
            match self.missing(t, number, signature) {
                Err(mismatch) => return mismatch,
                Ok(missing) if missing.is_empty() => return failed,
                Ok(_) if Instant::now() >= until => return failed,
                // Waiting on the transport (not sleeping) lets a transport
                // that reads on the calling thread fetch the announcement.
                Ok(_) => {
                    let seen = t.ticket();
                    t.wait(seen, Instant::now() + Duration::from_millis(2));
                }
            }
        }
    }

    /// The peers that have not announced call `number` yet; `Err` on an
    /// announcement of that call that differs from ours.
    fn missing(
        &mut self,
        t: &mut dyn Transport,
        number: u64,
        signature: &str,
    ) -> Result<Vec<Rank>, CommError> {
        let mut missing = Vec::new();
        for peer in self.peers() {
            let slot = &mut self.newest[peer as usize];
            if let Some(h) = t.announcement(peer)?
                && slot.as_ref().is_none_or(|old| h.call >= old.call)
            {
                *slot = Some(h);
            }
            match slot {
                Some(h) if h.call > number => {}
                Some(h) if h.call == number => {
                    if !h.same_call(number, signature) {
                        return Err(CommError::Mismatch {
                            call: number,
                            rank: self.rank,
                            other: peer,
                            expected: h.signature().to_owned(),
                            got: signature.to_owned(),
                        });
                    }
                }
                _ => missing.push(peer),
            }
        }
        Ok(missing)
    }

    /// `Err` when a peer that has not announced the call is gone (left or
    /// lost): it never will. Announcements are looked at again once a departure
    /// is seen: a peer may have announced the call, finished it and left
    /// since `missing` was taken (its announcement arrives before its
    /// departure), and then it did not leave *before* the call.
    fn departed(
        &mut self,
        t: &mut dyn Transport,
        missing: &[Rank],
        number: u64,
        signature: &str,
    ) -> Result<(), CommError> {
        if !missing.iter().any(|&p| t.departed(p)) {
            return Ok(());
        }
        let still = self.missing(t, number, signature)?;
        match still.iter().find(|&&p| t.departed(p)) {
            Some(&gone) => Err(CommError::PeerFailed {
                rank: gone,
                reason: format!("{} before call #{number} ({signature})", t.farewell(gone)),
            }),
            None => Ok(()),
        }
    }
}
