//! The plan as text: a header with the call and its resources, one line
//! per instruction, and the link table — what `ferrocoll plan` prints.

use std::fmt::{self, Write as _};

use super::{ExecutionPlan, Instruction, Message, Region, Source};
use crate::types::Buffer;

/// `1.5 KiB`, `4 MiB`, `12 B`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if b >= size {
            let v = b as f64 / size as f64;
            return if b % size == 0 {
                format!("{} {unit}", b / size)
            } else {
                format!("{v:.2} {unit}")
            };
        }
    }
    format!("{b} B")
}

fn region(r: &Region) -> String {
    let name = r.buffer.short_name();
    let pieces: Vec<String> = r
        .pieces
        .iter()
        .map(|p| format!("{}+{}", p.offset, p.bytes))
        .collect();
    if pieces.is_empty() {
        format!("{name}[]")
    } else {
        format!("{name}[{}]", pieces.join(","))
    }
}

fn messages(ms: &[Message]) -> String {
    ms.iter()
        .map(|m| format!("{}#{}", m.peer, m.index))
        .collect::<Vec<_>>()
        .join(",")
}

fn instruction(i: usize, ins: &Instruction) -> String {
    let mut line = format!(
        "  {i:>5}  s{}.{:<3} {:<22} {:>10}",
        ins.segment,
        ins.step,
        ins.primitive_name(),
        human_bytes(ins.bytes)
    );
    if !ins.recv.is_empty() {
        let _ = write!(line, "  from {}", messages(&ins.recv));
    }
    if let Some(r) = &ins.read {
        let _ = write!(line, "  read {}", region(r));
    }
    if let Some(w) = &ins.write {
        let _ = write!(line, "  write {}", region(w));
    }
    if !ins.send.is_empty() {
        let _ = write!(line, "  to {}", messages(&ins.send));
    }
    for w in &ins.after {
        let _ = write!(line, "  after c{}#{}", w.channel, w.index);
    }
    match ins.source {
        Source::Slot => {}
        Source::Write => line.push_str("  zero-copy:write"),
        Source::Read => line.push_str("  zero-copy:read"),
    }
    if let Some(d) = ins.direct {
        let _ = write!(line, "  direct-from:{d}");
    }
    if ins.stored_by_sender {
        line.push_str("  sender-stores");
    }
    line
}

impl fmt::Display for ExecutionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = if self.in_place {
            "in place"
        } else {
            "out of place"
        };
        writeln!(
            f,
            "# plan {:016x}: `{}` {} count={} type={} op={} {place}",
            self.hash, self.schedule, self.collective, self.count, self.dtype, self.op
        )?;
        writeln!(
            f,
            "# {} ranks, {} channel(s), {} chunk(s)/block, {} segment(s) of chunks up to {}, {} slots/link",
            self.world_size,
            self.channels,
            self.chunks_per_block,
            self.segments,
            human_bytes(self.chunk_bytes),
            self.slots_per_link
        )?;
        writeln!(
            f,
            "# per rank: input {}, output {}, scratch {}; {} instructions in all",
            human_bytes(self.input_bytes),
            human_bytes(self.output_bytes),
            human_bytes(self.scratch_bytes),
            self.instruction_count()
        )?;
        writeln!(
            f,
            "# regions are buffer[offset+bytes,...] ({} = scratch); messages are peer#number",
            Buffer::Scratch.short_name()
        )?;
        for rp in &self.ranks {
            for (c, list) in rp.channels.iter().enumerate() {
                writeln!(f, "rank {} channel {c}", rp.rank)?;
                for (i, ins) in list.iter().enumerate() {
                    writeln!(f, "{}", instruction(i, ins))?;
                }
            }
            if let Some(d) = &rp.divide {
                writeln!(
                    f,
                    "rank {} then divides {} by {}",
                    rp.rank,
                    region(d),
                    self.world_size
                )?;
            }
        }
        writeln!(f, "links:")?;
        for l in &self.links {
            writeln!(
                f,
                "  {}->{} channel {}: {} message(s), {} (largest {})",
                l.link.from,
                l.link.to,
                l.link.channel,
                l.messages,
                human_bytes(l.bytes),
                human_bytes(l.largest)
            )?;
        }
        Ok(())
    }
}
