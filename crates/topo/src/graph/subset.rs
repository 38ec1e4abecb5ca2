//! A machine as a job sees it when a scheduler hands it some of the GPUs:
//! the same graph with the other devices (and their links) taken out.

use super::{NodeId, Topology};
use crate::TopologyError;

impl Topology {
    /// This topology with only the devices at positions `keep` of
    /// [`devices`](Self::devices) (any order; ranks follow the devices'
    /// order in the graph). Every other node stays: switches, CPUs and NICs
    /// still route. Positions out of range or listed twice are an error,
    /// as is an empty list.
    pub fn with_devices(&self, keep: &[usize]) -> Result<Topology, TopologyError> {
        let devices = self.devices();
        let mut sorted = keep.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if keep.is_empty() || sorted.len() != keep.len() {
            return Err(TopologyError::Invalid(
                "a device list must name at least one device, each once".into(),
            ));
        }
        if let Some(&bad) = sorted.iter().find(|&&i| i >= devices.len()) {
            return Err(TopologyError::Invalid(format!(
                "device {bad} is out of range: `{}` has {} devices (0..{})",
                self.name,
                devices.len(),
                devices.len()
            )));
        }
        let dropped: Vec<NodeId> = devices
            .iter()
            .enumerate()
            .filter(|(i, _)| sorted.binary_search(i).is_err())
            .map(|(_, &d)| d)
            .collect();
        let mut new_id: Vec<Option<NodeId>> = Vec::with_capacity(self.nodes.len());
        let mut next = 0;
        for v in 0..self.nodes.len() {
            if dropped.contains(&v) {
                new_id.push(None);
            } else {
                new_id.push(Some(next));
                next += 1;
            }
        }
        let names: Vec<String> = sorted.iter().map(|i| i.to_string()).collect();
        let mut t = Topology::new(
            format!("{}[{}]", self.name, names.join(",")),
            format!("{} (devices {} of it)", self.description, names.join(", ")),
        );
        t.nodes = (0..self.nodes.len())
            .filter(|&v| new_id[v].is_some())
            .map(|v| self.nodes[v].clone())
            .collect();
        t.links = self
            .links
            .iter()
            .filter_map(|l| {
                let mut l = l.clone();
                l.from = new_id[l.from]?;
                l.to = new_id[l.to]?;
                Some(l)
            })
            .collect();
        t.p2p_blocked = self
            .p2p_blocked
            .iter()
            .filter_map(|&(a, b)| Some((new_id[a]?, new_id[b]?)))
            .collect();
        t.validate()?;
        Ok(t)
    }

    /// The node ids of the devices at positions `keep` of
    /// [`devices`](Self::devices), in graph order; out of range or listed
    /// twice is an error.
    pub fn device_ids(&self, keep: &[usize]) -> Result<Vec<NodeId>, TopologyError> {
        let devices = self.devices();
        let mut sorted = keep.to_vec();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(TopologyError::Invalid(
                "a device list names a device twice".into(),
            ));
        }
        sorted
            .iter()
            .map(|&i| {
                devices
                    .get(i)
                    .copied()
                    .ok_or_else(|| TopologyError::Invalid(format!("device {i} is out of range")))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::presets;

    #[test]
    fn a_subset_keeps_its_devices_links_and_routers() {
        let t = presets::by_name("dgx1-v100", 0).unwrap();
        let s = t.with_devices(&[5, 0, 3]).unwrap();
        assert_eq!(s.devices().len(), 3);
        let names: Vec<&str> = s
            .devices()
            .iter()
            .map(|&d| s.nodes[d].name.as_str())
            .collect();
        let full: Vec<&str> = [0, 3, 5]
            .iter()
            .map(|&i| t.nodes[t.devices()[i]].name.as_str())
            .collect();
        assert_eq!(names, full);
        assert_eq!(
            s.nodes.len(),
            t.nodes.len() - 5,
            "only the other devices go"
        );
        // Of the NVLinks only GPU0-GPU3's stays (one link each way, of two
        // bricks); those of the dropped GPUs are gone.
        let nv = s.links.iter().filter(|l| l.kind.is_nvlink()).count();
        assert_eq!(nv, 2);
        for bad in [&[][..], &[0, 0], &[8]] {
            assert!(t.with_devices(bad).is_err(), "{bad:?}");
        }
    }
}
