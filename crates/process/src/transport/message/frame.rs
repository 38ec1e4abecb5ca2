//! The frames of the message transports (TCP, MPI) on the wire, and the checks that trust none
//! of their fields: a 16-byte prefix (kind, channel, length), then for
//! data the message header and payload, for credits their count, for a
//! failure the position it happened at (u64 LE) and its reason (the
//! prefix's channel field names the culprit).

use ferrocoll_core::Rank;

use ferrocoll_core::link::{HEADER_BYTES, Header};

pub(crate) const DATA: u32 = 1;
pub(crate) const ACK: u32 = 2;
pub(crate) const FAIL: u32 = 3;
pub(crate) const BYE: u32 = 4;
pub(crate) const PREFIX_BYTES: usize = 16;
/// An ack frame's body: how many credits it returns.
pub(crate) const ACK_BYTES: usize = 8;
/// The longest failure reason sent to peers.
pub(crate) const MAX_REASON: usize = 4096;
/// A failure frame's body before its reason: the position it happened at.
pub(crate) const FAIL_AT_BYTES: usize = 8;
/// Channel numbers a data or ack frame may carry (besides the
/// point-to-point channel, `u32::MAX`): far more than any schedule uses,
/// few enough that a peer cannot grow the per-channel queues without bound.
pub(crate) const MAX_WIRE_CHANNELS: u32 = 1 << 16;

/// One frame, read and checked.
#[derive(Debug)]
pub(crate) enum Frame {
    /// A message on `channel`.
    Data {
        channel: u32,
        header: Header,
        /// The payload, in `u64`s so it is aligned for every element type,
        /// from word `start` on (a transport that receives a whole frame
        /// into one buffer leaves the prefix and header in front).
        data: Vec<u64>,
        start: usize,
    },
    /// `count` credits returned on `channel`.
    Ack { channel: u32, count: u64 },
    /// The peer failed because `culprit` did, at position `at`.
    Fail {
        culprit: Rank,
        reason: String,
        at: u64,
    },
    /// The peer left cleanly.
    Bye,
}

/// A frame's prefix, checked: what follows it and how long it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prefix {
    pub kind: u32,
    pub channel: u32,
    /// Bytes after the prefix.
    pub len: usize,
}

pub(crate) fn protocol_error(what: String) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("protocol error: {what}"),
    )
}

/// Whether a channel number read off the wire is one a peer may use: a
/// schedule channel, or the point-to-point channel (the communicator's
/// `p2p_channel` is `u32::MAX` on a transport without `max_channel`).
pub(crate) fn channel_ok(channel: u32) -> bool {
    channel < MAX_WIRE_CHANNELS || channel == u32::MAX
}

/// The prefix of a frame of `kind` on `channel` with `len` bytes after it.
pub(crate) fn encode_prefix(kind: u32, channel: u32, len: usize) -> [u8; PREFIX_BYTES] {
    let mut prefix = [0u8; PREFIX_BYTES];
    prefix[0..4].copy_from_slice(&kind.to_le_bytes());
    prefix[4..8].copy_from_slice(&channel.to_le_bytes());
    prefix[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    prefix
}

/// Check a prefix read off the wire before anything it announces is
/// read or allocated: a known kind, a length that fits its kind and
/// `max_payload`, a channel a peer may use.
pub(crate) fn parse_prefix(
    bytes: &[u8; PREFIX_BYTES],
    max_payload: usize,
) -> std::io::Result<Prefix> {
    let [k0, k1, k2, k3, c0, c1, c2, c3, l @ ..] = *bytes;
    let kind = u32::from_le_bytes([k0, k1, k2, k3]);
    let channel = u32::from_le_bytes([c0, c1, c2, c3]);
    let len = u64::from_le_bytes(l);
    let fits = match kind {
        DATA => {
            (HEADER_BYTES as u64..=HEADER_BYTES.saturating_add(max_payload) as u64).contains(&len)
        }
        ACK => len == ACK_BYTES as u64,
        FAIL => (FAIL_AT_BYTES as u64..=(FAIL_AT_BYTES + MAX_REASON) as u64).contains(&len),
        BYE => len == 0,
        other => return Err(protocol_error(format!("unknown frame kind {other}"))),
    };
    if !fits {
        return Err(protocol_error(format!(
            "frame kind {kind} announces {len} bytes"
        )));
    }
    if matches!(kind, DATA | ACK) && !channel_ok(channel) {
        return Err(protocol_error(format!(
            "frame kind {kind} on channel {channel} (at most {MAX_WIRE_CHANNELS})"
        )));
    }
    Ok(Prefix {
        kind,
        channel,
        len: len as usize,
    })
}

/// A data frame's header, checked against the payload its prefix
/// announced.
pub(crate) fn data_header(prefix: &Prefix, bytes: &[u8; HEADER_BYTES]) -> std::io::Result<Header> {
    let header = Header::decode(bytes);
    let payload = prefix.len - HEADER_BYTES;
    if header.len != payload as u64 {
        return Err(protocol_error(format!(
            "a {payload}-byte payload whose header says {}",
            header.len
        )));
    }
    Ok(header)
}

/// An aligned buffer for `bytes` payload bytes.
pub(crate) fn payload_buffer(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8)]
}

/// The first `len` bytes of `data`, as bytes to fill.
pub(crate) fn payload_bytes(data: &mut [u64], len: usize) -> &mut [u8] {
    assert!(len <= data.len() * 8);
    // SAFETY: viewing the u64 buffer's first `len` bytes (checked above)
    // as bytes; any byte pattern is a valid u64.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut u8, len) }
}

/// All of `data`'s bytes.
#[cfg(test)]
pub(crate) fn payload_bytes_of(data: &[u64]) -> &[u8] {
    // SAFETY: viewing a live u64 buffer as its bytes.
    unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, data.len() * 8) }
}

/// Decode a whole frame whose body (`prefix.len` bytes) is in `body`.
pub(crate) fn decode(prefix: &Prefix, body: &[u8], world_size: u32) -> std::io::Result<Frame> {
    debug_assert_eq!(body.len(), prefix.len);
    match prefix.kind {
        DATA => {
            let (head, payload) = body.split_at(HEADER_BYTES);
            let header = data_header(prefix, head.try_into().expect("split at the header"))?;
            let mut data = payload_buffer(payload.len());
            payload_bytes(&mut data, payload.len()).copy_from_slice(payload);
            Ok(Frame::Data {
                channel: prefix.channel,
                header,
                data,
                start: 0,
            })
        }
        ACK => {
            let count = u64::from_le_bytes(body.try_into().expect("checked length"));
            if count == 0 {
                return Err(protocol_error("an ack returning no credit".into()));
            }
            Ok(Frame::Ack {
                channel: prefix.channel,
                count,
            })
        }
        FAIL => {
            let culprit = prefix.channel;
            if culprit >= world_size {
                return Err(protocol_error(format!(
                    "a failure blamed on rank {culprit} of a {world_size}-rank group"
                )));
            }
            let (at, reason) = body.split_at(FAIL_AT_BYTES);
            Ok(Frame::Fail {
                culprit,
                // A peer's text: shown, never obeyed by a terminal.
                reason: ferrocoll_core::comm::printable(&String::from_utf8_lossy(reason)),
                at: u64::from_le_bytes(at.try_into().expect("split at the position")),
            })
        }
        _ => Ok(Frame::Bye),
    }
}
