//! A hash that is the same on every host and every build: FNV-1a (64 bit)
//! over a value's JSON form, streamed, so ranks on different machines can
//! compare plans without exchanging them.

use std::io::{self, Write};

use serde::Serialize;

use super::ExecutionPlan;

/// FNV-1a's 64-bit offset basis and prime.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

struct Fnv(u64);

impl Write for Fnv {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The stable hash of `value`'s JSON form.
pub(crate) fn stable_hash(value: &impl Serialize) -> u64 {
    let mut h = Fnv(FNV_OFFSET);
    serde_json::to_writer(&mut h, value).expect("plain data serialises");
    h.0
}

/// Everything of a plan but its hash, in the order the plan lists it.
#[derive(Serialize)]
struct Hashed<'a> {
    version: u32,
    schedule: &'a str,
    schedule_hash: u64,
    collective: crate::Collective,
    count: u64,
    dtype: crate::DataType,
    op: crate::ReduceOp,
    in_place: bool,
    #[serde(skip_serializing_if = "crate::types::Purpose::is_user")]
    purpose: crate::types::Purpose,
    world_size: u32,
    channels: u32,
    chunks_per_block: u32,
    segments: u32,
    chunk_bytes: u64,
    slots_per_link: u32,
    input_bytes: u64,
    output_bytes: u64,
    scratch_bytes: u64,
    ranks: &'a [super::RankPlan],
    links: &'a [super::LinkLoad],
}

impl ExecutionPlan {
    /// The stable hash of everything in the plan except the hash itself:
    /// two plans hash alike only if every instruction, region, message,
    /// wait and resource is the same (up to a 64-bit collision).
    pub fn compute_hash(&self) -> u64 {
        stable_hash(&Hashed {
            version: self.version,
            schedule: &self.schedule,
            schedule_hash: self.schedule_hash,
            collective: self.collective,
            count: self.count,
            dtype: self.dtype,
            op: self.op,
            in_place: self.in_place,
            purpose: self.purpose,
            world_size: self.world_size,
            channels: self.channels,
            chunks_per_block: self.chunks_per_block,
            segments: self.segments,
            chunk_bytes: self.chunk_bytes,
            slots_per_link: self.slots_per_link,
            input_bytes: self.input_bytes,
            output_bytes: self.output_bytes,
            scratch_bytes: self.scratch_bytes,
            ranks: &self.ranks,
            links: &self.links,
        })
    }
}
