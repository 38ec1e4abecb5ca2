//! What the frames read off the connections leave behind: queued
//! messages per (sender, channel), credits returned and owed, failures
//! and departures heard of.

use std::collections::{HashMap, VecDeque};

use ferrocoll_core::Rank;

use super::frame::{Frame, protocol_error};
use crate::transport::CONTROL_CHANNEL;
use ferrocoll_core::link::Header;

/// Announcements a peer may have queued here: the agreement lets a rank
/// run at most one call ahead (two announcements), with room to spare.
const MAX_ANNOUNCEMENTS: u64 = 4;

pub(super) struct Message {
    pub header: Header,
    /// `u64`s so the payload is aligned for every element type.
    pub data: Vec<u64>,
}

pub(super) struct Mailbox {
    /// Moves whenever a frame arrives or a connection ends.
    pub ticket: u64,
    pub queues: HashMap<(Rank, u32), VecDeque<Message>>,
    /// Credits each peer returned per outgoing link.
    pub acked: HashMap<(Rank, u32), u64>,
    /// Credits this rank owes each peer per link: messages consumed and
    /// not acknowledged yet (sent with the next frame to that peer, before
    /// this rank sleeps, and when a call ends).
    pub owed: Vec<HashMap<u32, u64>>,
    /// Per peer, the failure it reported: the rank that caused it, why,
    /// and the position it failed at (its first report stands).
    pub failures: Vec<Option<(Rank, String, u64)>>,
    pub departed: Vec<bool>,
    /// Per peer, why it is gone when its connection ended without a
    /// goodbye (or a write to it failed).
    pub lost: Vec<Option<String>>,
    /// This rank is leaving: a connection ending is expected.
    pub closing: bool,
}

impl Mailbox {
    pub fn new(world_size: usize) -> Self {
        Mailbox {
            ticket: 0,
            queues: HashMap::new(),
            acked: HashMap::new(),
            owed: vec![HashMap::new(); world_size],
            failures: vec![None; world_size],
            departed: vec![false; world_size],
            lost: vec![None; world_size],
            closing: false,
        }
    }

    /// Take in one frame from `peer`. `Err` for more unconsumed messages
    /// on a link than its `slots` credits allow (announcements: more than
    /// the agreement ever leaves), which only a broken peer sends.
    pub fn deliver(&mut self, peer: Rank, frame: Frame, slots: u64) -> std::io::Result<()> {
        match frame {
            Frame::Data {
                channel,
                header,
                data,
            } => {
                let queue = self.queues.entry((peer, channel)).or_default();
                let bound = if channel == CONTROL_CHANNEL {
                    MAX_ANNOUNCEMENTS
                } else {
                    slots
                };
                if queue.len() as u64 >= bound {
                    return Err(protocol_error(format!(
                        "more than {bound} unconsumed messages on channel {channel}"
                    )));
                }
                queue.push_back(Message { header, data });
            }
            Frame::Ack { channel, count } => {
                let acked = self.acked.entry((peer, channel)).or_default();
                *acked = acked.saturating_add(count);
            }
            Frame::Fail {
                culprit,
                reason,
                at,
            } => {
                self.failures[peer as usize].get_or_insert((culprit, reason, at));
            }
            Frame::Bye => self.departed[peer as usize] = true,
        }
        self.ticket += 1;
        Ok(())
    }

    /// The connection from `peer` ended with `why`: the peer is lost,
    /// unless it said goodbye first (or failed, or this rank is leaving).
    /// Every frame it sent before is delivered; only calls that wait on it
    /// fail.
    pub fn ended(&mut self, peer: Rank, why: &std::io::Error) {
        self.ticket += 1;
        let p = peer as usize;
        if self.closing || self.departed[p] || self.failures[p].is_some() || self.lost[p].is_some()
        {
            return;
        }
        // A frame no ferrocoll rank sends: the peer is broken, and whatever
        // else it sent cannot be trusted. A failure of the whole group,
        // concerning every call (position 0).
        if why.kind() == std::io::ErrorKind::InvalidData {
            self.failures[p] = Some((peer, format!("lost: {why}"), 0));
            return;
        }
        let why = if matches!(
            why.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
        ) {
            "its connection closed without leaving the group (process killed or crashed)".to_owned()
        } else {
            format!("its connection failed: {why}")
        };
        self.lost[p] = Some(format!("lost: {why}"));
    }

    /// Whether `peer` will never send or consume again.
    pub fn gone(&self, peer: Rank) -> bool {
        self.departed[peer as usize] || self.lost[peer as usize].is_some()
    }

    /// Of the failures peers reported at or before position `here`, the
    /// earliest: the culprit and why.
    pub fn failure_at(&self, here: u64) -> Option<(Rank, String)> {
        self.failures
            .iter()
            .flatten()
            .filter(|(_, _, at)| *at <= here)
            .min_by_key(|(_, _, at)| *at)
            .map(|(rank, reason, _)| (*rank, reason.clone()))
    }

    /// The credits owed to `peer`, taken (the caller sends them).
    pub fn take_owed(&mut self, peer: Rank) -> Vec<(u32, u64)> {
        self.owed[peer as usize].drain().collect()
    }
}
