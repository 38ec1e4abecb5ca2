//! The header every message carries: which call it belongs to and what
//! that call was, so ranks that disagree find out from the first message
//! instead of exchanging anything extra.

/// Bytes of a header on the wire and in a shared-memory slot. A multiple of
/// 64 so the payload after it stays cache-line (and element) aligned.
pub const HEADER_BYTES: usize = 128;

/// Room for the call's description; longer ones are cut (they still
/// compare equal only when the cut parts are equal, which the count,
/// type and op at the front make decisive).
const SIGNATURE_BYTES: usize = HEADER_BYTES - 8 - 8 - 2 - 1;

/// Flag: the payload is not the value but where it lies in the sender's
/// memory, for the receiver to read itself ([`Header::by_reference`]).
const BY_REFERENCE: u8 = 1;
/// Flag, with [`BY_REFERENCE`]: the pieces are offsets into the sender's
/// shared heap, not addresses.
const IN_HEAP: u8 = 2;
/// Flag: no payload; the sender wrote the value straight into the
/// receiver's heap, where the receiver's post asked for it.
const WRITTEN: u8 = 4;
/// Announcement flag: this rank can run the call on the shared heap's
/// plan (its buffers lie in its heap; see `crate::agree`).
const OFFERS_HEAP_PLAN: u8 = 8;
/// Announcement flag: the call before this one ran on the heap's plan, for
/// a peer that reads this announcement in place of that one's.
const RAN_HEAP_PLAN: u8 = 16;

/// What of `signature` a header holds: as much as fits, cut on a char
/// boundary.
fn cut(signature: &str) -> &str {
    let mut n = signature.len().min(SIGNATURE_BYTES);
    while !signature.is_char_boundary(n) {
        n -= 1;
    }
    &signature[..n]
}

/// A message's header.
#[derive(Clone, PartialEq, Eq)]
pub struct Header {
    /// The sender's call number (point-to-point messages use their own
    /// per-link numbering).
    pub call: u64,
    /// Payload bytes that follow.
    pub len: u64,
    signature_len: u16,
    flags: u8,
    signature: [u8; SIGNATURE_BYTES],
}

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Header")
            .field("call", &self.call)
            .field("len", &self.len)
            .field("by_reference", &self.by_reference())
            .field("signature", &self.signature())
            .finish()
    }
}

impl Header {
    /// The header of a message of call `call` (described as `signature`)
    /// carrying `len` payload bytes; a signature longer than the header
    /// holds is cut.
    pub fn new(call: u64, len: usize, signature: &str) -> Self {
        let mut bytes = [0u8; SIGNATURE_BYTES];
        let signature = cut(signature);
        let n = signature.len();
        bytes[..n].copy_from_slice(signature.as_bytes());
        Header {
            call,
            len: len as u64,
            signature_len: n as u16,
            flags: 0,
            signature: bytes,
        }
    }

    /// This header for a message whose payload names where the value's
    /// `len` bytes lie instead of holding them. Senders only refer to
    /// their shared heap ([`referring_to_heap`](Self::referring_to_heap));
    /// tests build the bare flag to check receivers refuse it.
    #[cfg(test)]
    pub fn referring(mut self) -> Self {
        self.flags |= BY_REFERENCE;
        self
    }

    /// A message whose payload names pieces of the sender's shared heap
    /// (`zero_copy`) instead of holding the value.
    pub fn referring_to_heap(mut self) -> Self {
        self.flags |= BY_REFERENCE | IN_HEAP;
        self
    }

    /// This header for a message whose value the sender wrote into the
    /// receiver's posted destination.
    pub fn written(mut self) -> Self {
        self.flags |= WRITTEN;
        self
    }

    /// This header for an announcement: whether this rank offers the heap's
    /// plan for the call, and whether the call before ran on it.
    pub fn announcing(mut self, offers_heap_plan: bool, ran_heap_plan: bool) -> Self {
        if offers_heap_plan {
            self.flags |= OFFERS_HEAP_PLAN;
        }
        if ran_heap_plan {
            self.flags |= RAN_HEAP_PLAN;
        }
        self
    }

    /// Whether the announcing rank offered the heap's plan for this call.
    pub fn offers_heap_plan(&self) -> bool {
        self.flags & OFFERS_HEAP_PLAN != 0
    }

    /// Whether the announcing rank ran the call before this on the heap's
    /// plan.
    pub fn ran_heap_plan(&self) -> bool {
        self.flags & RAN_HEAP_PLAN != 0
    }

