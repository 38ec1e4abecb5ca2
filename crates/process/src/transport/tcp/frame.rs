//! The TCP transport's frames on the wire, and the reader that trusts
//! none of their fields: a 16-byte prefix (kind, channel, length), then
//! for data the message header and payload, for a failure its culprit and
//! reason.

use std::io::Read;

use ferrocoll_core::Rank;

use crate::wire::{HEADER_BYTES, Header};

pub(super) const DATA: u32 = 1;
pub(super) const ACK: u32 = 2;
pub(super) const FAIL: u32 = 3;
pub(super) const BYE: u32 = 4;
pub(super) const PREFIX_BYTES: usize = 16;
/// The longest failure reason sent to peers.
pub(super) const MAX_REASON: usize = 4096;
/// Channel numbers a data or ack frame may carry (besides the
/// point-to-point channel, `u32::MAX`): far more than any schedule uses,
/// few enough that a peer cannot grow the per-channel queues without bound.
pub(crate) const MAX_WIRE_CHANNELS: u32 = 1 << 16;

/// One frame, read and checked.
#[derive(Debug)]
pub(super) enum Frame {
    /// A message on `channel`.
    Data {
        channel: u32,
        header: Header,
        /// The payload, in `u64`s so it is aligned for every element type.
        data: Vec<u64>,
    },
    /// One credit returned on `channel`.
    Ack { channel: u32 },
    /// The peer failed because `culprit` did.
    Fail { culprit: Rank, reason: String },
    /// The peer left cleanly.
    Bye,
}

pub(super) fn protocol_error(what: String) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("protocol error: {what}"),
    )
}

/// Whether a channel number read off the wire is one a peer may use: a
/// schedule channel, or the point-to-point channel (the communicator's
/// `p2p_channel` is `u32::MAX` on a transport without `max_channel`).
fn channel_ok(channel: u32) -> bool {
    channel < MAX_WIRE_CHANNELS || channel == u32::MAX
}

/// Read one frame. Every field from the wire is checked before it is
/// trusted — lengths against their kind and `max_payload`, channels against
/// [`MAX_WIRE_CHANNELS`], a failure's culprit against `world_size`, a data
/// header against its payload — so a garbled or hostile stream is an
/// `InvalidData` error, never a huge allocation, an out-of-range index or a
/// panic.
pub(super) fn read_frame(
    r: &mut impl Read,
    max_payload: usize,
    world_size: u32,
) -> std::io::Result<Frame> {
    let mut prefix = [0u8; PREFIX_BYTES];
    r.read_exact(&mut prefix)?;
    let [k0, k1, k2, k3, c0, c1, c2, c3, l @ ..] = prefix;
    let kind = u32::from_le_bytes([k0, k1, k2, k3]);
    let channel = u32::from_le_bytes([c0, c1, c2, c3]);
    let len = u64::from_le_bytes(l);
    let fits = match kind {
        DATA => (HEADER_BYTES as u64..=(HEADER_BYTES + max_payload) as u64).contains(&len),
        FAIL => len <= MAX_REASON as u64,
        ACK | BYE => len == 0,
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
    let len = len as usize;
    match kind {
        DATA => read_data(r, channel, len - HEADER_BYTES),
        ACK => Ok(Frame::Ack { channel }),
        FAIL => read_fail(r, channel, len, world_size),
        _ => Ok(Frame::Bye),
    }
}

fn read_data(r: &mut impl Read, channel: u32, payload: usize) -> std::io::Result<Frame> {
    let mut header = [0u8; HEADER_BYTES];
    r.read_exact(&mut header)?;
    let header = Header::decode(&header);
    if header.len != payload as u64 {
        return Err(protocol_error(format!(
            "a {payload}-byte payload whose header says {}",
            header.len
        )));
    }
    let mut data = vec![0u64; payload.div_ceil(8)];
    // SAFETY: viewing the u64 buffer's first `payload` bytes as bytes; it
    // holds at least that many, and any byte pattern is a valid u64.
    let bytes = unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut u8, payload) };
    r.read_exact(bytes)?;
    Ok(Frame::Data {
        channel,
        header,
        data,
    })
}

/// A fail frame's channel field names the rank that caused the failure.
fn read_fail(
    r: &mut impl Read,
    culprit: u32,
    len: usize,
    world_size: u32,
) -> std::io::Result<Frame> {
    if culprit >= world_size {
        return Err(protocol_error(format!(
            "a failure blamed on rank {culprit} of a {world_size}-rank group"
        )));
    }
    let mut reason = vec![0u8; len];
    r.read_exact(&mut reason)?;
    Ok(Frame::Fail {
        culprit,
        reason: String::from_utf8_lossy(&reason).into_owned(),
    })
}

/// Feed `data` to the frame reader as if it came from a peer of a 4-rank
/// group with 4 KiB messages, until it errs. The fuzz target's entry point.
#[doc(hidden)]
pub fn fuzz_frames(data: &[u8]) {
    let mut r = data;
    while let Ok(frame) = read_frame(&mut r, 4096, 4) {
        match frame {
            Frame::Data { header, data, .. } => {
                assert!(header.len as usize <= 4096 && data.len() * 8 >= header.len as usize);
                let _ = header.signature();
            }
            Frame::Fail { culprit, reason } => {
                assert!(culprit < 4 && reason.len() <= 3 * MAX_REASON)
            }
            Frame::Ack { channel } => assert!(channel_ok(channel)),
            Frame::Bye => {}
        }
    }
}
