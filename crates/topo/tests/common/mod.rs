//! What the topology crate's integration tests (and the ring-search
//! bench) share; each user takes only some of it.
#![allow(dead_code)]

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

/// `nvidia-smi topo -m` text of `n` GPUs, every pair `NV18`.
pub fn all_nvlink_smi(n: usize) -> Topology {
    let mut text = String::new();
    for i in 0..n {
        text += &format!("\tGPU{i}");
    }
    text += "\tCPU Affinity\tNUMA Affinity\n";
    for i in 0..n {
        text += &format!("GPU{i}");
        for j in 0..n {
            text += if i == j { "\t X " } else { "\tNV18" };
        }
        text += "\t0-63\t0\n";
    }
    ferrocoll_topo::sources::smi::parse_smi(&text).unwrap()
}
