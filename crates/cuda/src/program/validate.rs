//! What the device relies on when it walks a lowered program, checked on
//! the host before any launch: every run of a table inside its channel's,
//! every region inside its buffer, every message's two ends agreeing on
//! how and where its bytes travel. A program edited or corrupted after
//! lowering is refused here, not discovered by a thread reading past a
//! table or storing into the wrong bytes of a peer.

use std::collections::HashMap;

use super::abi::{BufferId, Channel, End, Op, Piece, Region, Span, Transfer};
use super::{Layout, MAX_RANKS, Protocol, RankProgram};

/// A message: sender, receiver, channel, its index on the link.
type Key = (u32, u32, u32, u64);

/// Whether `s` lies within `within`.
fn inside(s: Span, within: Span) -> bool {
    s.count == 0
        || (s.first >= within.first
            && u64::from(s.first) + u64::from(s.count)
                <= u64::from(within.first) + u64::from(within.count))
}

/// What a walk of `p`'s records relies on; `sizes` are the bytes of the
/// input, output and scratch (the same on every rank).
pub(super) fn validate_rank(
    p: &RankProgram,
    l: &Layout,
    protocol: Protocol,
    sizes: &[u64; 3],
) -> Result<(), String> {
    if p.channels.len() > l.max_channels as usize {
        return Err(format!(
            "{} channels, the layout has {}",
            p.channels.len(),
            l.max_channels
        ));
    }
    let tables = |c: &Channel| {
        [
            (c.ops, p.ops.len()),
            (c.ends, p.ends.len()),
            (c.pieces, p.pieces.len()),
            (c.afters, p.afters.len()),
        ]
    };
    for c in &p.channels {
        for (span, len) in tables(c) {
            if u64::from(span.first) + u64::from(span.count) > len as u64 {
                return Err(format!(
                    "a channel's run {}..+{} past {len}",
                    span.first, span.count
                ));
            }
        }
        for op in &p.ops[c.ops.first as usize..][..c.ops.count as usize] {
            validate_op(p, c, op, l, protocol, sizes)?;
        }
    }
    if let Some(d) = &p.divide {
        let all = Span {
            first: 0,
            count: p.pieces.len() as u32,
        };
        if d.get().is_none() {
            return Err("a division of no region".into());
        }
        let bytes = pieces_of(p, d, all)?
            .iter()
            .fold(0u64, |s, x| s.saturating_add(x.bytes));
        check_region(p, d, bytes, sizes, all)?;
    }
    check_drains(p, l)?;
    for c in p.sent.iter().chain(&p.received) {
        if c.word as usize >= l.link_words() {
            return Err(format!(
                "a link count for word {} of {}",
                c.word,
                l.link_words()
            ));
        }
    }
    Ok(())
}

/// A link that leaves a message in its sender's buffer is drained: the
/// call does not end (and the buffer is not handed back) before the
/// receiver has read it.
fn check_drains(p: &RankProgram, l: &Layout) -> Result<(), String> {
    for (c, ch) in p.channels.iter().enumerate() {
        for op in &p.ops[ch.ops.first as usize..][..ch.ops.count as usize] {
            for e in &p.ends[op.send.first as usize..][..op.send.count as usize] {
                let word = l.link_word(c as u32, e.peer) as u32;
                let drained = p.sent.iter().any(|n| n.word == word && n.drain == 1);
                if e.transfer == Transfer::InSender && !drained {
                    return Err(format!(
                        "a message kept in place for rank {} on a link that is not drained",
                        e.peer
                    ));
                }
            }
        }
    }
    Ok(())
}

fn pieces_of<'a>(p: &'a RankProgram, r: &Region, within: Span) -> Result<&'a [Piece], String> {
    if !inside(r.pieces, within) {
        return Err(format!(
            "pieces {}..+{} outside their run",
            r.pieces.first, r.pieces.count
        ));
    }
    Ok(&p.pieces[r.pieces.first as usize..][..r.pieces.count as usize])
}

/// A region's pieces lie in its run of the piece table and in its buffer,
/// and add up to `bytes`.
fn check_region(
    p: &RankProgram,
    r: &Region,
    bytes: u64,
    sizes: &[u64; 3],
    within: Span,
) -> Result<(), String> {
    let Some(size) = sizes.get(r.buffer as usize) else {
        return Err(format!("a region in buffer {:?}", r.buffer));
    };
    let pieces = pieces_of(p, r, within)?;
    if pieces
        .iter()
        .any(|x| x.offset.checked_add(x.bytes).is_none_or(|end| end > *size))
    {
        return Err(format!(
            "a piece past the {size} bytes of buffer {:?}",
            r.buffer
        ));
    }
    let total = pieces.iter().fold(0u64, |s, x| s.saturating_add(x.bytes));
    if total != bytes {
        return Err(format!("a region of {total} bytes for a value of {bytes}"));
    }
    Ok(())
}

