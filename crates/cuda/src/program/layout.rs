//! Where the protocol's memory lies: the shared *window* every rank sets
//! up once (its inbox, the counters peers write, the words publishing its
//! buffers for the call in progress, its alarm), and the rank's private
//! *state* (the words that carry one call's progress into the next). The
//! kernel and the host rig both address memory through these placements.

use super::abi::BUFFER_WORDS_BYTES;
use super::{MAX_RANKS, ProgramError};

/// What the communicator set up: one inbox ring per (channel, sender).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Ranks.
    pub world_size: u32,
    /// Channels a plan may use.
    pub max_channels: u32,
    /// Slots per link.
    pub slots: u32,
    /// Bytes per slot: the largest message a plan may send (a multiple of
    /// 16, so every slot starts aligned for any element and vector store).
    pub slot_bytes: u64,
    /// Bytes per slot of the small-message (LL) inbox, a multiple of 16
    /// (0: no LL inbox). An LL message of `b` bytes takes `2 · ⌈b/8⌉ · 8`:
    /// each 16-byte line carries 8 bytes of data and two copies of the
    /// message's flag.
    pub ll_slot_bytes: u64,
    /// Whether every rank can address every other rank's buffers (ranks
    /// of one process on one GPU, or on GPUs with peer access): messages
    /// may then stay in the sender's buffer or be stored straight into
    /// the receiver's ([`Transfer`](super::Transfer)); otherwise every
    /// message is staged through a slot.
    pub zero_copy: bool,
}

/// Byte offsets of the parts of a rank's window: memory its peers write
/// (over NVLink/P2P on a GPU) and read. Every part starts 16-byte aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The inbox: slots by (channel, sender, slot), from byte 0.
    pub inbox: u64,
    /// The LL inbox: its slots in the same order.
    pub ll: u64,
    /// `posted` words by (channel, sender): written by the sender.
    pub posted: u64,
    /// `consumed` words by (channel, receiver): written by the receiver.
    pub consumed: u64,
    /// `hello` words by channel: written by the owner, read by peers.
    pub hello: u64,
    /// By channel, the owner's input, output and scratch addresses for
    /// the call in progress (written before that channel's hello).
    pub buffers: u64,
    /// The alarm: set by any rank that fails, so a rank polls one word of
    /// its own memory rather than every rank's on the board.
    pub alarm: u64,
    /// The whole window.
    pub bytes: u64,
}

/// Word indices of a rank's private state, which only its own blocks
/// touch: it carries a call's progress into the next without the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// By channel: the last call the channel ran.
    pub calls: usize,
    /// By channel: `(call << 32) | instructions fired` in that call.
    pub done: usize,
    /// By link word: messages this rank sent on the link, ever.
    pub sent: usize,
    /// By link word: messages it received on the link, ever.
    pub received: usize,
    /// Words in all.
    pub words: usize,
}

impl Layout {
    /// Whether a device can be set up this way: 1..=[`MAX_RANKS`] ranks,
    /// at least one channel and one slot, slots of a positive multiple of
    /// 16 bytes (LL slots a multiple of 16), a window whose size a 64-bit
    /// offset holds. Everything else here assumes it.
    pub fn check(&self) -> Result<(), ProgramError> {
        if self.world_size == 0 || self.world_size > MAX_RANKS {
            return Err(ProgramError::TooLarge(format!(
                "{} ranks; the device tables hold 1..={MAX_RANKS}",
                self.world_size
            )));
        }
        if self.max_channels == 0
            || self.slots == 0
            || self.slot_bytes == 0
            || self.slot_bytes % 16 != 0
            || self.ll_slot_bytes % 16 != 0
        {
            return Err(ProgramError::Slots(format!(
                "{} channels, {} slots of {} bytes (LL: {}): a layout needs a channel, a slot \
                 of a positive multiple of 16 bytes, and LL slots of a multiple of 16",
                self.max_channels, self.slots, self.slot_bytes, self.ll_slot_bytes
            )));
        }
        // Every part of the window, counted wide: it must fit 64-bit
        // offsets (and `link_word`'s 32-bit arithmetic its word count).
        let links = u128::from(self.max_channels) * u128::from(self.world_size);
        let ring = links * u128::from(self.slots);
        let slots = ring * u128::from(self.slot_bytes) + ring * u128::from(self.ll_slot_bytes);
        let words = 2 * 8 * links + u128::from(self.max_channels) * (8 + 2 * 16 + 32) + 64;
        if links > u128::from(u32::MAX) || slots + words > u128::from(u64::MAX) {
            return Err(ProgramError::TooLarge(format!(
                "a window of {} channels x {} ranks x {} slots of {} bytes (LL {}) is past 2^64 bytes",
                self.max_channels, self.world_size, self.slots, self.slot_bytes, self.ll_slot_bytes
            )));
        }
        Ok(())
    }

    /// Index of a per-(channel, peer) word: `posted` by sender, `consumed`
    /// by receiver, `hello` and progress words by channel.
    pub fn link_word(&self, channel: u32, peer: u32) -> usize {
        (channel * self.world_size + peer) as usize
    }

    /// Words of one counter array of a rank.
    pub fn link_words(&self) -> usize {
        (self.max_channels * self.world_size) as usize
    }

