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
//!
//! An announcement may also offer the shared heap's plan for the call
//! (every message by reference, chunks not bound by the slot size): the
//! call runs on it only when every rank offered it. A peer that has already
//! moved on to the next call no longer shows its offer, but its newer
//! announcement says whether it ran the call on the heap's plan. It can be
//! at most one call ahead: it waits in the next call's agreement for ours.
//! So every rank reaches the same answer.

use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use crate::transport::Transport;
use ferrocoll_core::link::Header;

/// How long a rank that finds the group failed mid-agreement keeps
/// looking for the announcement that explains it.
const EXPLAIN_GRACE: Duration = Duration::from_millis(200);

/// The newest announcement seen from each peer.
pub(crate) struct Agreement {
    rank: Rank,
    newest: Vec<Option<Header>>,
    /// The last call agreed and whether it runs on the heap's plan: the
    /// next announcement says so.
    last: Option<(u64, bool)>,
}

impl Agreement {
    pub fn new(rank: Rank, world_size: u32) -> Self {
        Agreement {
            rank,
            newest: vec![None; world_size as usize],
            last: None,
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
        self.agree_offering(t, number, signature, false, timeout)
            .map(|_| ())
    }

    /// As [`agree`](Self::agree), offering the heap's plan for the call or
    /// not: `Ok(true)` when every rank offered it, and then every rank
    /// runs the call on it.
    pub fn agree_offering(
        &mut self,
        t: &mut dyn Transport,
        number: u64,
        signature: &str,
        offer: bool,
        timeout: Duration,
    ) -> Result<bool, CommError> {
        let ran_heap_plan = number
            .checked_sub(1)
            .is_some_and(|before| self.last == Some((before, true)));
        let header = Header::new(number, 0, signature).announcing(offer, ran_heap_plan);
        self.announce_and_wait(t, number, signature, &header, timeout)?;
        let on_heap = offer && self.everyone_offered(number);
        self.last = Some((number, on_heap));
        Ok(on_heap)
    }

    /// Whether every peer offered the heap's plan for call `number`.
    fn everyone_offered(&self, number: u64) -> bool {
        peers_offered(&self.newest, self.rank, number)
    }

    fn announce_and_wait(
        &mut self,
        t: &mut dyn Transport,
        number: u64,
        signature: &str,
        header: &Header,
        timeout: Duration,
    ) -> Result<(), CommError> {
        // A group that failed before this call hears nothing more from
        // this rank: an announcement now could read as a mismatch to a
        // peer still inside an earlier call.
        if let Err(failed) = t.check() {
            return Err(self.explain(t, number, signature, failed));
        }
        let mut unsent: Vec<Rank> = self.peers().collect();
        let deadline = Instant::now() + timeout;
        loop {
            let seen = t.ticket();
            let mut send_error = None;
            unsent.retain(|&p| match t.announce(p, header) {
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

/// Whether every peer's newest announcement (`newest[peer]`; this rank's
/// own entry is ignored) shows it offered the heap's plan for call
/// `number`: its announcement of that call, or of the next one if it moved
/// on, which says whether it ran the call on the heap's plan. A peer
/// further ahead cannot be (it waits for our next announcement); were it
/// there, `false`, and the first message would show the difference.
fn peers_offered(newest: &[Option<Header>], rank: Rank, number: u64) -> bool {
    newest
        .iter()
        .enumerate()
        .filter(|&(p, _)| p as Rank != rank)
        .all(|(_, h)| match h {
            Some(h) if h.call == number => h.offers_heap_plan(),
            Some(h) if h.call == number + 1 => h.ran_heap_plan(),
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrocoll_core::link::Links;

    fn at(call: u64, offers: bool, ran: bool) -> Option<Header> {
        Some(Header::new(call, 0, "x").announcing(offers, ran))
    }

    #[test]
    fn the_heap_plan_runs_only_if_every_peer_offered_it_for_this_call() {
        let me = None; // this rank's own entry is never read
        assert!(peers_offered(
            &[me.clone(), at(5, true, false), at(5, true, true)],
            0,
            5
        ));
        // One peer did not offer; the flag about call 4 says nothing of 5.
        assert!(!peers_offered(
            &[me.clone(), at(5, true, false), at(5, false, true)],
            0,
            5
        ));
        // A peer that moved on says whether it ran call 5 on the heap's plan.
        assert!(peers_offered(
            &[at(6, true, true), me.clone(), at(5, true, false)],
            1,
            5
        ));
        assert!(!peers_offered(
            &[at(6, true, false), me.clone(), at(5, true, false)],
            1,
            5
        ));
        // Its offer for call 6 is not an answer about call 5.
        assert!(!peers_offered(&[at(6, true, false), me.clone()], 1, 5));
        // Unheard of, or impossibly far ahead: no.
        assert!(!peers_offered(&[me.clone(), None], 0, 5));
        assert!(!peers_offered(&[me.clone(), at(7, true, true)], 0, 5));
        assert!(!peers_offered(&[me, at(4, true, true)], 0, 5));
        // Alone: nobody to disagree.
        assert!(peers_offered(&[None], 0, 5));
    }

    /// Peers' boards set by the test; what this rank announced, kept.
    struct Boards {
        boards: Vec<Option<Header>>,
        posted: Option<Header>,
    }

    // SAFETY: a test double of announcements: it hands out no room, no
    // payload, no heap and no post.
    unsafe impl Links for Boards {
        fn check(&mut self) -> Result<(), CommError> {
            Ok(())
        }

        fn ticket(&self) -> u64 {
            0
        }

        fn wait(&mut self, _seen: u64, _until: std::time::Instant) {}

        fn departed(&mut self, _peer: Rank) -> bool {
            false
        }

        fn reserve(&mut self, _: Rank, _: u32, _: usize) -> Result<Option<*mut u8>, CommError> {
            unreachable!("the agreement announces")
        }

        fn commit(&mut self, _: Rank, _: u32, _: &Header) -> Result<(), CommError> {
            unreachable!("the agreement announces")
        }

        fn peek(
            &mut self,
            _: Rank,
            _: u32,
        ) -> Result<Option<ferrocoll_core::link::Incoming>, CommError> {
            unreachable!("the agreement reads announcements")
        }

        fn peek_header(&mut self, _: Rank, _: u32) -> Option<Header> {
            unreachable!("the agreement reads announcements")
        }

        fn release(&mut self, _: Rank, _: u32) -> Result<(), CommError> {
            unreachable!("the agreement reads announcements")
        }

        fn unconsumed(&mut self, _: Rank, _: u32) -> u64 {
            0
        }

        fn max_channel(&self) -> Option<u32> {
            None
        }

        fn max_message(&self) -> Option<usize> {
            None
        }
    }

    impl Transport for Boards {
        fn announce(&mut self, _to: Rank, header: &Header) -> Result<bool, CommError> {
            self.posted = Some(header.clone());
            Ok(true)
        }

        fn announcement(&mut self, from: Rank) -> Result<Option<Header>, CommError> {
            Ok(self.boards[from as usize].clone())
        }

        fn set_position(&mut self, _: crate::transport::Position) {}

        fn fail(&mut self, _: Rank, _: &str) {}

        fn aborter(&self) -> Box<dyn Fn(&str) + Send + Sync> {
            Box::new(|_| {})
        }

        fn depart(&mut self) {}
    }

    #[test]
    fn a_peer_one_call_ahead_is_read_through_what_it_says_it_ran() {
        let t = std::time::Duration::from_secs(1);
        // Rank 0 of 3: rank 1 shows call 5 itself, rank 2 already call 6.
        let agree = |peer2_ran: bool, offer: bool| {
            let mut boards = Boards {
                boards: vec![None, at(5, true, false), at(6, false, peer2_ran)],
                posted: None,
            };
            let mut a = Agreement::new(0, 3);
            let on_heap = a.agree_offering(&mut boards, 5, "x", offer, t).unwrap();
            // The next call's announcement tells a peer that did not see
            // this one what this rank ran.
            boards.boards = vec![None, at(6, false, on_heap), at(6, false, peer2_ran)];
            assert!(!a.agree_offering(&mut boards, 6, "x", false, t).unwrap());
            let next = boards.posted.expect("announced call 6");
            assert_eq!((next.call, next.ran_heap_plan()), (6, on_heap));
            on_heap
        };
        assert!(agree(true, true));
        assert!(!agree(false, true));
        assert!(!agree(true, false), "this rank did not offer");
        // Call 0 has no call before it; a barrier or one-shot call offers
        // nothing and says so in the next announcement.
        let mut boards = Boards {
            boards: vec![None, at(0, true, true)],
            posted: None,
        };
        let mut a = Agreement::new(0, 2);
        assert!(a.agree_offering(&mut boards, 0, "x", true, t).unwrap());
        assert!(!boards.posted.as_ref().unwrap().ran_heap_plan());
        boards.boards[1] = at(1, false, true);
        a.agree(&mut boards, 1, "x", t).unwrap();
        assert!(
            boards.posted.as_ref().unwrap().ran_heap_plan(),
            "call 0 did"
        );
        boards.boards[1] = at(2, false, false);
        a.agree(&mut boards, 2, "x", t).unwrap();
        assert!(
            !boards.posted.unwrap().ran_heap_plan(),
            "call 1 offered nothing"
        );
    }
}
