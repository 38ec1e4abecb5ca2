//! Direct writes: a receiver whose next message on a link only lands in
//! its output (the plan marks such a receive `direct`, with the earliest
//! instruction from which nothing else touches those bytes) *posts* where
//! that output lies in its heap (for threads, its address); the sender of
//! exactly that message claims the post and writes the value there while
//! it reduces — into its own output and the peer's in one pass — and
//! sends a header without payload.
//!
//! A post names the message by its number over the link's life, so a
//! post made too late (the message already on its way) is never taken,
//! and the receiver clears it when it consumes that message either way.
//! One post per link at a time.

use std::collections::HashMap;

use crate::plan::RankPlan;
use crate::types::Rank;

use super::HeapMap;
use super::Links;

/// Instructions a channel looks ahead to post direct-write destinations.
const POST_LOOKAHEAD: usize = 64;

/// One call's numbering of incoming links: message `k` of the call from
/// `peer` on `channel` is number `base + k` on the link.
pub(crate) struct Bases(HashMap<(Rank, u32), u64>);

impl Bases {
    /// Every incoming link's count of consumed messages now, at the start
    /// of a call (every earlier call consumed all its messages).
    pub fn new<L: Links + ?Sized>(t: &L, plan: &RankPlan) -> Self {
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

/// A direct receive this rank may post for: its instruction's index, the
/// earliest index from which it may be posted, and the post itself.
#[derive(Debug, Clone, Copy)]
struct Postable {
    index: u32,
    from: u32,
    peer: Rank,
    seq: u64,
    offset: usize,
    len: usize,
}

/// Every direct receive of one call whose output lies in this rank's
/// heap as one piece, per channel, in instruction order — worked out once
/// per call, so posting while the walk advances costs a few comparisons.
pub(crate) struct Postables(Vec<Vec<Postable>>);

impl Postables {
    pub fn new(
        heaps: &HeapMap,
        plan: &RankPlan,
        bases: &Bases,
        pieces: impl Fn(&crate::plan::Region) -> Vec<(usize, usize)>,
    ) -> Self {
        let per_channel = plan.channels.iter().enumerate().map(|(c, list)| {
            list.iter()
                .enumerate()
                .filter_map(|(i, ins)| {
                    let (from, write) = (ins.direct?, ins.write.as_ref()?);
                    let [m] = ins.recv.as_slice() else {
                        return None;
                    };
                    let [(offset, len)] = heaps.offsets(&pieces(write))?[..] else {
                        return None;
                    };
                    Some(Postable {
                        index: i as u32,
                        from,
                        peer: m.peer,
                        seq: bases.seq(m.peer, c as u32, m.index),
                        offset,
                        len,
                    })
                })
                .collect()
        });
        Postables(per_channel.collect())
    }

    /// Post the destinations of the direct receives channel `channel` may
    /// accept now (it stands at instruction `at`), within the lookahead.
    pub fn post_ahead<L: Links + ?Sized>(&self, t: &mut L, channel: usize, at: u32) {
        let list = &self.0[channel];
        let first = list.partition_point(|p| p.index < at);
        for p in list[first..]
            .iter()
            .take_while(|p| (p.index as usize) < at as usize + POST_LOOKAHEAD)
        {
            if p.from <= at {
                t.post(p.peer, channel as u32, p.seq, p.offset, p.len);
            }
        }
    }
}

/// A call that gives up withdraws its pending posts, and waits (bounded)
/// for a sender that already took one to finish writing — its caller may
/// reuse that memory once the call returns.
pub(crate) fn withdraw_posts<L: Links + ?Sized>(
    t: &mut L,
    bases: &Bases,
    timeout: std::time::Duration,
) {
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
