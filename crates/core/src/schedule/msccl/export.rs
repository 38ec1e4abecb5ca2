//! A ferrocoll [`Schedule`] → MSCCL's algorithm XML, with every
//! attribute MSCCL's runtime reads.
//!
//! An MSCCL step talks to its threadblock's one peer each way, so a
//! ferrocoll step becomes one or more *parts*: a step that receives from
//! several peers reduces them one at a time into its write (`r`/`rrc`,
//! then `rrc` over the write), and one that sends to several sends the
//! stored value to each (`s`). A channel becomes one threadblock (`tb id`
//! = channel) where its parts talk to at most one peer each way;
//! otherwise its parts are split into threadblocks by peer, and the
//! channel's order is kept by dependencies. A part that copies a local
//! slice and sends it becomes `cpy` then `s`; more than one dependency
//! becomes `nop` steps carrying the rest.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

use super::Sets;
use crate::error::MscclError;
use crate::schedule::{Schedule, Slice, Step, StepAt};
use crate::types::{Buffer, Collective, Rank};

/// One XML step before its dependency is known.
#[derive(Debug, Clone, Copy)]
struct Code {
    code: &'static str,
    src: Option<Slice>,
    dst: Option<Slice>,
}

/// A piece of a ferrocoll step one threadblock runs: at most one peer each
/// way, and one XML step (or `cpy` then `s`).
#[derive(Debug, Clone)]
struct Part {
    recv: Option<Rank>,
    send: Option<Rank>,
    codes: Vec<Code>,
}

/// Where a part sits: (step of the channel, part of the step).
type PartAt = (u32, usize);

/// A threadblock being written.
struct Block {
    send: Option<Rank>,
    recv: Option<Rank>,
    chan: u32,
    /// The channel's parts it runs, in order.
    parts: Vec<PartAt>,
}

/// One XML step.
struct Out {
    code: &'static str,
    src: Option<Slice>,
    dst: Option<Slice>,
    cnt: u32,
    dep: Option<(usize, usize)>,
}

fn inexpressible(at: StepAt, why: impl Into<String>) -> MscclError {
    MscclError::Inexpressible {
        at: at.to_string(),
        why: why.into(),
    }
}

fn coll(c: Collective) -> Result<&'static str, MscclError> {
    Ok(match c {
        Collective::AllReduce => "allreduce",
        Collective::AllGather => "allgather",
        Collective::ReduceScatter => "reduce_scatter",
        Collective::AllToAll => "alltoall",
        other => {
            return Err(MscclError::Inexpressible {
                at: "the schedule".into(),
                why: format!("MSCCL's format has no {other} (no root, no send/recv collective)"),
            });
        }
    })
}

/// The part that receives from `recv` (if any), combines with `read`,
/// stores to `write` and sends to `send`: MSCCL's step type(s) for it.
fn part(
    at: StepAt,
    recv: Option<Rank>,
    read: Option<Slice>,
    write: Option<Slice>,
    send: Option<Rank>,
) -> Result<Part, MscclError> {
    let code = |code, src, dst| Code { code, src, dst };
    let codes = match (
        recv.is_some(),
        read.is_some(),
        write.is_some(),
        send.is_some(),
    ) {
        (false, true, false, true) => vec![code("s", read, read)],
        (false, true, true, true) => vec![code("cpy", read, write), code("s", read, read)],
        (false, true, true, false) => vec![code("cpy", read, write)],
        (true, false, true, false) => vec![code("r", write, write)],
        (true, false, true, true) => vec![code("rcs", write, write)],
        (true, true, false, true) => vec![code("rrs", read, read)],
        (true, true, true, false) => vec![code("rrc", read, write)],
        (true, true, true, true) => vec![code("rrcs", read, write)],
        (true, false, false, true) => {
            return Err(inexpressible(
                at,
                "forwards a message without storing it; MSCCL has no receive-and-send step \
                 without a copy",
            ));
        }
        _ => return Err(inexpressible(at, "has no input or no effect")),
    };
    Ok(Part { recv, send, codes })
}