    /// Whether the value was written into this rank's posted destination.
    pub fn was_written(&self) -> bool {
        self.flags & WRITTEN != 0
    }

    /// Whether a reference names offsets into the sender's shared heap.
    pub fn in_heap(&self) -> bool {
        self.flags & IN_HEAP != 0
    }

    /// Whether the value's own bytes follow the header (in the slot or on
    /// the wire): not a reference, not written to the receiver's post. Only
    /// then does `len` measure the payload.
    pub fn holds_value(&self) -> bool {
        !self.by_reference() && !self.was_written()
    }

    /// Whether the payload refers to the value instead of holding it.
    pub fn by_reference(&self) -> bool {
        self.flags & BY_REFERENCE != 0
    }

    /// What the sender called, as it described it.
    /// Ours never hold control characters: one that does (a peer's
    /// bytes, printed in a mismatch) reads as garbled.
    pub fn signature(&self) -> &str {
        let n = usize::from(self.signature_len).min(SIGNATURE_BYTES);
        match std::str::from_utf8(&self.signature[..n]) {
            Ok(s) if !s.chars().any(char::is_control) => s,
            _ => "<garbled signature>",
        }
    }

    /// Whether a message with this header belongs to the call `call`
    /// described as `signature`.
    pub fn same_call(&self, call: u64, signature: &str) -> bool {
        // Bytes against bytes, as the header stores them: every call of
        // every message compares, and a peer's garbled bytes are unequal
        // to ours as they are.
        let n = usize::from(self.signature_len).min(SIGNATURE_BYTES);
        self.call == call && self.signature[..n] == *cut(signature).as_bytes()
    }

    /// The header as it travels: [`HEADER_BYTES`] bytes, little-endian.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..8].copy_from_slice(&self.call.to_le_bytes());
        out[8..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..18].copy_from_slice(&self.signature_len.to_le_bytes());
        out[18] = self.flags;
        out[19..].copy_from_slice(&self.signature);
        out
    }

    /// A header from its bytes; anything may be in them, and every
    /// accessor copes.
    pub fn decode(bytes: &[u8; HEADER_BYTES]) -> Self {
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let mut signature = [0u8; SIGNATURE_BYTES];
        signature.copy_from_slice(&bytes[19..]);
        Header {
            call: word(0),
            len: word(8),
            signature_len: u16::from_le_bytes([bytes[16], bytes[17]]),
            flags: bytes[18],
            signature,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_cut_long_signatures_on_a_char_boundary() {
        let h = Header::new(7, 4096, "all-reduce count=1024 type=f32 op=sum");
        assert_eq!(Header::decode(&h.encode()), h);
        assert_eq!(h.signature(), "all-reduce count=1024 type=f32 op=sum");
        assert!(h.same_call(7, "all-reduce count=1024 type=f32 op=sum"));
        assert!(!h.same_call(7, "all-reduce count=1023 type=f32 op=sum"));
        assert!(!h.same_call(8, "all-reduce count=1024 type=f32 op=sum"));
        let long = "é".repeat(100);
        let cut = Header::new(1, 0, &long);
        assert!(cut.signature().len() <= SIGNATURE_BYTES);
        assert!(cut.same_call(1, &long));
        // A peer's bytes that are not text, or claim a length past the
        // field, are no call of ours.
        let mut raw = Header::new(9, 0, "ab").encode();
        raw[19] = 0xff;
        assert!(!Header::decode(&raw).same_call(9, "ab"));
        assert_eq!(Header::decode(&raw).signature(), "<garbled signature>");
        let mut long_len = Header::new(9, 0, "ab").encode();
        long_len[16..18].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(!Header::decode(&long_len).same_call(9, "ab"));
        let r = Header::new(3, 1 << 20, "x").referring();
        assert!(r.by_reference() && !h.by_reference());
        assert_eq!(Header::decode(&r.encode()), r);
        assert!(h.holds_value() && !r.holds_value());
        assert!(!Header::new(3, 1 << 20, "x").written().holds_value());
        assert!(
            !Header::new(3, 1 << 20, "x")
                .referring_to_heap()
                .holds_value()
        );
        for (offers, ran) in [(false, true), (true, false), (true, true)] {
            let a = Header::decode(&Header::new(4, 0, "x").announcing(offers, ran).encode());
            assert_eq!((a.offers_heap_plan(), a.ran_heap_plan()), (offers, ran));
            assert!(a.same_call(4, "x") && !a.by_reference());
        }
    }
}
