//! Placing ranks on devices: a group whose ranks do not come host by
//! host (a launcher that numbers round-robin, a split) still needs rank
//! `r` on the device it really runs on.

use super::{NodeId, Topology};
use crate::TopologyError;

impl Topology {
    /// This topology with its devices renumbered so that rank `r` runs on
    /// the device at position `order[r]` of [`devices`](Self::devices).
    /// Nodes keep their names, links and kinds; only their ids move.
    /// `order` must name every device exactly once.
    pub fn with_rank_order(&self, order: &[usize]) -> Result<Topology, TopologyError> {
        let devices = self.devices();
        let mut seen = vec![false; devices.len()];
        let permutation = order.len() == devices.len()
            && order
                .iter()
                .all(|&i| i < devices.len() && !std::mem::replace(&mut seen[i], true));
        if !permutation {
            return Err(TopologyError::Invalid(format!(
                "a rank order must name each of the {} devices of `{}` once ({} given)",
                devices.len(),
                self.name,
                order.len()
            )));
        }
        // Device slots keep their places among the other nodes; the k-th
        // slot takes the device rank k runs on.
        let mut new_id: Vec<NodeId> = (0..self.nodes.len()).collect();
        for (slot, &position) in devices.iter().zip(order) {
            new_id[devices[position]] = *slot;
        }
        let mut nodes = self.nodes.clone();
        for (old, node) in self.nodes.iter().enumerate() {
            nodes[new_id[old]] = node.clone();
        }
        let mut t = self.clone();
        t.nodes = nodes;
        for l in &mut t.links {
            l.from = new_id[l.from];
            l.to = new_id[l.to];
        }
        for pair in &mut t.p2p_blocked {
            let (a, b) = (new_id[pair.0], new_id[pair.1]);
            *pair = (a.min(b), a.max(b));
        }
        t.validate()?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::{LinkKind, Node, NodeKind, Topology};

    fn three() -> Topology {
        let mut t = Topology::new("t", "three GPUs on a switch, GPU2 slow");
        let sw = t.add_node(Node::new("SW", NodeKind::NetworkSwitch));
        let g: Vec<_> = (0..3)
            .map(|i| t.add_node(Node::new(format!("GPU{i}"), NodeKind::Gpu)))
            .collect();
        t.connect_with(g[0], sw, LinkKind::Network, 10.0, 1.0);
        t.connect_with(g[1], sw, LinkKind::Network, 10.0, 1.0);
        t.connect_with(g[2], sw, LinkKind::Network, 3.0, 1.0);
        t.block_p2p(g[0], g[2]);
        t
    }

    #[test]
    fn ranks_land_on_the_devices_named_and_keep_their_links() {
        let t = three().with_rank_order(&[2, 0, 1]).unwrap();
        let names: Vec<&str> = t
            .devices()
            .iter()
            .map(|&d| t.nodes[d].name.as_str())
            .collect();
        assert_eq!(names, ["GPU2", "GPU0", "GPU1"]);
        let rank0 = t.devices()[0];
        let slow: Vec<f64> = t
            .links
            .iter()
            .filter(|l| l.from == rank0)
            .map(|l| l.bandwidth)
            .collect();
        assert_eq!(slow, [3.0]);
        assert_eq!(t.nodes[t.links[0].to].name, "SW");
        // GPU0 and GPU2 are ranks 1 and 0 now.
        assert!(!t.p2p(t.devices()[0], t.devices()[1]));
        assert!(t.p2p(t.devices()[1], t.devices()[2]));
    }

    #[test]
    fn an_order_that_is_not_a_permutation_is_refused() {
        for bad in [&[0, 1][..], &[0, 1, 1], &[0, 1, 3], &[0, 1, 2, 0]] {
            assert!(three().with_rank_order(bad).is_err(), "{bad:?}");
        }
        assert_eq!(three().with_rank_order(&[0, 1, 2]).unwrap(), three());
    }
}