fn validate_op(
    p: &RankProgram,
    c: &Channel,
    op: &Op,
    l: &Layout,
    protocol: Protocol,
    sizes: &[u64; 3],
) -> Result<(), String> {
    if op.recv.count > MAX_RANKS || op.send.count > MAX_RANKS {
        return Err(format!(
            "an instruction with {} messages in and {} out; the device holds {MAX_RANKS} each",
            op.recv.count, op.send.count
        ));
    }
    for (span, what) in [(op.recv, "received"), (op.send, "sent")] {
        if !inside(span, c.ends) {
            return Err(format!("{what} message ends outside the channel's"));
        }
    }
    if !inside(op.after, c.afters) {
        return Err("waits outside the channel's".into());
    }
    for r in [&op.read, &op.write] {
        if r.get().is_some() {
            check_region(p, r, op.bytes, sizes, c.pieces)?;
        }
    }
    if op.recv.count == 0 && op.read.get().is_none() {
        return Err("an instruction with no input".into());
    }
    let largest = match protocol {
        Protocol::Simple => l.slot_bytes,
        Protocol::LowLatency => l.ll_message_bytes(),
    };
    let ends = |s: Span| &p.ends[s.first as usize..][..s.count as usize];
    // A block's threads greet an instruction's peers at once, one each:
    // a peer twice on one side would be greeted by two threads racing.
    for (span, what) in [(op.recv, "from"), (op.send, "to")] {
        let mut peers: Vec<u32> = ends(span).iter().map(|e| e.peer).collect();
        peers.sort_unstable();
        if peers.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!("an instruction with two messages {what} one rank"));
        }
    }
    for (sending, e) in ends(op.recv)
        .iter()
        .map(|e| (false, e))
        .chain(ends(op.send).iter().map(|e| (true, e)))
    {
        if e.peer >= l.world_size {
            return Err("a message to a rank past the world size".into());
        }
        if e.transfer != Transfer::Slot && (!l.zero_copy || protocol != Protocol::Simple) {
            return Err(
                "a message that skips its slot where ranks cannot reach each other's buffers"
                    .into(),
            );
        }
        // Where the end's bytes are elsewhere, their region says where.
        let remote = matches!(
            (sending, e.transfer),
            (false, Transfer::InSender) | (true, Transfer::InReceiver)
        );
        match (remote, e.remote.get()) {
            (true, Some(r)) => check_region(p, r, op.bytes, sizes, c.pieces)?,
            (true, None) => return Err("a message without the region it travels to or from".into()),
            (false, Some(_)) => return Err("a region on a message end that needs none".into()),
            (false, None) => {}
        }
        if e.transfer == Transfer::Slot && op.bytes > largest {
            return Err(format!(
                "a message of {} bytes where a slot carries {largest}",
                op.bytes
            ));
        }
        if !sending
            && e.transfer == Transfer::InReceiver
            && (op.recv.count != 1
                || op.read.get().is_some()
                || op.write.get().is_none()
                || op.after.count != 0)
        {
            return Err("a receive stored into by its sender that is not a plain receive".into());
        }
    }
    let afters = &p.afters[op.after.first as usize..][..op.after.count as usize];
    if afters
        .iter()
        .any(|a| a.channel as usize >= p.channels.len())
    {
        return Err("a wait on a channel this rank does not run".into());
    }
    Ok(())
}

/// Both ends of every message say the same transfer and the same bytes:
/// a sender that keeps a value in place while its receiver reads a slot
/// would hand over whatever the slot held, and a remote region that is
/// not the other end's own would read or overwrite the wrong bytes.
pub(super) fn validate_ends_agree(ranks: &[RankProgram]) -> Result<(), String> {
    let mut sent: HashMap<Key, Seen> = HashMap::new();
    let mut received: HashMap<Key, Seen> = HashMap::new();
    for (r, p) in ranks.iter().enumerate() {
        let r = r as u32;
        for (c, ch) in p.channels.iter().enumerate() {
            let c = c as u32;
            for op in &p.ops[ch.ops.first as usize..][..ch.ops.count as usize] {
                let ends = |s: Span| &p.ends[s.first as usize..][..s.count as usize];
                for e in ends(op.send) {
                    let seen = Seen::of(p, op, e);
                    if sent.insert((r, e.peer, c, e.index), seen).is_some() {
                        return Err(duplicate((r, e.peer, c, e.index), "sent"));
                    }
                }
                for e in ends(op.recv) {
                    let seen = Seen::of(p, op, e);
                    if received.insert((e.peer, r, c, e.index), seen).is_some() {
                        return Err(duplicate((e.peer, r, c, e.index), "received"));
                    }
                }
            }
        }
    }
    if sent.len() != received.len() {
        return Err("a message received that no rank sends".into());
    }
    for (k, s) in &sent {
        let Some(t) = received.get(k) else {
            return Err(format!("{} is sent and never received", name(*k)));
        };
        if s.transfer != t.transfer {
            return Err(format!(
                "{} is sent {:?} and received {:?}",
                name(*k),
                s.transfer,
                t.transfer
            ));
        }
        let agree = match s.transfer {
            Transfer::Slot => true,
            Transfer::InSender => t.remote.is_some() && (t.remote == s.read || t.remote == s.write),
            Transfer::InReceiver => s.remote.is_some() && s.remote == t.write,
        };
        if !agree {
            return Err(format!(
                "{}: its remote region is not the other end's",
                name(*k)
            ));
        }
    }
    Ok(())
}

/// A region as bytes: its buffer and its pieces in order.
type Bytes = Option<(BufferId, Vec<(u64, u64)>)>;

/// One end of a message as its rank lowered it: the transfer, the remote
/// region, and the local regions of its instruction.
struct Seen {
    transfer: Transfer,
    remote: Bytes,
    read: Bytes,
    write: Bytes,
}

impl Seen {
    fn of(p: &RankProgram, op: &Op, e: &End) -> Seen {
        let bytes = |r: &Region| -> Bytes {
            r.get().map(|r| {
                let pieces = &p.pieces[r.pieces.first as usize..][..r.pieces.count as usize];
                (
                    r.buffer,
                    pieces.iter().map(|x| (x.offset, x.bytes)).collect(),
                )
            })
        };
        Seen {
            transfer: e.transfer,
            remote: bytes(&e.remote),
            read: bytes(&op.read),
            write: bytes(&op.write),
        }
    }
}

fn name(k: Key) -> String {
    format!("message {} on link {}->{} channel {}", k.3, k.0, k.1, k.2)
}

fn duplicate(k: Key, side: &str) -> String {
    format!("{} is {side} twice", name(k))
}
