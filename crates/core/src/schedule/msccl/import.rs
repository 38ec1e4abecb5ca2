//! MSCCL records → a ferrocoll [`Schedule`]: threadblocks become
//! channels, steps become steps, dependencies become `after`.

use std::collections::{BTreeSet, HashMap};

use super::read::{Algo, Kind, XmlBuffer, XmlStep, place};
use super::{Origin, RankOrigin, Sets};
use crate::error::MscclError;
use crate::schedule::{RankProgram, Schedule, Slice, Step, StepRef};
use crate::types::{Buffer, Collective, InPlaceAlias, Rank};

/// The collective an `<algo coll="…">` names.
fn collective(algo: &Algo) -> Result<Collective, MscclError> {
    Ok(match algo.coll.as_str() {
        "allreduce" => Collective::AllReduce,
        "allgather" => Collective::AllGather,
        "reduce_scatter" | "reducescatter" => Collective::ReduceScatter,
        "alltoall" => Collective::AllToAll,
        other => {
            return Err(MscclError::Unsupported {
                at: "the `<algo>` element".into(),
                construct: format!("coll=\"{other}\""),
                why: "ferrocoll imports allreduce, allgather, reduce_scatter and alltoall \
                      (broadcast and reduce need a root, which the format does not carry)"
                    .into(),
            });
        }
    })
}

/// Chunks per block, from every GPU's declared buffer sizes.
fn chunks_per_block(algo: &Algo, coll: Collective) -> Result<u32, MscclError> {
    let n = algo.ngpus;
    let mut found: Option<u32> = None;
    for (g, gpu) in algo.gpus.iter().enumerate() {
        let at = place(gpu.line, Some(g), None, None);
        let sizes = [
            ("i_chunks", gpu.i_chunks, coll.input_blocks(n)),
            ("o_chunks", gpu.o_chunks, coll.output_blocks(n)),
        ];
        for (attr, chunks, blocks) in sizes {
            if chunks == 0 {
                continue;
            }
            if chunks % blocks != 0 {
                return Err(MscclError::Attribute {
                    at,
                    attr: attr.into(),
                    problem: format!(
                        "{chunks} is not a multiple of the {blocks} blocks of the buffer"
                    ),
                });
            }
            let cpb = chunks / blocks;
            if found.is_some_and(|f| f != cpb) {
                return Err(MscclError::Inconsistent {
                    at,
                    problem: format!(
                        "{attr}=\"{chunks}\" means {cpb} chunks per block; another buffer means {}",
                        found.unwrap_or_default()
                    ),
                });
            }
            found = Some(cpb);
        }
    }
    found.ok_or_else(|| MscclError::Inconsistent {
        at: "the `<gpu>` elements".into(),
        problem: "every i_chunks and o_chunks is 0: no buffer to work on".into(),
    })
}

