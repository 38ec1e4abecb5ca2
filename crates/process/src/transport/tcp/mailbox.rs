//! What the frames read off the connections leave behind: queued
//! messages per (sender, channel), credits returned and owed, failures
//! and departures heard of.

use std::collections::{HashMap, VecDeque};

use ferrocoll_core::Rank;

use super::frame::{Frame, protocol_error};
use crate::transport::CONTROL_CHANNEL;
use crate::wire::Header;

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
    /// The first peer failure heard of (with the rank that caused it).
    pub failure: Option<(Rank, String)>,
    pub departed: Vec<bool>,
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
            failure: None,
            departed: vec![false; world_size],
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
            Frame::Fail { culprit, reason } => {
                self.failure.get_or_insert((culprit, reason));
            }
            Frame::Bye => self.departed[peer as usize] = true,
        }
        self.ticket += 1;
        Ok(())
    }

    /// The connection from `peer` ended with `why`: a loss, unless the
    /// peer said goodbye first or this rank is leaving.
    pub fn ended(&mut self, peer: Rank, why: &std::io::Error) {
        self.ticket += 1;
        if self.closing || self.departed[peer as usize] || self.failure.is_some() {
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
        self.failure = Some((peer, format!("lost: {why}")));
    }

    /// The credits owed to `peer`, taken (the caller sends them).
    pub fn take_owed(&mut self, peer: Rank) -> Vec<(u32, u64)> {
        self.owed[peer as usize].drain().collect()
    }
}
