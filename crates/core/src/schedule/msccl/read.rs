//! MSCCL's algorithm document as plain records: every attribute the
//! import needs, parsed and range-checked, with the line it came from.

use std::str::FromStr;

use crate::error::MscclError;
use crate::types::Rank;
use crate::xml::Element;

/// The most GPUs an imported algorithm may have (the largest world the
/// library generates schedules for; MSCCL's programs have a few dozen).
pub(super) const MAX_GPUS: usize = 1024;

/// The most threadblocks a GPU may have, and the highest channel number
/// an import may need (MSCCL itself runs at most 108 threadblocks): the
/// schedule holds a list per channel on every rank, so these two bound
/// what a small hostile file can make the import allocate.
pub(super) const MAX_THREADBLOCKS: u32 = 1024;

/// The `<algo>` element.
#[derive(Debug)]
pub(super) struct Algo {
    pub name: String,
    pub coll: String,
    pub ngpus: u32,
    pub inplace: bool,
    /// `gpus[g]` is the `<gpu id="g">` element.
    pub gpus: Vec<Gpu>,
}

/// A `<gpu>` element.
#[derive(Debug)]
pub(super) struct Gpu {
    pub i_chunks: u32,
    pub o_chunks: u32,
    pub s_chunks: u32,
    /// `tbs[t]` is the `<tb id="t">` element.
    pub tbs: Vec<Tb>,
    pub line: usize,
}

/// A `<tb>` (threadblock): one peer to send to, one to receive from.
#[derive(Debug)]
pub(super) struct Tb {
    pub send: Option<Rank>,
    pub recv: Option<Rank>,
    pub chan: u32,
    pub steps: Vec<XmlStep>,
    pub line: usize,
}

/// What a step does, by MSCCL's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Send,
    Recv,
    RecvCopySend,
    RecvReduceSend,
    RecvReduceCopy,
    RecvReduceCopySend,
    Copy,
    LocalReduce,
    Nop,
}

impl Kind {
    fn parse(text: &str) -> Option<Kind> {
        Some(match text {
            "s" => Kind::Send,
            "r" => Kind::Recv,
            "rcs" => Kind::RecvCopySend,
            "rrs" => Kind::RecvReduceSend,
            "rrc" => Kind::RecvReduceCopy,
            "rrcs" => Kind::RecvReduceCopySend,
            "cpy" => Kind::Copy,
            "re" => Kind::LocalReduce,
            "nop" => Kind::Nop,
            _ => return None,
        })
    }

    /// MSCCL's name of the type.
    pub(super) fn code(self) -> &'static str {
        match self {
            Kind::Send => "s",
            Kind::Recv => "r",
            Kind::RecvCopySend => "rcs",
            Kind::RecvReduceSend => "rrs",
            Kind::RecvReduceCopy => "rrc",
            Kind::RecvReduceCopySend => "rrcs",
            Kind::Copy => "cpy",
            Kind::LocalReduce => "re",
            Kind::Nop => "nop",
        }
    }

    pub(super) fn receives(self) -> bool {
        matches!(
            self,
            Kind::Recv
                | Kind::RecvCopySend
                | Kind::RecvReduceSend
                | Kind::RecvReduceCopy
                | Kind::RecvReduceCopySend
        )
    }

    pub(super) fn sends(self) -> bool {
        matches!(
            self,
            Kind::Send | Kind::RecvCopySend | Kind::RecvReduceSend | Kind::RecvReduceCopySend
        )
    }

    /// Whether the step reads its `src` (the local operand).
    pub(super) fn reads(self) -> bool {
        matches!(
            self,
            Kind::Send
                | Kind::RecvReduceSend
                | Kind::RecvReduceCopy
                | Kind::RecvReduceCopySend
                | Kind::Copy
                | Kind::LocalReduce
        )
    }

    /// Whether the step stores to its `dst`.
    pub(super) fn writes(self) -> bool {
        matches!(
            self,
            Kind::Recv
                | Kind::RecvCopySend
                | Kind::RecvReduceCopy
                | Kind::RecvReduceCopySend
                | Kind::Copy
                | Kind::LocalReduce
        )
    }
}

/// One of MSCCL's three buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum XmlBuffer {
    Input,
    Output,
    Scratch,
}

/// A `<step>`.
#[derive(Debug)]
pub(super) struct XmlStep {
    pub kind: Kind,
    pub src: (XmlBuffer, u32),
    pub dst: (XmlBuffer, u32),
    pub cnt: u32,
    /// `(depid, deps)`: a step of another threadblock of this GPU that
    /// must have finished first.
    pub dep: Option<(u32, u32)>,
    pub line: usize,
}

