//! The LL protocol on emulated blocks. A 16-byte line of an LL slot is two
//! words, each 4 data bytes with the message's flag in its high half,
//! written and read whole — as the kernel's 16-byte accesses land in
//! 8-byte halves. A reader takes a line once both flags are the message's;
//! nothing else announces the data.

use std::sync::atomic::Ordering;

use ferrocoll_core::comm::CommError;
use ferrocoll_core::types::Reduce;

use super::{Block, Peer};
use crate::program::{Op, Protocol};

impl Block<'_> {
    /// The received messages, each line waited for in the LL inbox.
    pub(super) fn ll_read<T: Reduce>(
        &self,
        op: &Op,
        recv: &[(u32, u64)],
    ) -> Result<Vec<Vec<T>>, CommError> {
        let layout = self.layout();
        let mine = &self.fabric.peers[self.rank as usize];
        let bytes = op.bytes as usize;
        let slots = u64::from(layout.slots);
        recv.iter()
            .map(|&(p, g)| {
                let at = mine.at.ll + layout.ll_slot_offset(self.channel, p, (g % slots) as u32);
                let flag = u64::from(Protocol::ll_flag(g));
                let mut data = vec![0u8; bytes.next_multiple_of(8)];
                for (l, line) in data.chunks_exact_mut(8).enumerate() {
                    let (w0, w1) = (mine.word(at, 2 * l), mine.word(at, 2 * l + 1));
                    self.wait(
                        || {
                            w0.load(Ordering::Relaxed) >> 32 == flag
                                && w1.load(Ordering::Relaxed) >> 32 == flag
                        },
                        "an LL line",
                    )?;
                    // The slot is not rewritten before this rank publishes
                    // `consumed`: the words still hold this message.
                    line[..4].copy_from_slice(&(w0.load(Ordering::Relaxed) as u32).to_le_bytes());
                    line[4..].copy_from_slice(&(w1.load(Ordering::Relaxed) as u32).to_le_bytes());
                }
                Ok(elements(&data[..bytes]))
            })
            .collect()
    }

    /// Put `value` into `peer`'s LL slot for message `g` of this link.
    pub(super) fn ll_write(&self, peer: &Peer, g: u64, value: &[u8]) {
        let layout = self.layout();
        let slot = (g % u64::from(layout.slots)) as u32;
        let at = peer.at.ll + layout.ll_slot_offset(self.channel, self.rank, slot);
        let flag = u64::from(Protocol::ll_flag(g)) << 32;
        for (l, line) in value.chunks(8).enumerate() {
            let mut padded = [0u8; 8];
            padded[..line.len()].copy_from_slice(line);
            let half = |k: usize| {
                u64::from(u32::from_le_bytes(
                    padded[4 * k..4 * k + 4].try_into().expect("4 bytes"),
                ))
            };
            peer.word(at, 2 * l)
                .store(half(0) | flag, Ordering::Relaxed);
            peer.word(at, 2 * l + 1)
                .store(half(1) | flag, Ordering::Relaxed);
        }
    }
}

/// Bytes as elements of `T` (their length a multiple of its size).
fn elements<T: Reduce>(bytes: &[u8]) -> Vec<T> {
    let len = bytes.len() / std::mem::size_of::<T>();
    let mut out: Vec<T> = Vec::with_capacity(len);
    // SAFETY: `out` has room for `len` elements, `len · size` bytes, which
    // `bytes` holds; every `Reduce` type is plain data, valid for any bits.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            out.as_mut_ptr().cast::<u8>(),
            len * std::mem::size_of::<T>(),
        );
        out.set_len(len);
    }
    out
}
