//! What `auto` runs for all-reduce in a group across hosts: the
//! hierarchical all-reduce (reduce-scatter inside each host, all-reduce
//! along the rails across hosts, all-gather inside each host), built from
//! the group's own layout and proven once when the group forms.
//!
//! Between hosts the network is one to two orders of magnitude slower
//! than a host's memory; a ring over every rank sends `2 (n - 1) / n` of
//! the data through each host's port, the hierarchical schedule only
//! `2 (h - 1) / h` of `1 / L` of it per rank, the L ranks of a host
//! sharing its port (measured on the emulated cluster:
//! docs/benchmarks.md, "Across hosts"; `sim --topo cpu-cluster:...`
//! predicts the same). The layout is agreed at setup, so every rank
//! builds the same schedule. Calls the one-shot protocol takes, other
//! collectives, and groups whose hosts hold different numbers of ranks
//! (or one rank each: the rails are the whole group) keep the executor's
//! rule.

use std::sync::Arc;

use ferrocoll_core::Collective;
use ferrocoll_core::algorithms::hierarchical::{self, Hierarchy};
use ferrocoll_core::select::{Choice, Selection, Selector, SharedSelector};
use ferrocoll_core::verify::{Verified, VerifyOptions, verify};

use crate::layout::HostLayout;

/// The most ranks whose hierarchical schedule is proven at setup: the
/// proof's cost grows with the square of the ranks, and past this a
/// group forms in seconds instead of milliseconds.
const MAX_PROVEN_RANKS: u32 = 256;

/// The selector of a group across hosts.
#[derive(Debug)]
pub(crate) struct AcrossHosts {
    hierarchical: Arc<Verified>,
    world_size: u32,
    why: String,
}

impl AcrossHosts {
    /// For `layout` (of `world_size` ranks), where the hierarchical
    /// all-reduce applies: several hosts, as many ranks on each, more
    /// than one.
    pub fn for_layout(layout: &HostLayout, world_size: u32, slots: u32) -> Option<SharedSelector> {
        let hosts = layout.hosts();
        let nodes: Vec<Vec<u32>> = (0..hosts).map(|h| layout.ranks_on(h)).collect();
        let per_host = nodes.first().map_or(0, Vec::len);
        if hosts < 2 || per_host < 2 || nodes.iter().any(|n| n.len() != per_host) {
            return None;
        }
        if world_size > MAX_PROVEN_RANKS {
            tracing::debug!(
                world_size,
                "across hosts: {world_size} ranks are past the {MAX_PROVEN_RANKS} proven at setup; the rule decides"
            );
            return None;
        }
        let hierarchy = Hierarchy { nodes };
        let made = hierarchical::schedule(Collective::AllReduce, world_size, &hierarchy, 1)
            .map_err(|e| e.to_string())
            .and_then(|mut s| {
                s.name = format!("hierarchical {hosts}x{per_host}");
                let options = VerifyOptions {
                    slots_per_link: slots,
                    ..VerifyOptions::default()
                };
                verify(s, &options).map_err(|e| e.to_string())
            });
        match made {
            Ok(v) => Some(SharedSelector(Arc::new(AcrossHosts {
                hierarchical: Arc::new(v),
                world_size,
                why: format!(
                    "the group spans {hosts} hosts of {per_host} ranks: reduce-scatter inside each host, all-reduce across hosts, all-gather inside each (the network carries 1/{per_host} of a ring's bytes per rank)"
                ),
            }))),
            Err(e) => {
                tracing::warn!("across hosts: no hierarchical all-reduce ({e}); the rule decides");
                None
            }
        }
    }
}

impl Selector for AcrossHosts {
    fn select(&self, collective: Collective, world_size: u32, _bytes: usize) -> Option<Selection> {
        (collective == Collective::AllReduce && world_size == self.world_size).then(|| Selection {
            choice: Choice::Synthesized(self.hierarchical.clone()),
            max_chunk_bytes: None,
            protocol: None,
            why: self.why.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(host_of: Vec<u32>) -> HostLayout {
        let hosts = host_of.iter().max().map_or(0, |&h| h + 1);
        HostLayout::new(host_of, (0..hosts).map(|h| format!("h{h}")).collect()).unwrap()
    }

    #[test]
    fn all_reduce_across_equal_hosts_goes_hierarchical_and_nothing_else_does() {
        let s = AcrossHosts::for_layout(&layout(vec![0, 1, 0, 1]), 4, 2).expect("2 hosts of 2");
        assert!(AcrossHosts::for_layout(&layout(vec![0, 0, 1, 1]), 4, 4).is_some());
        let pick = s.0.select(Collective::AllReduce, 4, 1 << 20).unwrap();
        assert!(
            pick.choice.name().starts_with("hierarchical 2x2"),
            "{}",
            pick.choice
        );
        assert!(s.0.select(Collective::AllGather, 4, 1 << 20).is_none());
        assert!(s.0.select(Collective::AllReduce, 3, 1 << 20).is_none());
    }

    #[test]
    fn one_host_uneven_hosts_and_one_rank_per_host_keep_the_rule() {
        assert!(AcrossHosts::for_layout(&layout(vec![0, 0, 0]), 3, 2).is_none());
        assert!(AcrossHosts::for_layout(&layout(vec![0, 0, 1]), 3, 2).is_none());
        assert!(AcrossHosts::for_layout(&layout(vec![0, 1, 2]), 3, 2).is_none());
    }
}