/// Where an element sits, for errors: `gpu 0 tb 1 step 3 (line 12)`.
pub(super) fn place(
    line: usize,
    gpu: Option<usize>,
    tb: Option<usize>,
    step: Option<usize>,
) -> String {
    let mut at = String::new();
    for (name, v) in [("gpu", gpu), ("tb", tb), ("step", step)] {
        if let Some(v) = v {
            at.push_str(&format!("{name} {v} "));
        }
    }
    format!("{at}(line {line})")
}

fn attribute(at: &str, attr: &str, problem: impl Into<String>) -> MscclError {
    MscclError::Attribute {
        at: at.to_owned(),
        attr: attr.to_owned(),
        problem: problem.into(),
    }
}

/// Refuse a child element other than `want` by name.
fn only(child: &Element, want: &str, inside: &str, at: &str) -> Result<(), MscclError> {
    if child.name == want {
        return Ok(());
    }
    Err(MscclError::Unsupported {
        at: at.to_owned(),
        construct: format!("element `<{}>` inside `<{inside}>`", child.name),
        why: format!("`<{inside}>` holds only `<{want}>` elements in MSCCL's format"),
    })
}

fn required<'a>(el: &'a Element, at: &str, attr: &str) -> Result<&'a str, MscclError> {
    el.attr(attr)
        .ok_or_else(|| attribute(at, attr, "is missing"))
}

fn number<T: FromStr>(el: &Element, at: &str, attr: &str) -> Result<T, MscclError> {
    let text = required(el, at, attr)?;
    text.trim()
        .parse()
        .map_err(|_| attribute(at, attr, format!("`{text}` is not a number in range")))
}

/// A peer attribute: `-1` for none, else a rank below `ngpus` other than `own`.
fn peer(
    el: &Element,
    at: &str,
    attr: &str,
    ngpus: u32,
    own: usize,
) -> Result<Option<Rank>, MscclError> {
    let v: i64 = number(el, at, attr)?;
    match v {
        -1 => Ok(None),
        v if v >= 0 && v < i64::from(ngpus) && v as usize != own => Ok(Some(v as Rank)),
        v if v as usize == own => Err(attribute(at, attr, "names the GPU itself")),
        _ => Err(attribute(
            at,
            attr,
            format!("`{v}` is not -1 or a GPU below {ngpus}"),
        )),
    }
}

