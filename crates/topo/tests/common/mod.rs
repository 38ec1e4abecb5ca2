//! What the topology crate's integration tests share.

use ferrocoll_topo::{LinkKind, Node, NodeKind, Topology};

/// `n` GPUs, every pair linked by one NVLink 4: room for any plan's traffic.
pub fn mesh(n: u32) -> Topology {
    let mut t = Topology::new("mesh", "every pair linked");
    for i in 0..n {
        t.add_node(Node::new(format!("GPU{i}"), NodeKind::Gpu));
    }
    let kind = LinkKind::Nvlink {
        generation: 4,
        count: 1,
    };
    for a in 0..n as usize {
        for b in a + 1..n as usize {
            t.connect_with(a, b, kind.clone(), 50.0, 1.0);
        }
    }
    t
}
