//! Point-to-point `send` and `recv` of a process group: a send cut into
//! messages of at most the transport's size on a channel of its own,
//! numbered per peer so a receive of another type or length is a typed
//! error, and complete only once the peer has it.

use std::time::Instant;

use ferrocoll_core::Rank;
use ferrocoll_core::comm::{CommError, HostSlice, HostSliceMut};

use crate::communicator::ProcessCommunicator;
use crate::transport::Transport;
use ferrocoll_core::link::Header;

/// Which point-to-point channel a transport reserves (past every schedule channel).
fn p2p_channel(t: &dyn Transport) -> u32 {
    t.max_channel().unwrap_or(u32::MAX)
}

impl ProcessCommunicator {
    /// Wait until `ready` holds, bounded by the timeout, by peer failure
    /// and by `peer` leaving the group.
    fn wait_until(
        &mut self,
        peer: Rank,
        what: impl Fn() -> String,
        mut ready: impl FnMut(&mut dyn Transport) -> Result<bool, CommError>,
    ) -> Result<(), CommError> {
        let deadline = Instant::now() + self.config.planning.timeout;
        loop {
            let seen = self.transport.ticket();
            if ready(self.transport.as_mut())? {
                return Ok(());
            }
            self.transport.check()?;
            if self.transport.departed(peer) {
                return Err(CommError::PeerFailed {
                    rank: peer,
                    reason: format!(
                        "{} while this rank waited for {}",
                        self.transport.farewell(peer),
                        what()
                    ),
                });
            }
            if Instant::now() >= deadline {
                return Err(CommError::Timeout {
                    rank: self.rank,
                    timeout: self.config.planning.timeout,
                    what: what(),
                });
            }
            self.transport.wait(seen, deadline);
        }
    }

    fn fragment(&self) -> usize {
        self.transport
            .max_message()
            .unwrap_or(self.config.max_message_bytes)
            .max(8)
            / 8
            * 8
    }

    pub(crate) fn send(&mut self, data: HostSlice<'_>, peer: Rank) -> Result<(), CommError> {
        let channel = p2p_channel(self.transport.as_ref());
        let raw = data.as_bytes();
        let bytes = raw.len();
        let number = self.p2p_sent[peer as usize];
        self.p2p_sent[peer as usize] += 1;
        let signature = format!("send #{number} type={}", data.dtype());
        let fragment = self.fragment();
        let pieces: Vec<&[u8]> = if raw.is_empty() {
            vec![raw]
        } else {
            raw.chunks(fragment).collect()
        };
        for piece in pieces {
            let mut room = None;
            self.wait_until(
                peer,
                || format!("room on the link to rank {peer}"),
                |t| {
                    room = t.reserve(peer, channel, piece.len())?;
                    Ok(room.is_some())
                },
            )?;
            let room = room.expect("waited for room");
            // SAFETY: the reserved room holds `piece.len()` bytes and is ours until committed.
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), room, piece.len()) };
            // The header's call field carries the whole send's size, so the
            // receiver can name a length mismatch exactly.
            let header = Header::new(bytes as u64, piece.len(), &signature);
            self.transport.commit(peer, channel, &header)?;
        }
        // Like the other executors: return once the peer has received it.
        self.wait_until(
            peer,
            || format!("rank {peer} to receive a send"),
            |t| Ok(t.unconsumed(peer, channel) == 0),
        )
    }

    pub(crate) fn recv(
        &mut self,
        mut buffer: HostSliceMut<'_>,
        peer: Rank,
    ) -> Result<(), CommError> {
        let channel = p2p_channel(self.transport.as_ref());
        let dtype = buffer.dtype();
        let wanted = buffer.as_bytes_mut().len();
        let number = self.p2p_received[peer as usize];
        self.p2p_received[peer as usize] += 1;
        let signature = format!("send #{number} type={dtype}");
        let out = buffer.as_mut_ptr();
        let mut at = 0usize;
        loop {
            let mut message = None;
            self.wait_until(
                peer,
                || format!("a send from rank {peer}"),
                |t| {
                    message = t.peek(peer, channel)?;
                    Ok(message.is_some())
                },
            )?;
            let m = message.expect("waited for a message");
            let header = self
                .transport
                .peek_header(peer, channel)
                .expect("peeked above");
            // Point to point only values travel; the payload's length is
            // bounded by the slot only for those.
            if !header.holds_value() {
                return Err(CommError::PeerFailed {
                    rank: peer,
                    reason:
                        "protocol error: a point-to-point message by reference or written in place"
                            .into(),
                });
            }
            if header.signature() != Header::new(0, 0, &signature).signature() {
                return Err(CommError::Mismatch {
                    call: number,
                    rank: self.rank,
                    other: peer,
                    expected: header.signature().to_owned(),
                    got: format!("recv #{number} type={dtype}"),
                });
            }
            if m.call as usize != wanted || at + m.len > wanted {
                // In elements, like every other size check (the header
                // said the types agree).
                let size = dtype.size_bytes();
                let e = CommError::BufferSize {
                    what: "recv buffer",
                    got: wanted / size,
                    needed: (m.call as usize).div_ceil(size),
                };
                // The send cannot complete: fail the group (this rank is
                // the culprit) so the sender does not wait out its timeout.
                self.transport.fail(self.rank, &e.to_string());
                return Err(e);
            }
            // SAFETY: the message holds `m.len` bytes until released, and
            // `out + at .. + m.len` lies inside `buffer` (checked above).
            unsafe { std::ptr::copy_nonoverlapping(m.payload, out.add(at), m.len) };
            at += m.len;
            self.transport.release(peer, channel)?;
            if at == wanted {
                return Ok(());
            }
        }
    }
}