/// Parse the document's root into records, checking ids and ranges.
pub(super) fn algo(root: &Element) -> Result<Algo, MscclError> {
    let at = place(root.line, None, None, None);
    if root.name != "algo" {
        return Err(MscclError::Inconsistent {
            at,
            problem: format!(
                "the root element is `<{}>`, not MSCCL's `<algo>`",
                root.name
            ),
        });
    }
    let ngpus: u32 = number(root, &at, "ngpus")?;
    // Every GPU needs its element: that bounds what is allocated below.
    if ngpus == 0 || ngpus as usize > root.children.len() || ngpus as usize > MAX_GPUS {
        return Err(attribute(
            &at,
            "ngpus",
            format!(
                "is {ngpus} with {} `<gpu>` elements (at most {MAX_GPUS})",
                root.children.len()
            ),
        ));
    }
    let inplace = match required(root, &at, "inplace")?.trim() {
        "0" => false,
        "1" => true,
        other => {
            return Err(attribute(
                &at,
                "inplace",
                format!("`{other}` is not 0 or 1"),
            ));
        }
    };
    let mut gpus: Vec<Option<Gpu>> = (0..ngpus).map(|_| None).collect();
    for el in &root.children {
        let at = place(el.line, None, None, None);
        only(el, "gpu", "algo", &at)?;
        let id: usize = number(el, &at, "id")?;
        if id >= ngpus as usize {
            return Err(attribute(
                &at,
                "id",
                format!("GPU {id} of an algorithm for {ngpus}"),
            ));
        }
        if gpus[id].is_some() {
            return Err(MscclError::Inconsistent {
                at,
                problem: format!("GPU {id} appears twice"),
            });
        }
        gpus[id] = Some(gpu(el, id, ngpus)?);
    }
    let gpus = gpus
        .into_iter()
        .enumerate()
        .map(|(g, gpu)| {
            gpu.ok_or_else(|| MscclError::Inconsistent {
                at: place(root.line, None, None, None),
                problem: format!("no `<gpu id=\"{g}\">` in an algorithm for {ngpus} GPUs"),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Algo {
        name: root.attr("name").unwrap_or("msccl").to_owned(),
        coll: required(root, &at, "coll")?.trim().to_owned(),
        ngpus,
        inplace,
        gpus,
    })
}

fn gpu(el: &Element, id: usize, ngpus: u32) -> Result<Gpu, MscclError> {
    let at = place(el.line, Some(id), None, None);
    let chunks = |attr| number::<u32>(el, &at, attr);
    let (i_chunks, o_chunks, s_chunks) = (
        chunks("i_chunks")?,
        chunks("o_chunks")?,
        chunks("s_chunks")?,
    );
    let mut tbs: Vec<Option<Tb>> = Vec::new();
    for t in &el.children {
        let at = place(t.line, Some(id), None, None);
        only(t, "tb", "gpu", &at)?;
        let tb_id: usize = number(t, &at, "id")?;
        if tb_id >= el.children.len() || tb_id >= MAX_THREADBLOCKS as usize {
            return Err(attribute(
                &at,
                "id",
                format!(
                    "threadblock {tb_id} of a GPU with {} (at most {MAX_THREADBLOCKS})",
                    el.children.len()
                ),
            ));
        }
        tbs.resize_with(tbs.len().max(tb_id + 1), || None);
        if tbs[tb_id].is_some() {
            return Err(MscclError::Inconsistent {
                at,
                problem: format!("threadblock {tb_id} appears twice"),
            });
        }
        tbs[tb_id] = Some(tb(t, id, tb_id, ngpus)?);
    }
    let tbs = tbs
        .into_iter()
        .enumerate()
        .map(|(t, tb)| {
            tb.ok_or_else(|| MscclError::Inconsistent {
                at: place(el.line, Some(id), None, None),
                problem: format!("threadblock ids skip {t}"),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Gpu {
        i_chunks,
        o_chunks,
        s_chunks,
        tbs,
        line: el.line,
    })
}

fn tb(el: &Element, gpu: usize, id: usize, ngpus: u32) -> Result<Tb, MscclError> {
    let at = place(el.line, Some(gpu), Some(id), None);
    let send = peer(el, &at, "send", ngpus, gpu)?;
    let recv = peer(el, &at, "recv", ngpus, gpu)?;
    let chan: u32 = number(el, &at, "chan")?;
    let mut steps = Vec::with_capacity(el.children.len());
    for (i, s) in el.children.iter().enumerate() {
        let at = place(s.line, Some(gpu), Some(id), Some(i));
        only(s, "step", "tb", &at)?;
        let index: usize = number(s, &at, "s")?;
        if index != i {
            return Err(attribute(
                &at,
                "s",
                format!("is {index} for the threadblock's step {i}: steps are numbered in order"),
            ));
        }
        steps.push(step(s, &at, send, recv)?);
    }
    Ok(Tb {
        send,
        recv,
        chan,
        steps,
        line: el.line,
    })
}

fn buffer(el: &Element, at: &str, attr: &str) -> Result<XmlBuffer, MscclError> {
    match required(el, at, attr)?.trim() {
        "i" => Ok(XmlBuffer::Input),
        "o" => Ok(XmlBuffer::Output),
        "s" => Ok(XmlBuffer::Scratch),
        other => Err(attribute(
            at,
            attr,
            format!("`{other}` is not `i`, `o` or `s`"),
        )),
    }
}

fn step(
    el: &Element,
    at: &str,
    send: Option<Rank>,
    recv: Option<Rank>,
) -> Result<XmlStep, MscclError> {
    let text = required(el, at, "type")?;
    let kind = Kind::parse(text.trim())
        .ok_or_else(|| attribute(at, "type", format!("`{text}` is not an MSCCL step type")))?;
    if kind.sends() && send.is_none() {
        return Err(MscclError::Inconsistent {
            at: at.to_owned(),
            problem: format!(
                "a `{}` step in a threadblock that sends to no one (send=\"-1\")",
                kind.code()
            ),
        });
    }
    if kind.receives() && recv.is_none() {
        return Err(MscclError::Inconsistent {
            at: at.to_owned(),
            problem: format!(
                "a `{}` step in a threadblock that receives from no one (recv=\"-1\")",
                kind.code()
            ),
        });
    }
    let depid: i64 = number(el, at, "depid")?;
    let deps: i64 = number(el, at, "deps")?;
    let dep = match (depid, deps) {
        (-1, -1) => None,
        (t, s) if t >= 0 && s >= 0 && t <= i64::from(u32::MAX) && s <= i64::from(u32::MAX) => {
            Some((t as u32, s as u32))
        }
        _ => {
            return Err(attribute(
                at,
                "depid",
                format!("depid {depid} and deps {deps}: both -1 or both a step"),
            ));
        }
    };
    // A nop carries only a dependency; its offsets are -1 by convention.
    let offset = |attr: &str| -> Result<u32, MscclError> {
        if kind == Kind::Nop {
            return Ok(0);
        }
        number(el, at, attr)
    };
    let (src_off, dst_off) = (offset("srcoff")?, offset("dstoff")?);
    let (src, dst) = if kind == Kind::Nop {
        (XmlBuffer::Input, XmlBuffer::Input)
    } else {
        (buffer(el, at, "srcbuf")?, buffer(el, at, "dstbuf")?)
    };
    let cnt: u32 = if kind == Kind::Nop {
        0
    } else {
        number(el, at, "cnt")?
    };
    Ok(XmlStep {
        kind,
        src: (src, src_off),
        dst: (dst, dst_off),
        cnt,
        dep,
        line: el.line,
    })
}