/// The ferrocoll channel of each threadblock (`[gpu][tb]`). A message
/// travels on one channel number at both ends, while MSCCL pairs a
/// sending and a receiving threadblock by (peer, `chan`) whatever their
/// ids: threadblocks joined by a connection share a channel. Where the
/// ids already agree, a threadblock keeps its id as its channel.
fn channels(algo: &Algo) -> Result<Vec<Vec<u32>>, MscclError> {
    let mut receivers: Vec<HashMap<(Rank, u32), usize>> = Vec::new();
    let mut senders: Vec<HashMap<(Rank, u32), usize>> = Vec::new();
    for (g, gpu) in algo.gpus.iter().enumerate() {
        let (mut rx, mut tx) = (HashMap::new(), HashMap::new());
        for (t, tb) in gpu.tbs.iter().enumerate() {
            let at = || place(tb.line, Some(g), Some(t), None);
            for (peer, map, way) in [
                (tb.recv, &mut rx, "receive from"),
                (tb.send, &mut tx, "send to"),
            ] {
                if let Some(p) = peer
                    && let Some(other) = map.insert((p, tb.chan), t)
                {
                    return Err(MscclError::Inconsistent {
                        at: at(),
                        problem: format!(
                            "threadblocks {other} and {t} both {way} GPU {p} on channel {}",
                            tb.chan
                        ),
                    });
                }
            }
        }
        receivers.push(rx);
        senders.push(tx);
    }
    let mut pairs = Vec::new();
    for (g, gpu) in algo.gpus.iter().enumerate() {
        for (t, tb) in gpu.tbs.iter().enumerate() {
            let at = || place(tb.line, Some(g), Some(t), None);
            if let Some(p) = tb.send {
                let Some(&u) = receivers[p as usize].get(&(g as Rank, tb.chan)) else {
                    return Err(MscclError::Inconsistent {
                        at: at(),
                        problem: format!(
                            "sends to GPU {p} on channel {}, where no threadblock receives from GPU {g}",
                            tb.chan
                        ),
                    });
                };
                pairs.push(((g, t), (p as usize, u)));
            }
            if let Some(p) = tb.recv
                && !senders[p as usize].contains_key(&(g as Rank, tb.chan))
            {
                return Err(MscclError::Inconsistent {
                    at: at(),
                    problem: format!(
                        "receives from GPU {p} on channel {}, where no threadblock sends to GPU {g}",
                        tb.chan
                    ),
                });
            }
        }
    }
    if pairs.iter().all(|((_, a), (_, b))| a == b) {
        return Ok(algo
            .gpus
            .iter()
            .map(|g| (0..g.tbs.len() as u32).collect())
            .collect());
    }
    joined(algo, &pairs)
}

/// A sending threadblock and the receiving one it is connected to, as
/// ((gpu, tb), (gpu, tb)).
type Connection = ((usize, usize), (usize, usize));

/// Channels by connected threadblocks (union-find), numbered in order of
/// first appearance; two threadblocks of one GPU joined by a chain of
/// connections cannot share one channel number.
fn joined(algo: &Algo, pairs: &[Connection]) -> Result<Vec<Vec<u32>>, MscclError> {
    let mut first = Vec::with_capacity(algo.gpus.len());
    let mut total = 0;
    for gpu in &algo.gpus {
        first.push(total);
        total += gpu.tbs.len();
    }
    let mut sets = Sets::new(total);
    for &((g, t), (h, u)) in pairs {
        sets.join(first[g] + t, first[h] + u);
    }
    // The classes in order of first appearance, each with its members.
    let mut class_of: HashMap<usize, usize> = HashMap::new();
    let mut classes: Vec<Vec<(usize, usize)>> = Vec::new();
    for (g, gpu) in algo.gpus.iter().enumerate() {
        for t in 0..gpu.tbs.len() {
            let r = sets.root(first[g] + t);
            let next = classes.len();
            let c = *class_of.entry(r).or_insert(next);
            if c == classes.len() {
                classes.push(Vec::new());
            }
            classes[c].push((g, t));
        }
    }
    // Each class takes the smallest number none of its GPUs uses yet, so
    // a GPU's channels stay about as many as its threadblocks.
    let mut used: Vec<std::collections::HashSet<u32>> = vec![Default::default(); algo.gpus.len()];
    let mut out: Vec<Vec<u32>> = algo.gpus.iter().map(|g| vec![0; g.tbs.len()]).collect();
    for members in &classes {
        let mut on: HashMap<usize, usize> = HashMap::new();
        for &(g, t) in members {
            if let Some(other) = on.insert(g, t) {
                return Err(MscclError::Unsupported {
                    at: place(algo.gpus[g].tbs[t].line, Some(g), Some(t), None),
                    construct: format!(
                        "threadblocks {other} and {t} of GPU {g} on one chain of connections"
                    ),
                    why: "a ferrocoll message keeps one channel number at both ends, so the \
                          threadblocks a chain of connections joins become one channel, which \
                          a GPU cannot run twice"
                        .into(),
                });
            }
        }
        let mut k = 0;
        while on.keys().any(|&g| used[g].contains(&k)) {
            k += 1;
        }
        if k >= super::read::MAX_THREADBLOCKS {
            let (g, t) = members[0];
            return Err(MscclError::Unsupported {
                at: place(algo.gpus[g].tbs[t].line, Some(g), Some(t), None),
                construct: format!("a channel numbered {k}"),
                why: format!(
                    "connections tie threadblocks across GPUs so that this one needs a channel \
                     number past {}",
                    super::read::MAX_THREADBLOCKS
                ),
            });
        }
        for &(g, t) in members {
            used[g].insert(k);
            out[g][t] = k;
        }
    }
    Ok(out)
}

