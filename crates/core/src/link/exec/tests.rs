//! Unit tests of the executor's pure parts.

use super::compute::{overlap, sub_spans};
use super::reference::resolve;
use super::*;

#[test]
fn references_a_rank_cannot_honour_are_protocol_errors() {
    let header = Header::new(1, 64, "x");
    let refused = |h: &Header, pieces: Pieces| {
        matches!(
            resolve(h, pieces, 3, (None, 4)),
            Err(CommError::PeerFailed { rank: 3, .. })
        )
    };
    // Heap offsets in a group without heaps; a reference to private
    // memory (no group reads it: cross-memory attach is gone), whole or
    // not.
    for (h, pieces) in [
        (header.clone().referring_to_heap(), vec![(0, 64)]),
        (header.clone().referring(), vec![(0x1000, 64)]),
        (header.clone().referring(), vec![(0x1002, 64)]),
        (header.clone().referring(), vec![(0x1000, 62)]),
    ] {
        assert!(refused(&h, pieces));
    }
}

#[test]
fn blocks_of_spans_are_rebased_and_overlap_is_seen() {
    // Two pieces: elements 0..4 at 0x100, 4..10 at 0x900 (4-byte elements).
    let spans = [(0, 0x100, 4), (4, 0x900, 6)];
    assert_eq!(
        sub_spans::<u32>(&spans, 2, 4),
        [(0, 0x108, 2), (2, 0x900, 2)]
    );
    assert_eq!(sub_spans::<u32>(&spans, 8, 5), [(0, 0x910, 2)]);
    assert!(sub_spans::<u32>(&spans, 10, 3).is_empty());
    assert!(overlap::<u32>(&[(0, 0x100, 4)], &[(0, 0x10c, 4)]));
    assert!(!overlap::<u32>(&[(0, 0x100, 4)], &[(0, 0x110, 4)]));
}
