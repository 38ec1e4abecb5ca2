//! Frames out of a non-blocking byte stream, as they arrive: one read
//! fetches every small frame the socket holds (a buffer in between), and
//! a payload too large for that buffer is read straight into its own
//! allocation, so a large message costs no extra copy.
//!
//! Every prefix is checked (`frame::parse_prefix`) before the bytes it
//! announces are waited for or allocated, so a hostile length is an error
//! at once, never a huge allocation.

use std::io::{ErrorKind, Read};

use crate::transport::message::frame::{self, Frame, PREFIX_BYTES, Prefix};
use ferrocoll_core::link::{HEADER_BYTES, Header};

/// The buffer small frames are read through; larger data frames bypass it.
const BUFFER_BYTES: usize = 64 << 10;

/// A data frame whose payload is being read straight into place.
struct Large {
    channel: u32,
    header: Header,
    data: Vec<u64>,
    len: usize,
    filled: usize,
}

/// One connection's incoming side.
pub(super) struct Inflow {
    buf: Box<[u8]>,
    lo: usize,
    hi: usize,
    large: Option<Large>,
    max_payload: usize,
    world_size: u32,
}

/// What one step of parsing the buffer found.
enum Parsed {
    Frame(Frame),
    Large(Large),
}

impl Inflow {
    pub fn new(max_payload: usize, world_size: u32) -> Self {
        Inflow {
            // Allocated on first use: a large group holds many idle links.
            buf: Box::default(),
            lo: 0,
            hi: 0,
            large: None,
            max_payload,
            world_size,
        }
    }

    /// Read everything `r` has now (until it would block) and hand each
    /// complete frame to `deliver`. `Err` when the stream ended (an
    /// `UnexpectedEof`, also between frames), failed, or broke the protocol.
    pub fn pump(
        &mut self,
        r: &mut impl Read,
        mut deliver: impl FnMut(Frame) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if self.buf.is_empty() {
            self.buf = vec![0u8; BUFFER_BYTES].into_boxed_slice();
        }
        loop {
            if let Some(large) = &mut self.large {
                let rest = &mut frame::payload_bytes(&mut large.data, large.len)[large.filled..];
                match read_some(r, rest)? {
                    None => return Ok(()),
                    Some(k) => large.filled += k,
                }
                if large.filled == large.len {
                    let done = self.large.take().expect("just filled");
                    deliver(Frame::Data {
                        channel: done.channel,
                        header: done.header,
                        data: done.data,
                        start: 0,
                    })?;
                }
                continue;
            }
            while let Some(parsed) = self.parse_one()? {
                match parsed {
                    Parsed::Frame(f) => deliver(f)?,
                    Parsed::Large(l) => {
                        self.large = Some(l);
                        break;
                    }
                }
            }
            if self.large.is_some() {
                continue;
            }
            self.buf.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
            match read_some(r, &mut self.buf[self.hi..])? {
                None => return Ok(()),
                Some(k) => self.hi += k,
            }
        }
    }

    /// The next frame whole in the buffer; a data frame too large for it
    /// once its header is in; `None` while more bytes are needed.
    fn parse_one(&mut self) -> std::io::Result<Option<Parsed>> {
        let avail = &self.buf[self.lo..self.hi];
        let Some(head) = avail.first_chunk::<PREFIX_BYTES>() else {
            return Ok(None);
        };
        let prefix = frame::parse_prefix(head, self.max_payload)?;
        let total = PREFIX_BYTES + prefix.len;
        if avail.len() >= total {
            let f = frame::decode(&prefix, &avail[PREFIX_BYTES..total], self.world_size)?;
            self.lo += total;
            return Ok(Some(Parsed::Frame(f)));
        }
        if total <= self.buf.len() || avail.len() < PREFIX_BYTES + HEADER_BYTES {
            return Ok(None);
        }
        let large = self.start_large(&prefix)?;
        self.lo = self.hi;
        Ok(Some(Parsed::Large(large)))
    }

    /// A data frame larger than the buffer: its header and the payload
    /// bytes already buffered move into the payload's own allocation.
    fn start_large(&self, prefix: &Prefix) -> std::io::Result<Large> {
        let avail = &self.buf[self.lo..self.hi];
        let head = avail[PREFIX_BYTES..PREFIX_BYTES + HEADER_BYTES]
            .try_into()
            .expect("checked length");
        let header = frame::data_header(prefix, head)?;
        let len = prefix.len - HEADER_BYTES;
        let have = &avail[PREFIX_BYTES + HEADER_BYTES..];
        let mut data = frame::payload_buffer(len);
        frame::payload_bytes(&mut data, len)[..have.len()].copy_from_slice(have);
        Ok(Large {
            channel: prefix.channel,
            header,
            data,
            len,
            filled: have.len(),
        })
    }
}

/// One read: `Some(k)` bytes, `None` when it would block; the end of the
/// stream is an error (a peer leaves by a `bye` frame first).
fn read_some(r: &mut impl Read, into: &mut [u8]) -> std::io::Result<Option<usize>> {
    loop {
        return match r.read(into) {
            Ok(0) if !into.is_empty() => Err(ErrorKind::UnexpectedEof.into()),
            Ok(k) => Ok(Some(k)),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        };
    }
}

/// Feed `data` to the frame reader as if it came from a peer of a 4-rank
/// group with 4 KiB messages, in pieces whose sizes the data's first
/// bytes choose, until it errs. The fuzz target's entry point.
#[doc(hidden)]
pub fn fuzz_frames(data: &[u8]) {
    let (cuts, stream) = data.split_at(data.len().min(4));
    let mut source = Pieces {
        data: stream,
        cuts: cuts.iter().map(|&c| usize::from(c).max(1)).collect(),
        turn: 0,
        stall: false,
    };
    let mut inflow = Inflow::new(4096, 4);
    let mut check = |f: Frame| {
        check_frame(f);
        Ok(())
    };
    while inflow.pump(&mut source, &mut check).is_ok() {}
}

fn check_frame(f: Frame) {
    match f {
        Frame::Data { header, data, .. } => {
            assert!(header.len as usize <= 4096 && data.len() * 8 >= header.len as usize);
            let _ = header.signature();
        }
        // Escaping a control character takes at most six bytes for one.
        Frame::Fail {
            culprit, reason, ..
        } => {
            assert!(culprit < 4 && reason.len() <= 6 * frame::MAX_REASON)
        }
        Frame::Ack { channel, count } => assert!(frame::channel_ok(channel) && count > 0),
        Frame::Bye => {}
    }
}

/// A reader that hands out `data` in pieces, saying "would block" between
/// them, as a non-blocking socket does.
pub(super) struct Pieces<'a> {
    pub data: &'a [u8],
    pub cuts: Vec<usize>,
    pub turn: usize,
    pub stall: bool,
}

impl Read for Pieces<'_> {
    fn read(&mut self, into: &mut [u8]) -> std::io::Result<usize> {
        self.stall = !self.stall;
        if self.stall {
            return Err(ErrorKind::WouldBlock.into());
        }
        let cut = self.cuts.get(self.turn % self.cuts.len().max(1)).copied();
        self.turn += 1;
        let k = cut
            .unwrap_or(usize::MAX)
            .min(into.len())
            .min(self.data.len());
        into[..k].copy_from_slice(&self.data[..k]);
        self.data = &self.data[k..];
        Ok(k)
    }
}
