//! Lowering a plan to a rank's records: how each message travels, the
//! records channel by channel, and the checks a walk of them relies on.

use std::collections::{BTreeMap, HashMap};

use ferrocoll_core::plan::{ExecutionPlan, Instruction, Message, RankPlan, Source};
use ferrocoll_core::types::Buffer;

use super::abi::{After, BufferId, Channel, Count, End, Op, Piece, Region, Span, Transfer};
use super::{DeviceProgram, Layout, ProgramError, Protocol, RankProgram};

/// A message by its link and number: (sender, receiver, channel, index).
type Key = (u32, u32, u32, u64);

/// How one message travels, and where its bytes lie at the end that does
/// not own them (the sender's region for [`Transfer::InSender`], the
/// receiver's for [`Transfer::InReceiver`]).
#[derive(Debug, Clone)]
pub(super) struct Decision {
    transfer: Transfer,
    remote: Option<ferrocoll_core::plan::Region>,
}

fn slot() -> Decision {
    Decision {
        transfer: Transfer::Slot,
        remote: None,
    }
}

impl From<Buffer> for BufferId {
    fn from(b: Buffer) -> Self {
        match b {
            Buffer::Input => BufferId::Input,
            Buffer::Output => BufferId::Output,
            Buffer::Scratch => BufferId::Scratch,
        }
    }
}

/// Whether the plan fits the layout at all.
pub(super) fn check(
    plan: &ExecutionPlan,
    layout: &Layout,
    protocol: Protocol,
) -> Result<(), ProgramError> {
    layout.check()?;
    if plan.world_size != layout.world_size {
        return Err(ProgramError::WorldSize {
            plan: plan.world_size,
            layout: layout.world_size,
        });
    }
    if plan.channels > layout.max_channels {
        return Err(ProgramError::Channels {
            plan: plan.channels,
            layout: layout.max_channels,
        });
    }
    if plan.slots_per_link > layout.slots {
        return Err(ProgramError::Slots(format!(
            "the plan needs {} slots per link; the device buffers hold {}",
            plan.slots_per_link, layout.slots
        )));
    }
    if protocol == Protocol::LowLatency
        && let Some(l) = plan
            .links
            .iter()
            .find(|l| l.largest > layout.ll_message_bytes())
    {
        return Err(ProgramError::Slots(format!(
            "a message of {} bytes on link {}->{} channel {} does not fit an LL slot, which carries {}",
            l.largest,
            l.link.from,
            l.link.to,
            l.link.channel,
            layout.ll_message_bytes()
        )));
    }
    if let Some(l) = plan.links.iter().find(|l| l.largest > layout.slot_bytes) {
        return Err(ProgramError::Slots(format!(
            "a message of {} bytes on link {}->{} channel {} does not fit a slot of {} (cut the chunks smaller)",
            l.largest, l.link.from, l.link.to, l.link.channel, layout.slot_bytes
        )));
    }
    Ok(())
}

/// Every message's transfer. Staged unless ranks address each other's
/// buffers and the protocol is Simple; then stored into the receiver
/// where the plan allows it unannounced (pushes over NVLink are cheaper
/// than pulls), else read in the sender where its value stays put.
pub(super) fn transfers(
    plan: &ExecutionPlan,
    layout: &Layout,
    protocol: Protocol,
) -> HashMap<Key, Decision> {
    let mut receivers: HashMap<Key, &Instruction> = HashMap::new();
    for rp in &plan.ranks {
        for (c, list) in rp.channels.iter().enumerate() {
            for ins in list {
                for m in &ins.recv {
                    receivers.insert((m.peer, rp.rank, c as u32, m.index), ins);
                }
            }
        }
    }
    let mut out = HashMap::new();
    let zero_copy = layout.zero_copy && protocol == Protocol::Simple;
    for rp in &plan.ranks {
        for (c, list) in rp.channels.iter().enumerate() {
            for ins in list {
                for m in &ins.send {
                    let key = (rp.rank, m.peer, c as u32, m.index);
                    let decision = match receivers.get(&key) {
                        Some(t) if zero_copy => decide(ins, t),
                        _ => slot(),
                    };
                    out.insert(key, decision);
                }
            }
        }
    }
    for rp in &plan.ranks {
        for (c, list) in rp.channels.iter().enumerate() {
            for ins in list {
                separate(rp.rank, c as u32, ins, &mut out);
            }
        }
    }
    out
}