    /// Byte offset of a slot in the receiver's inbox.
    pub fn slot_offset(&self, channel: u32, from: u32, slot: u32) -> u64 {
        (u64::from(channel * self.world_size + from) * u64::from(self.slots) + u64::from(slot))
            * self.slot_bytes
    }

    /// Bytes of one rank's inbox.
    pub fn inbox_bytes(&self) -> u64 {
        self.link_words() as u64 * u64::from(self.slots) * self.slot_bytes
    }

    /// Byte offset of a slot in the receiver's LL inbox.
    pub fn ll_slot_offset(&self, channel: u32, from: u32, slot: u32) -> u64 {
        (u64::from(channel * self.world_size + from) * u64::from(self.slots) + u64::from(slot))
            * self.ll_slot_bytes
    }

    /// Bytes of one rank's LL inbox.
    pub fn ll_inbox_bytes(&self) -> u64 {
        self.link_words() as u64 * u64::from(self.slots) * self.ll_slot_bytes
    }

    /// The largest message an LL slot carries: 8 data bytes per 16-byte
    /// line.
    pub fn ll_message_bytes(&self) -> u64 {
        self.ll_slot_bytes / 2
    }

    /// Where the parts of a rank's window lie.
    pub fn window(&self) -> Window {
        let aligned = |bytes: u64| bytes.next_multiple_of(16);
        let links = 8 * self.link_words() as u64;
        let ll = aligned(self.inbox_bytes());
        let posted = ll + aligned(self.ll_inbox_bytes());
        let consumed = posted + aligned(links);
        let hello = consumed + aligned(links);
        let buffers = hello + aligned(8 * u64::from(self.max_channels));
        let alarm = buffers + BUFFER_WORDS_BYTES * u64::from(self.max_channels);
        Window {
            inbox: 0,
            ll,
            posted,
            consumed,
            hello,
            buffers,
            alarm,
            bytes: alarm + 16,
        }
    }

    /// Where the words of a rank's private state lie.
    pub fn state(&self) -> State {
        let channels = self.max_channels as usize;
        let links = self.link_words();
        State {
            calls: 0,
            done: channels,
            sent: 2 * channels,
            received: 2 * channels + links,
            words: 2 * channels + 2 * links,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_of_a_window_and_of_the_state_do_not_overlap() {
        for (world_size, max_channels, slots, slot_bytes, ll_slot_bytes) in [
            (1, 1, 1, 16, 0),
            (3, 2, 2, 48, 32),
            (8, 32, 4, 1 << 20, 16 << 10),
            (64, 3, 5, 16, 16),
        ] {
            let l = Layout {
                world_size,
                max_channels,
                slots,
                slot_bytes,
                ll_slot_bytes,
                zero_copy: true,
            };
            let w = l.window();
            let links = 8 * l.link_words() as u64;
            let parts = [
                (w.inbox, l.inbox_bytes()),
                (w.ll, l.ll_inbox_bytes()),
                (w.posted, links),
                (w.consumed, links),
                (w.hello, 8 * u64::from(max_channels)),
                (w.buffers, BUFFER_WORDS_BYTES * u64::from(max_channels)),
                (w.alarm, 8),
            ];
            for pair in parts.windows(2) {
                assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{l:?}: {w:?}");
            }
            assert!(parts.iter().all(|&(at, _)| at % 16 == 0));
            let (at, bytes) = parts[6];
            assert!(at + bytes <= w.bytes);
            // The last slot of the last link ends where the inbox does.
            let last = l.slot_offset(max_channels - 1, world_size - 1, slots - 1) + slot_bytes;
            assert_eq!(last, l.inbox_bytes());
            if ll_slot_bytes > 0 {
                let last = l.ll_slot_offset(max_channels - 1, world_size - 1, slots - 1);
                assert_eq!(last + ll_slot_bytes, l.ll_inbox_bytes());
            }
            let s = l.state();
            let c = max_channels as usize;
            assert_eq!(
                (s.calls + c, s.done + c, s.sent + l.link_words()),
                (s.done, s.sent, s.received)
            );
            assert_eq!(s.received + l.link_words(), s.words);
        }
    }

    #[test]
    fn layouts_no_device_could_hold_are_typed_errors_not_panics() {
        let fine = Layout {
            world_size: 4,
            max_channels: 2,
            slots: 2,
            slot_bytes: 64,
            ll_slot_bytes: 32,
            zero_copy: false,
        };
        assert!(fine.check().is_ok());
        for bad in [
            Layout { slots: 0, ..fine },
            Layout {
                max_channels: 0,
                ..fine
            },
            Layout {
                world_size: 0,
                ..fine
            },
            Layout {
                world_size: MAX_RANKS + 1,
                ..fine
            },
            Layout {
                slot_bytes: 0,
                ..fine
            },
            Layout {
                slot_bytes: 24,
                ..fine
            },
            Layout {
                ll_slot_bytes: 4,
                ..fine
            },
            Layout {
                slot_bytes: u64::MAX - 15,
                ..fine
            },
            Layout {
                ll_slot_bytes: 1 << 62,
                slots: u32::MAX,
                ..fine
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