/// Nops one GPU's dependencies may walk in all: far above what
/// msccl-tools writes, far below a hostile chain's square.
const DEPENDENCY_WORK: u64 = 20_000_000;

/// One GPU's conversion state.
struct Gpu<'a> {
    algo: &'a Algo,
    coll: Collective,
    cpb: u32,
    rank: Rank,
    chans: &'a [u32],
    /// `index[tb][s]`: the ferrocoll step an XML step became (`None`: a nop).
    index: Vec<Vec<Option<u32>>>,
    /// What resolving dependencies may still walk on this GPU: nops can
    /// chain so that every step re-walks a long run of them.
    budget: std::cell::Cell<u64>,
}

impl Gpu<'_> {
    fn tbs(&self) -> &[super::read::Tb] {
        &self.algo.gpus[self.rank as usize].tbs
    }

    fn at(&self, t: usize, s: usize) -> String {
        let step = &self.tbs()[t].steps[s];
        place(step.line, Some(self.rank as usize), Some(t), Some(s))
    }

    fn slice(&self, (buffer, chunk): (XmlBuffer, u32)) -> Slice {
        match buffer {
            XmlBuffer::Input if self.algo.inplace => match self.coll.in_place_alias(self.rank) {
                Some(InPlaceAlias::InputIsOutputBlock(b)) => Slice {
                    buffer: Buffer::Output,
                    chunk: b.saturating_mul(self.cpb).saturating_add(chunk),
                },
                // Refused before any step is converted.
                _ => Slice {
                    buffer: Buffer::Input,
                    chunk,
                },
            },
            XmlBuffer::Input => Slice {
                buffer: Buffer::Input,
                chunk,
            },
            XmlBuffer::Output => Slice {
                buffer: Buffer::Output,
                chunk,
            },
            XmlBuffer::Scratch => Slice {
                buffer: Buffer::Scratch,
                chunk,
            },
        }
    }

    /// Whether step `s` of a threadblock is a copy the next step sends
    /// on unchanged: the two are one ferrocoll step (read, write, send).
    fn merges(steps: &[XmlStep], s: usize) -> bool {
        let (Some(a), Some(b)) = (steps.get(s), steps.get(s + 1)) else {
            return false;
        };
        // The send reads what the copy read: only when the copy did not
        // write over it.
        let apart = a.src.0 != a.dst.0
            || u64::from(a.src.1) + u64::from(a.cnt) <= u64::from(a.dst.1)
            || u64::from(a.dst.1) + u64::from(a.cnt) <= u64::from(a.src.1);
        a.kind == Kind::Copy
            && b.kind == Kind::Send
            && b.dep.is_none()
            && a.src == b.src
            && a.cnt == b.cnt
            && apart
    }

    fn number_steps(&mut self) {
        self.index = self
            .tbs()
            .iter()
            .map(|tb| {
                let mut next = 0;
                let mut out = Vec::with_capacity(tb.steps.len());
                let mut s = 0;
                while s < tb.steps.len() {
                    if tb.steps[s].kind == Kind::Nop {
                        out.push(None);
                    } else if Self::merges(&tb.steps, s) {
                        out.extend([Some(next), Some(next)]);
                        next += 1;
                        s += 1;
                    } else {
                        out.push(Some(next));
                        next += 1;
                    }
                    s += 1;
                }
                out
            })
            .collect();
    }

    /// What finishing step `s` of threadblock `t` implies, as ferrocoll
    /// steps: the step itself, or for a nop the real step before it and
    /// what the nops since depend on. A worklist, not recursion: a hostile
    /// file may chain nops as deep as it likes.
    fn resolve(
        &self,
        from: (usize, usize),
        dep: (u32, u32),
        seen: &mut BTreeSet<(u32, u32)>,
        out: &mut BTreeSet<StepRef>,
    ) -> Result<(), MscclError> {
        let mut work = vec![dep];
        while let Some((t, s)) = work.pop() {
            let exists = self
                .tbs()
                .get(t as usize)
                .is_some_and(|tb| (s as usize) < tb.steps.len());
            if !exists {
                return Err(MscclError::Inconsistent {
                    at: self.at(from.0, from.1),
                    problem: format!("depends on threadblock {t} step {s}, which does not exist"),
                });
            }
            if !seen.insert((t, s)) {
                continue;
            }
            let channel = self.chans[t as usize];
            let steps = &self.tbs()[t as usize].steps;
            for j in (0..=s as usize).rev() {
                self.spend(from)?;
                // What an earlier visit walked past is already in `out`.
                if j != s as usize && !seen.insert((t, j as u32)) {
                    break;
                }
                if let Some(step) = self.index[t as usize][j] {
                    out.insert(StepRef { channel, step });
                    break;
                }
                work.extend(steps[j].dep);
            }
        }
        Ok(())
    }

    /// One unit of dependency walking, or the error when the GPU's
    /// budget is spent.
    fn spend(&self, from: (usize, usize)) -> Result<(), MscclError> {
        let left = self.budget.get();
        if left == 0 {
            return Err(MscclError::Unsupported {
                at: self.at(from.0, from.1),
                construct: "dependencies through chains of nops this long".into(),
                why: format!(
                    "resolving them walked {DEPENDENCY_WORK} nops on one GPU (msccl-tools \
                     writes a few per step)"
                ),
            });
        }
        self.budget.set(left - 1);
        Ok(())
    }

    /// The `after` list of the real step at `s` of threadblock `t`: its
    /// own dependency and those of the nops just before it.
    fn after(&self, t: usize, s: usize) -> Result<Vec<StepRef>, MscclError> {
        let steps = &self.tbs()[t].steps;
        let mut refs = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let mut j = s;
        loop {
            if let Some(dep) = steps[j].dep {
                self.resolve((t, s), dep, &mut seen, &mut refs)?;
            }
            if j == 0 || steps[j - 1].kind != Kind::Nop {
                break;
            }
            j -= 1;
        }
        let own = StepRef {
            channel: self.chans[t],
            step: self.index[t][s].unwrap_or(0),
        };
        let mut after = Vec::with_capacity(refs.len());
        for r in refs {
            if r.channel != own.channel {
                after.push(r);
            } else if r.step >= own.step {
                return Err(MscclError::Inconsistent {
                    at: self.at(t, s),
                    problem: "depends on itself or a later step of its own threadblock".into(),
                });
            }
        }
        Ok(after)
    }

    fn step(&self, t: usize, s: usize) -> Result<Step, MscclError> {
        let tb = &self.tbs()[t];
        let x = &tb.steps[s];
        if x.kind == Kind::LocalReduce {
            return Err(MscclError::Unsupported {
                at: self.at(t, s),
                construct: "step type `re` (local reduce)".into(),
                why: "it combines two local buffers (dst = dst op src), and a ferrocoll step \
                      combines received messages with one local slice; receive into the \
                      reduction instead (`rrc`), as ring and halving-doubling programs do"
                    .into(),
            });
        }
        let merged = Self::merges(&tb.steps, s);
        let sends = x.kind.sends() || merged;
        Ok(Step {
            recv_from: tb.recv.filter(|_| x.kind.receives()).into_iter().collect(),
            read: x.kind.reads().then(|| self.slice(x.src)),
            write: x.kind.writes().then(|| self.slice(x.dst)),
            send_to: tb.send.filter(|_| sends).into_iter().collect(),
            chunks: x.cnt,
            after: self.after(t, s)?,
        })
    }

    /// The rank's program, with each ferrocoll step's XML origin.
    fn program(&self) -> Result<(RankProgram, RankOrigin), MscclError> {
        let count = self
            .chans
            .iter()
            .map(|&c| c as usize + 1)
            .max()
            .unwrap_or(0);
        let mut channels = vec![Vec::new(); count];
        let mut origin = vec![Vec::new(); count];
        for (t, tb) in self.tbs().iter().enumerate() {
            let c = self.chans[t] as usize;
            let mut s = 0;
            while s < tb.steps.len() {
                if tb.steps[s].kind == Kind::Nop {
                    s += 1;
                    continue;
                }
                channels[c].push(self.step(t, s)?);
                let mut from = vec![(t as u32, s as u32)];
                if Self::merges(&tb.steps, s) {
                    s += 1;
                    from.push((t as u32, s as u32));
                }
                origin[c].push(from);
                s += 1;
            }
        }
        Ok((RankProgram { channels }, origin))
    }
}