/// A ferrocoll step as parts of one peer each way.
fn parts(at: StepAt, step: &Step) -> Result<Vec<Part>, MscclError> {
    let (recvs, sends) = (&step.recv_from, &step.send_to);
    if recvs.len() <= 1 && sends.len() <= 1 {
        let one = part(
            at,
            recvs.first().copied(),
            step.read,
            step.write,
            sends.first().copied(),
        )?;
        return Ok(vec![one]);
    }
    let mut out = Vec::new();
    let rest = if recvs.len() > 1 {
        // One message at a time, reduced into the write.
        let Some(w) = step.write else {
            return Err(inexpressible(
                at,
                format!(
                    "reduces messages from ranks {recvs:?} without storing the value; MSCCL \
                     receives one message per step, so the partial value must rest somewhere"
                ),
            ));
        };
        out.push(part(at, Some(recvs[0]), step.read, Some(w), None)?);
        for &p in &recvs[1..] {
            out.push(part(at, Some(p), Some(w), Some(w), None)?);
        }
        for &p in sends {
            out.push(part(at, None, Some(w), None, Some(p))?);
        }
        return Ok(out);
    } else {
        out.push(part(
            at,
            recvs.first().copied(),
            step.read,
            step.write,
            Some(sends[0]),
        )?);
        match (step.write, step.read) {
            (Some(w), _) => w,
            (None, Some(r)) if recvs.is_empty() => r,
            _ => {
                return Err(inexpressible(
                    at,
                    format!(
                        "receives a message and sends it to ranks {sends:?} without storing it"
                    ),
                ));
            }
        }
    };
    for &p in &sends[1..] {
        out.push(part(at, None, Some(rest), None, Some(p))?);
    }
    Ok(out)
}

/// Split one channel's parts into threadblocks: parts that share a peer
/// share a threadblock; local parts join the one before them.
fn blocks(rank: Rank, channel: u32, steps: &[Vec<Part>]) -> Result<Vec<Block>, MscclError> {
    let flat: Vec<(PartAt, &Part)> = steps
        .iter()
        .enumerate()
        .flat_map(|(i, ps)| ps.iter().enumerate().map(move |(j, p)| ((i as u32, j), p)))
        .collect();
    let mut sets = Sets::new(flat.len());
    let talks = |p: &Part| p.send.is_some() || p.recv.is_some();
    let mut by_peer: HashMap<(bool, Rank), usize> = HashMap::new();
    for (k, (_, p)) in flat.iter().enumerate() {
        let keys = p
            .send
            .map(|q| (true, q))
            .into_iter()
            .chain(p.recv.map(|q| (false, q)));
        for key in keys {
            match by_peer.get(&key) {
                Some(&j) => sets.join(k, j),
                None => {
                    by_peer.insert(key, k);
                }
            }
        }
    }
    // Local parts run in the threadblock of the talking part before them
    // (or of the first one).
    let mut anchor = flat.iter().position(|(_, p)| talks(p)).unwrap_or(0);
    for (k, (_, p)) in flat.iter().enumerate() {
        if talks(p) {
            anchor = k;
        } else {
            sets.join(k, anchor);
        }
    }
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut out: Vec<Block> = Vec::new();
    for (k, &(at, p)) in flat.iter().enumerate() {
        let r = sets.root(k);
        let next = out.len();
        let b = *index.entry(r).or_insert(next);
        if b == out.len() {
            out.push(Block {
                send: None,
                recv: None,
                chan: channel,
                parts: Vec::new(),
            });
        }
        let block = &mut out[b];
        let ways = [
            (&mut block.send, p.send, "sends to"),
            (&mut block.recv, p.recv, "receives from"),
        ];
        for (mine, theirs, way) in ways {
            if let Some(q) = theirs {
                match *mine {
                    Some(o) if o != q => {
                        let step = StepAt {
                            rank,
                            channel,
                            index: at.0,
                        };
                        return Err(inexpressible(
                            step,
                            format!(
                                "its channel {way} ranks {o} and {q} through steps that also share \
                                 a peer; an MSCCL threadblock has one peer each way"
                            ),
                        ));
                    }
                    _ => *mine = Some(q),
                }
            }
        }
        block.parts.push(at);
    }
    Ok(out)
}

/// Join threadblocks whose peers do not clash (one sending to a peer,
/// another receiving from one): fewer threadblocks, and a channel that
/// talks to one peer each way stays one, as its import expects.
fn merge(blocks: Vec<Block>) -> Vec<Block> {
    let fits = |a: Option<Rank>, b: Option<Rank>| a.is_none() || b.is_none() || a == b;
    let mut merged: Vec<Block> = Vec::new();
    for b in blocks {
        match merged
            .iter_mut()
            .find(|m| fits(m.send, b.send) && fits(m.recv, b.recv))
        {
            Some(m) => {
                m.send = m.send.or(b.send);
                m.recv = m.recv.or(b.recv);
                m.parts.extend(b.parts);
                // A threadblock runs its parts in the channel's order.
                m.parts.sort_unstable();
            }
            None => merged.push(b),
        }
    }
    merged
}

