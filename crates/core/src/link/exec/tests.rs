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

/// In place with nothing to send (a root's reduce, a reduce-scatter's
/// last step): the write is exactly the read and the messages lie in
/// peers' buffers. Long enough for the fused kernel, off the line where
/// the buffers start, on every kernel variant: the write must hold the
/// sum of the sources as they were before the step.
fn reduces_in_place_over_its_own_read<T: Reduce + From<u16> + PartialEq + std::fmt::Debug>() {
    use crate::kernels::{Destination, KernelChoice, STREAM_MIN_BYTES, reduce_slices};
    let size = std::mem::size_of::<T>();
    let len = STREAM_MIN_BYTES / size + 1001;
    let source = |k: u16| -> Vec<T> { (0..=len).map(|i| T::from((i % 251) as u16 + k)).collect() };
    let peers = [source(2), source(3)];
    let mut want = vec![T::from(0); len];
    let own_before = source(1);
    reduce_slices(
        ReduceOp::Sum,
        &[&own_before[1..], &peers[0][1..], &peers[1][1..]],
        &mut want,
    );
    for kernels in KernelChoice::available() {
        let mut own = source(1);
        let spans = [(0, own.as_mut_ptr() as usize + size, len)];
        let messages: Vec<*const T> = peers.iter().map(|p| p[1..].as_ptr()).collect();
        let to = Sink {
            kernels,
            to: Destination::Output,
        };
        // SAFETY: every pointer covers `len` elements of a live vector;
        // the write is exactly the read, which `compute` allows.
        unsafe {
            compute::compute(
                ReduceOp::Sum,
                &messages,
                Some(&spans),
                Some(&spans),
                &[],
                to,
                len,
            )
        };
        let wrong = own[1..].iter().zip(&want).position(|(g, w)| g != w);
        assert_eq!(wrong, None, "with {}: first wrong element", kernels.spec());
    }
}

#[test]
fn an_in_place_step_with_nothing_to_send_sums_the_sources_before_it() {
    reduces_in_place_over_its_own_read::<f32>();
    reduces_in_place_over_its_own_read::<f64>();
    reduces_in_place_over_its_own_read::<u32>();
}