fn decide(sender: &Instruction, receiver: &Instruction) -> Decision {
    if receiver.stored_by_sender {
        return Decision {
            transfer: Transfer::InReceiver,
            remote: receiver.write.clone(),
        };
    }
    let kept = match sender.source {
        Source::Write => sender.write.clone(),
        Source::Read => sender.read.clone(),
        Source::Slot => None,
    };
    match kept {
        Some(region) => Decision {
            transfer: Transfer::InSender,
            remote: Some(region),
        },
        None => slot(),
    }
}

/// One instruction may read a peer's bytes in place and store into the
/// same peer's memory. Each thread reads and then writes the same value
/// offset, so that is safe only where the two regions are the same bytes
/// in the same order (direct all-reduce in place: the owner reads a
/// peer's chunk and stores the sum back into it); otherwise the store is
/// staged instead.
fn separate(rank: u32, channel: u32, ins: &Instruction, out: &mut HashMap<Key, Decision>) {
    for r in &ins.recv {
        let Some(read) = out
            .get(&(r.peer, rank, channel, r.index))
            .filter(|d| d.transfer == Transfer::InSender)
            .and_then(|d| d.remote.clone())
        else {
            continue;
        };
        for s in ins.send.iter().filter(|s| s.peer == r.peer) {
            let key = (rank, s.peer, channel, s.index);
            let clash = out.get(&key).is_some_and(|d| {
                d.transfer == Transfer::InReceiver
                    && d.remote
                        .as_ref()
                        .is_some_and(|w| *w != read && overlap(w, &read))
            });
            if clash {
                out.insert(key, slot());
            }
        }
    }
}

fn overlap(a: &ferrocoll_core::plan::Region, b: &ferrocoll_core::plan::Region) -> bool {
    a.buffer == b.buffer
        && a.pieces.iter().any(|x| {
            b.pieces
                .iter()
                .any(|y| x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes)
        })
}

/// Each link's messages per call as lowered are the plan's own count.
pub(super) fn check_link_counts(
    plan: &ExecutionPlan,
    program: &DeviceProgram,
) -> Result<(), ProgramError> {
    let layout = &program.layout;
    for l in &plan.links {
        let word = layout.link_word(l.link.channel, l.link.to) as u32;
        let sent = program.ranks[l.link.from as usize]
            .sent
            .iter()
            .find(|c| c.word == word)
            .map_or(0, |c| c.count);
        if sent != l.messages {
            return Err(ProgramError::Invalid(format!(
                "link {}->{} channel {}: {} messages lowered, the plan has {}",
                l.link.from, l.link.to, l.link.channel, sent, l.messages
            )));
        }
    }
    Ok(())
}

/// A table's next index, or why the device format cannot hold it.
fn next_index<T>(table: &[T], what: &str) -> Result<u32, ProgramError> {
    u32::try_from(table.len()).map_err(|_| ProgramError::TooLarge(format!("over 2^32 {what}")))
}

/// A run of a table from `first` to its end.
fn since<T>(table: &[T], first: u32) -> Span {
    Span {
        first,
        count: table.len() as u32 - first,
    }
}

/// Links' message counts of one rank, in a call.
#[derive(Default)]
struct Tally {
    sent: BTreeMap<u32, (u64, bool)>,
    received: BTreeMap<u32, u64>,
}

