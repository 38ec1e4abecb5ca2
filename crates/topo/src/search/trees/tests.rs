//! Tree packings against the throughput bound.

use super::*;
use crate::bound::{Fabric, Relays, throughput_bounds};
use crate::presets;

fn dgx1(keep: &[usize]) -> Topology {
    presets::by_name("dgx1-v100", 0)
        .unwrap()
        .with_devices(keep)
        .unwrap()
}

#[test]
fn trees_reach_the_bound_where_no_ring_can() {
    let cost = CostModel::default();
    for keep in [&[0usize, 1, 2, 3, 4, 5][..], &[0, 1, 2, 3, 4], &[0, 1, 2]] {
        let t = dgx1(keep);
        let devices = t.devices();
        let bound =
            throughput_bounds(&t, &devices, &cost, Fabric::Nvlink, Relays::MembersOnly).unwrap();
        for kind in [CollectiveKind::AllGather, CollectiveKind::AllReduce] {
            let p = trees(&t, &devices, &cost, kind).unwrap().unwrap();
            let goal = match kind {
                CollectiveKind::AllGather => bound.all_gather.busbw,
                _ => bound.all_reduce,
            };
            eprintln!(
                "{keep:?} {kind}: {:.1} of {goal:.1} (fractional {:.1})",
                p.bandwidth, p.fractional
            );
            assert!(
                p.bandwidth >= 0.9 * goal,
                "{keep:?} {kind}: {:.1} of {goal:.1} (fractional {:.1})",
                p.bandwidth,
                p.fractional
            );
        }
    }
}