/// The steps `step` waits for exist on other channels: a schedule that
/// was not verified is refused here, not indexed past its end.
fn check_after(
    program: &crate::schedule::RankProgram,
    channel: usize,
    at: StepAt,
    step: &Step,
) -> Result<(), MscclError> {
    for dep in &step.after {
        let exists = dep.channel as usize != channel
            && program
                .channels
                .get(dep.channel as usize)
                .is_some_and(|s| (dep.step as usize) < s.len());
        if !exists {
            return Err(inexpressible(
                at,
                format!(
                    "waits for channel {} step {}, which it cannot (export a verified schedule)",
                    dep.channel, dep.step
                ),
            ));
        }
    }
    Ok(())
}

/// Every step of a rank as parts: `[channel][step]`.
type RankParts = Vec<Vec<Vec<Part>>>;

/// Write `schedule` as MSCCL XML (`inplace="0"`, protocol `Simple`).
///
/// Threadblocks whose peers do not clash are joined where the result
/// still reads back (a channel that talks to one peer each way stays one
/// threadblock); joining can also tie two threadblocks of one GPU into
/// one chain of connections, which ferrocoll's import refuses, so the
/// split form is kept where only it reads back. Either is valid MSCCL.
pub(super) fn write(schedule: &Schedule) -> Result<String, MscclError> {
    let joined = write_with(schedule, true)?;
    if super::import(&joined).is_ok() {
        return Ok(joined);
    }
    let split = write_with(schedule, false)?;
    Ok(if super::import(&split).is_ok() {
        split
    } else {
        joined
    })
}

fn write_with(schedule: &Schedule, join: bool) -> Result<String, MscclError> {
    let coll = coll(schedule.collective)?;
    let mut parts: Vec<RankParts> = Vec::with_capacity(schedule.ranks.len());
    for (r, program) in schedule.ranks.iter().enumerate() {
        let mut channels = Vec::with_capacity(program.channels.len());
        for (c, steps) in program.channels.iter().enumerate() {
            let mut list = Vec::with_capacity(steps.len());
            for (i, step) in steps.iter().enumerate() {
                let at = StepAt {
                    rank: r as Rank,
                    channel: c as u32,
                    index: i as u32,
                };
                check_after(program, c, at, step)?;
                list.push(self::parts(at, step)?);
            }
            channels.push(list);
        }
        parts.push(channels);
    }
    let mut xml = String::new();
    let i_chunks = schedule.buffer_chunks(Buffer::Input);
    let o_chunks = schedule.buffer_chunks(Buffer::Output);
    let _ = writeln!(
        xml,
        "<algo name=\"{}\" proto=\"Simple\" nchannels=\"{}\" nchunksperloop=\"{}\" ngpus=\"{}\" coll=\"{coll}\" inplace=\"0\">",
        escape(&schedule.name),
        schedule.channel_count().max(1),
        i_chunks.max(o_chunks),
        schedule.world_size
    );
    for (rank, rank_parts) in parts.iter().enumerate() {
        let rank = rank as Rank;
        let mut tbs = Vec::new();
        for (c, steps) in rank_parts.iter().enumerate() {
            let mut split = blocks(rank, c as u32, steps)?;
            if join {
                split = merge(split);
            }
            if split.is_empty() {
                // An empty channel keeps its place, so ids stay channels.
                split.push(Block {
                    send: None,
                    recv: None,
                    chan: c as u32,
                    parts: Vec::new(),
                });
            }
            tbs.extend(split);
        }
        let outs = rank_steps(schedule, rank, rank_parts, &tbs);
        let _ = writeln!(
            xml,
            "  <gpu id=\"{rank}\" i_chunks=\"{i_chunks}\" o_chunks=\"{o_chunks}\" s_chunks=\"{}\">",
            schedule.scratch_chunks
        );
        gpu_xml(&mut xml, &tbs, &outs);
        let _ = writeln!(xml, "  </gpu>");
    }
    let _ = writeln!(xml, "</algo>");
    Ok(xml)
}