/// Lower rank `plan.rank`'s part.
pub(super) fn rank(
    plan: &RankPlan,
    layout: &Layout,
    transfers: &HashMap<Key, Decision>,
) -> Result<RankProgram, ProgramError> {
    let mut p = RankProgram::default();
    let mut tally = Tally::default();
    for (c, instructions) in plan.channels.iter().enumerate() {
        let c = c as u32;
        let first = [
            next_index(&p.ops, "instructions")?,
            next_index(&p.ends, "message ends")?,
            next_index(&p.pieces, "pieces")?,
            next_index(&p.afters, "waits")?,
        ];
        for ins in instructions {
            let op = instruction(&mut p, plan.rank, c, ins, layout, transfers, &mut tally)?;
            p.ops.push(op);
        }
        p.channels.push(Channel {
            ops: since(&p.ops, first[0]),
            ends: since(&p.ends, first[1]),
            pieces: since(&p.pieces, first[2]),
            afters: since(&p.afters, first[3]),
        });
    }
    p.divide = plan
        .divide
        .as_ref()
        .map(|r| region(&mut p, r))
        .transpose()?;
    p.sent = tally
        .sent
        .into_iter()
        .map(|(word, (count, drain))| Count {
            word,
            drain: u32::from(drain),
            count,
        })
        .collect();
    p.received = tally
        .received
        .into_iter()
        .map(|(word, count)| Count {
            word,
            drain: 0,
            count,
        })
        .collect();
    Ok(p)
}

fn instruction(
    p: &mut RankProgram,
    rank: u32,
    channel: u32,
    ins: &Instruction,
    layout: &Layout,
    transfers: &HashMap<Key, Decision>,
    tally: &mut Tally,
) -> Result<Op, ProgramError> {
    let decision = |key: &Key| transfers.get(key).cloned().unwrap_or_else(slot);
    let recv_first = next_index(&p.ends, "message ends")?;
    for m in &ins.recv {
        let d = decision(&(m.peer, rank, channel, m.index));
        // The receiving end reads the sender's region; a receive stored
        // into needs nothing but its own `write`.
        let remote = match d.transfer {
            Transfer::InSender => d.remote.as_ref(),
            _ => None,
        };
        end(p, m, d.transfer, remote)?;
        let n = tally
            .received
            .entry(layout.link_word(channel, m.peer) as u32)
            .or_insert(0);
        *n = (*n).max(m.index + 1);
    }
    let recv = since(&p.ends, recv_first);
    let send_first = next_index(&p.ends, "message ends")?;
    for m in &ins.send {
        let d = decision(&(rank, m.peer, channel, m.index));
        let remote = match d.transfer {
            Transfer::InReceiver => d.remote.as_ref(),
            _ => None,
        };
        end(p, m, d.transfer, remote)?;
        let n = tally
            .sent
            .entry(layout.link_word(channel, m.peer) as u32)
            .or_insert((0, false));
        n.0 = n.0.max(m.index + 1);
        n.1 |= d.transfer == Transfer::InSender;
    }
    let send = since(&p.ends, send_first);
    let after_first = next_index(&p.afters, "waits")?;
    p.afters.extend(ins.after.iter().map(|w| After {
        channel: w.channel,
        index: w.index,
    }));
    let read = ins
        .read
        .as_ref()
        .map_or(Ok(Region::NONE), |r| region(p, r))?;
    let write = ins
        .write
        .as_ref()
        .map_or(Ok(Region::NONE), |r| region(p, r))?;
    Ok(Op {
        bytes: ins.bytes,
        recv,
        read,
        write,
        send,
        after: since(&p.afters, after_first),
    })
}

fn end(
    p: &mut RankProgram,
    m: &Message,
    transfer: Transfer,
    remote: Option<&ferrocoll_core::plan::Region>,
) -> Result<(), ProgramError> {
    // The end's record goes first, its remote pieces after it: a region's
    // pieces are found through the span, wherever they lie.
    let at = p.ends.len();
    p.ends.push(End {
        peer: m.peer,
        transfer,
        index: m.index,
        remote: Region::NONE,
        reserved: 0,
    });
    if let Some(r) = remote {
        p.ends[at].remote = region(p, r)?;
    }
    Ok(())
}

fn region(p: &mut RankProgram, r: &ferrocoll_core::plan::Region) -> Result<Region, ProgramError> {
    let first = next_index(&p.pieces, "pieces")?;
    p.pieces.extend(r.pieces.iter().map(|x| Piece {
        offset: x.offset,
        bytes: x.bytes,
    }));
    Ok(Region {
        buffer: r.buffer.into(),
        pieces: since(&p.pieces, first),
    })
}
