//! An instruction's value cut where any of its regions breaks, so a device
//! kernel (or any copy loop) can move each stretch with flat pointers.

use serde::Serialize;

use super::{Instruction, Piece};

/// A run of an instruction's value that is contiguous in its read and its
/// write region alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stretch {
    /// Where it starts in the value (and in every message), in bytes.
    pub offset: u64,
    /// Its length in bytes.
    pub bytes: u64,
    /// Where it starts in the read region's buffer, if the instruction reads.
    pub read: Option<u64>,
    /// Where it starts in the write region's buffer, if the instruction writes.
    pub write: Option<u64>,
}

/// A cursor over one region's pieces.
struct Cursor<'a> {
    pieces: &'a [Piece],
    index: usize,
    into: u64,
}

impl Cursor<'_> {
    /// Bytes left in the current piece (`u64::MAX` for an absent region).
    fn left(&self) -> u64 {
        self.pieces
            .get(self.index)
            .map_or(u64::MAX, |p| p.bytes - self.into)
    }

    fn at(&self) -> Option<u64> {
        self.pieces.get(self.index).map(|p| p.offset + self.into)
    }

    fn advance(&mut self, by: u64) {
        self.into += by;
        while self
            .pieces
            .get(self.index)
            .is_some_and(|p| self.into >= p.bytes)
        {
            self.into -= self.pieces[self.index].bytes;
            self.index += 1;
        }
    }
}

impl Instruction {
    /// The value cut into stretches contiguous in the read and the write
    /// region (one stretch for a value with neither); none for an empty value.
    pub fn stretches(&self) -> Vec<Stretch> {
        fn cursor(r: Option<&super::Region>) -> Cursor<'_> {
            Cursor {
                pieces: r.map_or(&[], |r| &r.pieces),
                index: 0,
                into: 0,
            }
        }
        let (mut read, mut write) = (cursor(self.read.as_ref()), cursor(self.write.as_ref()));
        // Skip empty pieces up front.
        read.advance(0);
        write.advance(0);
        let mut out = Vec::new();
        let mut offset = 0;
        while offset < self.bytes {
            let bytes = read.left().min(write.left()).min(self.bytes - offset);
            out.push(Stretch {
                offset,
                bytes,
                read: self.read.as_ref().and(read.at()),
                write: self.write.as_ref().and(write.at()),
            });
            read.advance(bytes);
            write.advance(bytes);
            offset += bytes;
        }
        out
    }
}
