//! Direct writes between processes: a receiver whose next message on a
//! link only lands in its output (the plan marks such a receive `direct`,
//! with the earliest instruction from which nothing else touches those
//! bytes) *posts* where that output lies in its shared heap; the sender
//! of exactly that message claims the post and writes the value there
//! while it reduces — into its own output and the peer's in one pass, the
//! thread executor's direct write — and sends a header without payload.
//!
//! A post names the message by its number over the link's life, so a
//! post made too late (the message already on its way) is never taken,
//! and the receiver clears it when it consumes that message either way.
//! One post per link at a time.

use std::collections::HashMap;

use ferrocoll_core::Rank;
use ferrocoll_core::plan::RankPlan;

use crate::transport::Transport;
use crate::transport::shm::heap::Heaps;

/// Instructions a channel looks ahead to post direct-write destinations.
const POST_LOOKAHEAD: usize = 64;

/// One call's numbering of incoming links: message `k` of the call from
/// `peer` on `channel` is number `base + k` on the link.
pub(crate) struct Bases(HashMap<(Rank, u32), u64>);

impl Bases {
    /// Every incoming link's count of consumed messages now, at the start
    /// of a call (every earlier call consumed all its messages).
    pub fn new(t: &dyn Transport, plan: &RankPlan) -> Self {
        let mut bases = HashMap::new();
        for (c, list) in plan.channels.iter().enumerate() {
            for ins in list {
                for m in &ins.recv {
                    bases
                        .entry((m.peer, c as u32))
                        .or_insert_with(|| t.consumed(m.peer, c as u32));
                }
            }
        }
        Bases(bases)
    }

    /// The link number of the call's message `index` from `peer`.
    pub fn seq(&self, peer: Rank, channel: u32, index: u64) -> u64 {
        self.0
            .get(&(peer, channel))
            .copied()
            .expect("every incoming link of the plan has a base")
            + index
    }
}

/// Post the destinations of the direct receives channel `channel` may
/// accept now (it stands at instruction `at`), where they lie in this
/// rank's heap as one piece.
pub(crate) fn post_ahead(
    t: &mut dyn Transport,
    heaps: &Heaps,
    plan: &RankPlan,
    bases: &Bases,
    channel: usize,
    at: u32,
    pieces: impl Fn(&ferrocoll_core::plan::Region) -> Vec<(usize, usize)>,
) {
    for ins in plan.channels[channel][at as usize..]
        .iter()
        .take(POST_LOOKAHEAD)
    {
        let (Some(from), Some(write)) = (ins.direct, &ins.write) else {
            continue;
        };
        if from > at || ins.recv.len() != 1 {
            continue;
        }
        if let Some([(offset, len)]) = heaps.own.offsets(&pieces(write)).as_deref() {
            let m = &ins.recv[0];
            let seq = bases.seq(m.peer, channel as u32, m.index);
            t.post(m.peer, channel as u32, seq, *offset, *len);
        }
    }
}

/// A call that gives up withdraws its pending posts, and waits (bounded)
/// for a sender that already took one to finish writing — its caller may
/// reuse that memory once the call returns.
pub(crate) fn withdraw_posts(t: &mut dyn Transport, bases: &Bases, timeout: std::time::Duration) {
    let until = std::time::Instant::now() + timeout.min(std::time::Duration::from_secs(2));
    for &(peer, channel) in bases.0.keys() {
        let Some(seq) = t.withdraw_post(peer, channel) else {
            continue;
        };
        // The sender sends the message right after writing it; a sender
        // that gave up gives the post back; one that left writes no more.
        while t.sent_to_me(peer, channel) <= seq
            && t.withdraw_post(peer, channel).is_some()
            && !t.departed(peer)
            && std::time::Instant::now() < until
        {
            let seen = t.ticket();
            t.wait(
                seen,
                until.min(std::time::Instant::now() + std::time::Duration::from_millis(5)),
            );
        }
    }
}
