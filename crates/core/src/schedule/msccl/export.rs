//! A ferrocoll [`Schedule`] → MSCCL's algorithm XML, with every
//! attribute MSCCL's runtime reads.
//!
//! A channel becomes one threadblock (`tb id` = channel) where its steps
//! talk to at most one peer each way; otherwise its steps are split into
//! threadblocks by peer, and the channel's order is kept by dependencies.
//! A step that copies a local slice and sends it becomes `cpy` then `s`;
//! more than one dependency becomes `nop` steps carrying the rest.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

use super::Sets;
use crate::error::MscclError;
use crate::schedule::{Schedule, Slice, Step, StepAt};
use crate::types::{Buffer, Collective, Rank};

/// A threadblock being written.
struct Block {
    send: Option<Rank>,
    recv: Option<Rank>,
    chan: u32,
    /// Indices of the channel's steps it runs, in order.
    steps: Vec<u32>,
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

/// MSCCL's step type(s) for a ferrocoll step: one, or `cpy` then `s`.
fn codes(at: StepAt, step: &Step) -> Result<&'static [&'static str], MscclError> {
    if step.recv_from.len() > 1 || step.send_to.len() > 1 {
        return Err(inexpressible(
            at,
            format!(
                "receives from {:?} and sends to {:?} in one step; an MSCCL step talks to its \
                 threadblock's one peer each way",
                step.recv_from, step.send_to
            ),
        ));
    }
    let recv = !step.recv_from.is_empty();
    let send = !step.send_to.is_empty();
    Ok(
        match (recv, step.read.is_some(), step.write.is_some(), send) {
            (false, true, false, true) => &["s"],
            (false, true, true, true) => &["cpy", "s"],
            (false, true, true, false) => &["cpy"],
            (true, false, true, false) => &["r"],
            (true, false, true, true) => &["rcs"],
            (true, true, false, true) => &["rrs"],
            (true, true, true, false) => &["rrc"],
            (true, true, true, true) => &["rrcs"],
            (true, false, false, true) => {
                return Err(inexpressible(
                    at,
                    "forwards a message without storing it; MSCCL has no receive-and-send step without a copy",
                ));
            }
            _ => return Err(inexpressible(at, "has no input or no effect")),
        },
    )
}

/// Split one channel's steps into threadblocks: steps that share a peer
/// share a threadblock; local steps join the one before them.
fn blocks(schedule: &Schedule, rank: Rank, channel: u32) -> Result<Vec<Block>, MscclError> {
    let steps = &schedule.ranks[rank as usize].channels[channel as usize];
    let n = steps.len();
    let mut sets = Sets::new(n);
    let talks = |s: &Step| !(s.send_to.is_empty() && s.recv_from.is_empty());
    let mut by_peer: HashMap<(bool, Rank), usize> = HashMap::new();
    for (i, s) in steps.iter().enumerate() {
        let keys = s.send_to.iter().map(|&p| (true, p));
        for key in keys.chain(s.recv_from.iter().map(|&p| (false, p))) {
            match by_peer.get(&key) {
                Some(&j) => sets.join(i, j),
                None => {
                    by_peer.insert(key, i);
                }
            }
        }
    }
    // Local steps run in the threadblock of the talking step before them
    // (or of the first one).
    let first_talking = steps.iter().position(talks).unwrap_or(0);
    let mut anchor = first_talking;
    for (i, s) in steps.iter().enumerate() {
        if talks(s) {
            anchor = i;
        } else {
            sets.join(i, anchor);
        }
    }
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut out: Vec<Block> = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let r = sets.root(i);
        let next = out.len();
        let b = *index.entry(r).or_insert(next);
        if b == out.len() {
            out.push(Block {
                send: None,
                recv: None,
                chan: channel,
                steps: Vec::new(),
            });
        }
        let at = StepAt {
            rank,
            channel,
            index: i as u32,
        };
        let block = &mut out[b];
        for (mine, theirs, way) in [
            (&mut block.send, s.send_to.first(), "sends to"),
            (&mut block.recv, s.recv_from.first(), "receives from"),
        ] {
            if let Some(&p) = theirs {
                match *mine {
                    Some(q) if q != p => {
                        return Err(inexpressible(
                            at,
                            format!(
                                "its channel {way} ranks {q} and {p} through steps that also share a \
                                 peer; an MSCCL threadblock has one peer each way"
                            ),
                        ));
                    }
                    _ => *mine = Some(p),
                }
            }
        }
        block.steps.push(i as u32);
    }
    Ok(out)
}

