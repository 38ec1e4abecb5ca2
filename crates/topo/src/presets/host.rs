//! The CPU host as a topology: the CPU executor's ranks are threads that
//! exchange data through one pool of host memory.

use crate::graph::{LinkKind, Node, NodeKind, Topology};
use crate::probe::HostMeasurement;

/// `ranks` threads on this host as `measured` describes it.
///
/// Each thread reaches host memory over its own link at the bandwidth one
/// core sustains; the CPU node's memory bandwidth is what all cores
/// together sustain, and its core count says how many threads run at once.
/// Over shared memory a message is read in place by whoever consumes it,
/// so the links carry only the hand-off: `measured.handoff_us`, or the
/// oversubscribed hand-off when the ranks outnumber the cores.
pub fn host(ranks: u32, measured: &HostMeasurement) -> Topology {
    let handoff = if ranks > measured.cores {
        measured.oversubscribed_handoff_us
    } else {
        measured.handoff_us
    };
    let mut t = Topology::new(
        "host",
        format!(
            "this host's CPU: {ranks} threads on {} cores sharing {:.1} GB/s of memory bandwidth \
             ({:.1} GB/s per core, {:.2} us hand-off), measured",
            measured.cores, measured.memory_gbps, measured.core_gbps, handoff
        ),
    );
    let threads: Vec<usize> = (0..ranks)
        .map(|r| t.add_node(Node::new(format!("T{r}"), NodeKind::Thread).numa(0)))
        .collect();
    let cpu = t.add_node(
        Node::new("CPU0", NodeKind::Cpu)
            .numa(0)
            .memory_bandwidth(measured.memory_gbps)
            .cores(measured.cores),
    );
    for th in threads {
        t.connect_with(
            th,
            cpu,
            LinkKind::SharedMemory,
            measured.core_gbps,
            handoff / 2.0,
        );
    }
    t
}