/// One GPU's threadblocks and steps.
fn gpu_xml(xml: &mut String, tbs: &[Block], outs: &[Vec<Out>]) {
    let depended: BTreeSet<(usize, usize)> = outs.iter().flatten().filter_map(|o| o.dep).collect();
    let peer = |p: Option<Rank>| p.map_or(-1, i64::from);
    let buf = |x: Option<Slice>, default: &'static str| {
        x.map_or((default, -1i64), |x| (letter(x.buffer), i64::from(x.chunk)))
    };
    for (t, (tb, steps)) in tbs.iter().zip(outs).enumerate() {
        let _ = writeln!(
            xml,
            "    <tb id=\"{t}\" send=\"{}\" recv=\"{}\" chan=\"{}\">",
            peer(tb.send),
            peer(tb.recv),
            tb.chan
        );
        for (s, o) in steps.iter().enumerate() {
            let (dt, ds) = o.dep.map_or((-1, -1), |(a, b)| (a as i64, b as i64));
            let (sb, so) = buf(o.src, "i");
            let (db, doff) = buf(o.dst, "o");
            let _ = writeln!(
                xml,
                "      <step s=\"{s}\" type=\"{}\" srcbuf=\"{sb}\" srcoff=\"{so}\" dstbuf=\"{db}\" dstoff=\"{doff}\" cnt=\"{}\" depid=\"{dt}\" deps=\"{ds}\" hasdep=\"{}\"/>",
                o.code,
                o.cnt,
                u8::from(depended.contains(&(t, s)))
            );
        }
        let _ = writeln!(xml, "    </tb>");
    }
}

/// Where a part is in a rank's program: (channel, step, part).
type PartRef = (u32, u32, usize);

/// Every threadblock's XML steps for one rank: each part's dependencies
/// (the part before it in its channel where that ran elsewhere, and for
/// a step's first part the steps its `after` names), as `nop`s and the
/// part's first XML step.
fn rank_steps(schedule: &Schedule, rank: Rank, parts: &RankParts, tbs: &[Block]) -> Vec<Vec<Out>> {
    let program = &schedule.ranks[rank as usize];
    let mut home: HashMap<PartRef, usize> = HashMap::new();
    for (t, tb) in tbs.iter().enumerate() {
        for &(i, j) in &tb.parts {
            home.insert((tb.chan, i, j), t);
        }
    }
    let last_part = |c: u32, i: u32| (c, i, parts[c as usize][i as usize].len() - 1);
    // The part before (c, i, j) in its channel's order.
    let before = |c: u32, i: u32, j: usize| -> Option<PartRef> {
        if j > 0 {
            return Some((c, i, j - 1));
        }
        i.checked_sub(1).map(|prev| last_part(c, prev))
    };
    let deps_of = |c: u32, i: u32, j: usize| -> Vec<PartRef> {
        let mut d = Vec::new();
        if let Some(b) = before(c, i, j).filter(|b| home[b] != home[&(c, i, j)]) {
            d.push(b);
        }
        if j == 0 {
            let step = &program.channels[c as usize][i as usize];
            d.extend(step.after.iter().map(|r| last_part(r.channel, r.step)));
        }
        d
    };
    // First pass: the XML index of each part's last XML step.
    let mut last: HashMap<PartRef, (usize, usize)> = HashMap::new();
    for (t, tb) in tbs.iter().enumerate() {
        let mut n = 0;
        for &(i, j) in &tb.parts {
            let p = &parts[tb.chan as usize][i as usize][j];
            n += deps_of(tb.chan, i, j).len().saturating_sub(1) + p.codes.len();
            last.insert((tb.chan, i, j), (t, n - 1));
        }
    }
    let mut outs = Vec::with_capacity(tbs.len());
    for tb in tbs {
        let mut steps = Vec::new();
        for &(i, j) in &tb.parts {
            let chunks = program.channels[tb.chan as usize][i as usize].chunks;
            let deps: Vec<(usize, usize)> =
                deps_of(tb.chan, i, j).iter().map(|k| last[k]).collect();
            let (extra, own) = match deps.split_last() {
                Some((own, extra)) => (extra.to_vec(), Some(*own)),
                None => (Vec::new(), None),
            };
            for d in extra {
                steps.push(Out {
                    code: "nop",
                    src: None,
                    dst: None,
                    cnt: 0,
                    dep: Some(d),
                });
            }
            let p = &parts[tb.chan as usize][i as usize][j];
            for (k, c) in p.codes.iter().enumerate() {
                let dep = own.filter(|_| k == 0);
                steps.push(Out {
                    code: c.code,
                    src: c.src,
                    dst: c.dst,
                    cnt: chunks,
                    dep,
                });
            }
        }
        outs.push(steps);
    }
    outs
}

fn letter(b: Buffer) -> &'static str {
    match b {
        Buffer::Input => "i",
        Buffer::Output => "o",
        Buffer::Scratch => "s",
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