/// Write `schedule` as MSCCL XML (`inplace="0"`, protocol `Simple`).
pub(super) fn write(schedule: &Schedule) -> Result<String, MscclError> {
    let coll = coll(schedule.collective)?;
    for (at, step) in schedule.steps() {
        codes(at, step)?;
    }
    // Threadblocks of every rank, and where each ferrocoll step lands.
    let mut all: Vec<Vec<Block>> = Vec::new();
    for rank in 0..schedule.world_size {
        let mut tbs = Vec::new();
        for c in 0..schedule.ranks[rank as usize].channels.len() as u32 {
            let mut split = blocks(schedule, rank, c)?;
            if split.is_empty() {
                // An empty channel keeps its place, so ids stay channels.
                split.push(Block {
                    send: None,
                    recv: None,
                    chan: c,
                    steps: Vec::new(),
                });
            }
            tbs.extend(split);
        }
        all.push(tbs);
    }
    let mut xml = String::new();
    let nchannels = schedule.channel_count().max(1);
    let i_chunks = schedule.buffer_chunks(Buffer::Input);
    let o_chunks = schedule.buffer_chunks(Buffer::Output);
    let _ = writeln!(
        xml,
        "<algo name=\"{}\" proto=\"Simple\" nchannels=\"{nchannels}\" nchunksperloop=\"{}\" ngpus=\"{}\" coll=\"{coll}\" inplace=\"0\">",
        escape(&schedule.name),
        i_chunks.max(o_chunks),
        schedule.world_size
    );
    for (rank, tbs) in all.iter().enumerate() {
        let outs = rank_steps(schedule, rank as Rank, tbs)?;
        let _ = writeln!(
            xml,
            "  <gpu id=\"{rank}\" i_chunks=\"{i_chunks}\" o_chunks=\"{o_chunks}\" s_chunks=\"{}\">",
            schedule.scratch_chunks
        );
        let depended: BTreeSet<(usize, usize)> =
            outs.iter().flatten().filter_map(|o| o.dep).collect();
        for (t, (tb, steps)) in tbs.iter().zip(&outs).enumerate() {
            let peer = |p: Option<Rank>| p.map_or(-1, i64::from);
            let _ = writeln!(
                xml,
                "    <tb id=\"{t}\" send=\"{}\" recv=\"{}\" chan=\"{}\">",
                peer(tb.send),
                peer(tb.recv),
                tb.chan
            );
            for (s, o) in steps.iter().enumerate() {
                let (dt, ds) = o.dep.map_or((-1, -1), |(a, b)| (a as i64, b as i64));
                let buf = |x: Option<Slice>, default: &'static str| {
                    x.map_or((default, -1i64), |x| (letter(x.buffer), i64::from(x.chunk)))
                };
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
        let _ = writeln!(xml, "  </gpu>");
    }
    let _ = writeln!(xml, "</algo>");
    Ok(xml)
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

/// Every threadblock's XML steps for one rank.
fn rank_steps(schedule: &Schedule, rank: Rank, tbs: &[Block]) -> Result<Vec<Vec<Out>>, MscclError> {
    let program = &schedule.ranks[rank as usize];
    // Where each (channel, step) lands: (tb, first XML step index), and
    // its dependencies as ferrocoll steps.
    let mut home: HashMap<(u32, u32), usize> = HashMap::new();
    for (t, tb) in tbs.iter().enumerate() {
        for &i in &tb.steps {
            home.insert((tb.chan, i), t);
        }
    }
    let deps_of = |c: u32, i: u32| -> Vec<(u32, u32)> {
        let step = &program.channels[c as usize][i as usize];
        let mut d: Vec<(u32, u32)> = Vec::new();
        if i > 0 && home[&(c, i - 1)] != home[&(c, i)] {
            d.push((c, i - 1));
        }
        d.extend(step.after.iter().map(|r| (r.channel, r.step)));
        d
    };
    let entry = |channel: u32, index: u32| {
        let at = StepAt {
            rank,
            channel,
            index,
        };
        (at, &program.channels[channel as usize][index as usize])
    };
    // First pass: the XML index of each ferrocoll step's last XML step.
    let mut last: HashMap<(u32, u32), (usize, usize)> = HashMap::new();
    for (t, tb) in tbs.iter().enumerate() {
        let mut n = 0;
        for &i in &tb.steps {
            let (at, step) = entry(tb.chan, i);
            n += deps_of(tb.chan, i).len().saturating_sub(1) + codes(at, step)?.len();
            last.insert((tb.chan, i), (t, n - 1));
        }
    }
    let mut outs = Vec::with_capacity(tbs.len());
    for tb in tbs {
        let mut steps = Vec::new();
        for &i in &tb.steps {
            let (at, step) = entry(tb.chan, i);
            let deps: Vec<(usize, usize)> = deps_of(tb.chan, i).iter().map(|k| last[k]).collect();
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
            for (k, &code) in codes(at, step)?.iter().enumerate() {
                let (src, dst) = match code {
                    "s" | "rrs" => (step.read, step.read),
                    "r" | "rcs" => (step.write, step.write),
                    _ => (step.read, step.write),
                };
                steps.push(Out {
                    code,
                    src,
                    dst,
                    cnt: step.chunks,
                    dep: own.filter(|_| k == 0),
                });
            }
        }
        outs.push(steps);
    }
    Ok(outs)
}