/// The in-place prologue: an algorithm written for in-place calls works
/// on its input where the output holds it, so an out-of-place call first
/// copies the input there (a no-op in place); every channel waits for it.
///
/// The copy goes on a channel of its own after each rank's last: returns
/// that channel per rank.
fn add_prologue(schedule: &mut Schedule) -> Vec<Option<u32>> {
    let cpb = schedule.chunks_per_block;
    let mut at = Vec::with_capacity(schedule.ranks.len());
    for (rank, program) in schedule.ranks.iter_mut().enumerate() {
        let Some(InPlaceAlias::InputIsOutputBlock(b)) =
            schedule.collective.in_place_alias(rank as Rank)
        else {
            at.push(None);
            continue;
        };
        let channel = program.channels.len() as u32;
        for steps in &mut program.channels {
            if let Some(first) = steps.first_mut() {
                first.after.push(StepRef { channel, step: 0 });
            }
        }
        program.channels.push(vec![
            Step::new(cpb)
                .read(Buffer::Input, 0)
                .write(Buffer::Output, b.saturating_mul(cpb)),
        ]);
        at.push(Some(channel));
    }
    at
}

/// Convert parsed records into a schedule and where each step came from.
pub(super) fn convert(algo: &Algo) -> Result<(Schedule, Origin), MscclError> {
    let coll = collective(algo)?;
    if algo.inplace
        && !matches!(
            coll.in_place_alias(0),
            Some(InPlaceAlias::InputIsOutputBlock(_))
        )
    {
        return Err(MscclError::Unsupported {
            at: "the `<algo>` element".into(),
            construct: format!("inplace=\"1\" for coll=\"{}\"", algo.coll),
            why: "an in-place program of this collective works inside the input buffer, which \
                  ferrocoll never writes; write it out of place"
                .into(),
        });
    }
    let cpb = chunks_per_block(algo, coll)?;
    let chans = channels(algo)?;
    let mut ranks = Vec::with_capacity(algo.gpus.len());
    let mut origin = Vec::with_capacity(algo.gpus.len());
    for (g, chans) in chans.iter().enumerate() {
        let mut gpu = Gpu {
            algo,
            coll,
            cpb,
            rank: g as Rank,
            chans,
            index: Vec::new(),
            budget: std::cell::Cell::new(DEPENDENCY_WORK),
        };
        gpu.number_steps();
        let (program, from) = gpu.program()?;
        ranks.push(program);
        origin.push(from);
    }
    let mut schedule = Schedule {
        name: algo.name.clone(),
        collective: coll,
        world_size: algo.ngpus,
        chunks_per_block: cpb,
        scratch_chunks: algo.gpus.iter().map(|g| g.s_chunks).max().unwrap_or(0),
        ranks,
    };
    let prologue = if algo.inplace {
        add_prologue(&mut schedule)
    } else {
        vec![None; schedule.ranks.len()]
    };
    let lines = algo
        .gpus
        .iter()
        .map(|g| {
            g.tbs
                .iter()
                .map(|tb| tb.steps.iter().map(|s| s.line).collect())
                .collect()
        })
        .collect();
    Ok((
        schedule,
        Origin {
            steps: origin,
            lines,
            prologue,
        },
    ))
}
