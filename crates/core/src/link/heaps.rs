//! Where the heaps of a group lie in this process: what lets a value go
//! by reference (offsets into the sender's heap) and come back as
//! addresses the receiver can read.

use std::sync::Arc;

use crate::types::Rank;

/// Every rank's heap as one rank sees it: (address in this process,
/// bytes) per rank, and which one is its own. A peer whose heap is not
/// mapped here has an empty range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeapMap {
    own: Rank,
    /// Shared by every rank of a group that maps the same ranges (the
    /// threads of one process): one copy, not one per rank.
    mapped: Arc<[(usize, usize)]>,
}

impl HeapMap {
    /// The map of rank `own`, with `mapped[r]` rank `r`'s heap.
    ///
    /// # Panics
    /// If `own` is not an index of `mapped` (a bug of the caller).
    pub fn new(own: Rank, mapped: impl Into<Arc<[(usize, usize)]>>) -> Self {
        let mapped = mapped.into();
        assert!((own as usize) < mapped.len(), "own heap not mapped");
        HeapMap { own, mapped }
    }

    /// How many ranks the map covers.
    pub fn ranks(&self) -> u32 {
        self.mapped.len() as u32
    }

    /// Where this rank's own heap lies: (address, bytes).
    pub fn own(&self) -> (usize, usize) {
        self.mapped[self.own as usize]
    }

    /// Where `rank`'s heap lies in this process: (address, bytes).
    pub fn of(&self, rank: Rank) -> Option<(usize, usize)> {
        self.mapped.get(rank as usize).copied()
    }

    /// The offsets in this rank's own heap of `pieces` (addresses in this
    /// process), when all lie inside it.
    pub fn offsets(&self, pieces: &[(usize, usize)]) -> Option<Vec<(usize, usize)>> {
        let (base, len) = self.own();
        pieces
            .iter()
            .map(|&(address, bytes)| {
                let offset = address.checked_sub(base)?;
                (offset.checked_add(bytes)? <= len).then_some((offset, bytes))
            })
            .collect()
    }

    /// `pieces` (offsets into `peer`'s heap) as addresses in this process,
    /// or why they cannot be: a peer's bytes are checked, never trusted.
    pub fn translate(
        &self,
        peer: Rank,
        pieces: &[(usize, usize)],
    ) -> Result<Vec<(usize, usize)>, String> {
        let Some(&(base, len)) = self.mapped.get(peer as usize) else {
            return Err(format!("no heap of rank {peer} is mapped here"));
        };
        pieces
            .iter()
            .map(|&(offset, bytes)| match offset.checked_add(bytes) {
                Some(end) if end <= len => Ok((base + offset, bytes)),
                _ => Err(format!(
                    "bytes [{offset}, +{bytes}) outside its {len}-byte shared heap"
                )),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_translation_stay_inside_the_heap() {
        let base = 1 << 20;
        let map = HeapMap::new(1, vec![(0x10000, 4096), (base, 4096)]);
        assert_eq!(map.offsets(&[(base + 64, 128)]), Some(vec![(64, 128)]));
        assert_eq!(map.offsets(&[(base + 4000, 128)]), None);
        assert_eq!(map.offsets(&[(base - 1, 8)]), None);
        assert_eq!(map.translate(0, &[(64, 64)]), Ok(vec![(0x10040, 64)]));
        assert!(map.translate(0, &[(4090, 64)]).is_err());
        assert!(map.translate(0, &[(usize::MAX, 2)]).is_err());
        assert!(map.translate(2, &[(0, 8)]).is_err(), "no such rank");
    }
}
