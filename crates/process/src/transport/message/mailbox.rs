//! What the frames a message transport receives leave behind: queued
//! messages per (sender, channel), credits returned and owed, failures
//! and departures heard of.

use std::collections::{HashMap, VecDeque};

use ferrocoll_core::Rank;

use super::frame::{Frame, protocol_error};
use crate::transport::CONTROL_CHANNEL;
use ferrocoll_core::link::{Header, Incoming};

/// Announcements a peer may have queued here: the agreement lets a rank
/// run at most one call ahead (two announcements), with room to spare.
const MAX_ANNOUNCEMENTS: u64 = 4;

pub(crate) struct Message {
    pub header: Header,
    /// `u64`s so the payload is aligned for every element type.
    pub data: Vec<u64>,
    /// The word of `data` the payload starts at.
    pub start: usize,
}

impl Message {
    /// The payload's first byte; stays put while the message is queued
    /// (the vector's buffer does not move).
    pub fn payload(&self) -> *const u8 {
        self.data[self.start..].as_ptr() as *const u8
    }
}

pub(crate) struct Mailbox {
    /// Moves whenever a frame arrives or a connection ends.
    pub ticket: u64,
    pub queues: HashMap<(Rank, u32), VecDeque<Message>>,
    /// Credits each peer returned per outgoing link.
    pub acked: HashMap<(Rank, u32), u64>,
    /// Messages this rank sent per outgoing link (announcements aside).
    pub sent: HashMap<(Rank, u32), u64>,
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
            sent: HashMap::new(),
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
                start,
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
                queue.push_back(Message {
                    header,
                    data,
                    start,
                });
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

    /// The oldest unconsumed message from `from` on `channel`.
    pub fn peek(&self, from: Rank, channel: u32) -> Option<Incoming> {
        self.front(from, channel).map(|m| Incoming {
            call: m.header.call,
            len: m.header.len as usize,
            payload: m.payload(),
        })
    }

    /// Its header.
    pub fn peek_header(&self, from: Rank, channel: u32) -> Option<Header> {
        self.front(from, channel).map(|m| m.header.clone())
    }

    fn front(&self, from: Rank, channel: u32) -> Option<&Message> {
        self.queues.get(&(from, channel)).and_then(|q| q.front())
    }

    /// Consume the oldest message from `from` on `channel`: one credit
    /// owed to it (announcements aside). The message, for its buffer.
    pub fn release(&mut self, from: Rank, channel: u32) -> Option<Message> {
        let popped = self
            .queues
            .get_mut(&(from, channel))
            .and_then(|q| q.pop_front());
        if popped.is_some() && channel != CONTROL_CHANNEL {
            *self.owed[from as usize].entry(channel).or_default() += 1;
        }
        popped
    }

    /// A message went to `to` on `channel`.
    pub fn count_sent(&mut self, to: Rank, channel: u32) {
        if channel != CONTROL_CHANNEL {
            *self.sent.entry((to, channel)).or_default() += 1;
        }
    }

    /// Messages sent to `to` on `channel` it has not returned credit for.
    pub fn unconsumed(&self, to: Rank, channel: u32) -> u64 {
        let sent = self.sent.get(&(to, channel)).copied().unwrap_or(0);
        sent.saturating_sub(self.acked.get(&(to, channel)).copied().unwrap_or(0))
    }

    /// Whether `peer` (a rank of the group) is gone.
    pub fn departed(&self, peer: Rank) -> bool {
        (peer as usize) < self.departed.len() && self.gone(peer)
    }

    /// Why `peer` is gone.
    pub fn farewell(&self, peer: Rank) -> String {
        self.lost
            .get(peer as usize)
            .cloned()
            .flatten()
            .unwrap_or_else(|| "left the group (its communicator was dropped)".to_owned())
    }

    /// The announcements `from` sent since the last look, oldest first.
    pub fn announcements(&mut self, from: Rank) -> impl Iterator<Item = Message> + '_ {
        self.queues
            .get_mut(&(from, CONTROL_CHANNEL))
            .into_iter()
            .flat_map(|q| q.drain(..))
    }

    /// The credits owed to `peer`, taken (the caller sends them).
    pub fn take_owed(&mut self, peer: Rank) -> Vec<(u32, u64)> {
        self.owed[peer as usize].drain().collect()
    }
}
