//! The network between a group's hosts, for `auto` across hosts: the cluster the
//! group runs on — its hosts (like rank 0's, as measured there), the
//! ranks on each as the group found them, one port of the given rate per
//! host on one switch ([`cpu_cluster::for_layout`]) — or a whole
//! cluster's topology from a file, selected on by a [`TopologySelector`]
//! per call size: the hierarchical all-reduce where the network binds,
//! direct or tree where the network is fast enough that host memory
//! does.
//!
//! Rank 0 builds the topology and publishes it while the group forms
//! ([`ferrocoll_process::ClusterModel`]), so every rank selects on the
//! same one: `sim --topo cpu-cluster:hosts=H,ranks=L,gbit=R` on rank 0's
//! host predicts the same choice.

use std::path::PathBuf;
use std::sync::Arc;

use ferrocoll_core::select::SharedSelector;
use ferrocoll_process::{ClusterModel, HostLayout, SharedClusterModel};
use ferrocoll_topo::graph::Topology;
use ferrocoll_topo::presets::cpu_cluster;
use ferrocoll_topo::probe::host;
use ferrocoll_topo::select::{SelectOptions, TopologySelector};

/// What a group knows of its network.
#[derive(Debug, Clone, PartialEq)]
pub enum Network {
    /// Each host's port, Gbit/s per direction, on one switch.
    Rate(f64),
    /// A topology file (`ferrocoll topo --json`'s format) whose devices,
    /// in order, are the group's ranks.
    File(PathBuf),
}

/// The network model of a group: see the module's documentation.
#[derive(Debug)]
struct Model(Network);

impl ClusterModel for Model {
    fn settings(&self) -> String {
        match &self.0 {
            Network::Rate(gbit) => format!("net {gbit} Gbit/s"),
            Network::File(path) => format!("cluster file {}", path.display()),
        }
    }

    fn describe(&self, layout: &HostLayout) -> Result<String, String> {
        let topology = match &self.0 {
            Network::Rate(gbit) => {
                cpu_cluster::for_layout(layout.host_of(), *gbit, host::measured())
                    .map_err(|e| e.to_string())?
            }
            Network::File(path) => Topology::load(path).map_err(|e| e.to_string())?,
        };
        Ok(topology.to_json())
    }

    fn selector(
        &self,
        description: &str,
        world_size: u32,
        slots_per_link: u32,
    ) -> Result<SharedSelector, String> {
        let topology = Topology::from_json(description).map_err(|e| e.to_string())?;
        let options = SelectOptions {
            slots_per_link,
            ..SelectOptions::default()
        };
        let selector =
            TopologySelector::new(topology, world_size, options).map_err(|e| e.to_string())?;
        Ok(SharedSelector(Arc::new(selector)))
    }
}

/// The model of `network`, for [`ferrocoll_process::ProcessConfig::cluster`].
pub fn cluster_model(network: Network) -> SharedClusterModel {
    SharedClusterModel(Arc::new(Model(network)))
}

/// A port rate in Gbit/s, as `--net-gbps` and `FERROCOLL_NET_GBPS` take it.
pub fn parse_rate(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 && r <= 100_000.0 => Ok(r),
        _ => Err(format!(
            "`{value}`: expected each host's port rate in Gbit/s, in (0, 100000]"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrocoll_core::Collective;

    #[test]
    fn rates_parse_and_nonsense_is_refused() {
        assert_eq!(parse_rate(" 10 "), Ok(10.0));
        for bad in ["0", "-1", "fast", "inf", "NaN", "1e9"] {
            let e = parse_rate(bad).unwrap_err();
            assert!(e.contains("Gbit/s"), "{bad}: {e}");
        }
    }

    fn layout(host_of: Vec<u32>) -> HostLayout {
        let hosts = host_of.iter().max().map_or(0, |&h| h + 1);
        HostLayout::new(host_of, (0..hosts).map(|h| format!("h{h}")).collect()).unwrap()
    }

    #[test]
    fn a_slow_network_selects_the_hierarchical_all_reduce_and_a_fast_one_does_not() {
        let pick = |gbit: f64, host_of: Vec<u32>, bytes: usize| {
            let model = cluster_model(Network::Rate(gbit));
            let n = host_of.len() as u32;
            let text = model.0.describe(&layout(host_of)).unwrap();
            let selector = model.0.selector(&text, n, 4).unwrap();
            let s = selector.0.select(Collective::AllReduce, n, bytes).unwrap();
            s.choice.name().to_owned()
        };
        let name = pick(1.0, vec![0, 0, 1, 1], 16 << 20);
        assert!(name.starts_with("hierarchical"), "{name}");
        // Interleaved ranks: halving-doubling pairs ranks 2 apart first
        // (inside each host), so it crosses the network as little as the
        // hierarchy, which follows the layout, not rank order.
        let name = pick(1.0, vec![0, 1, 0, 1], 16 << 20);
        assert!(
            name.starts_with("hierarchical") || name == "halving-doubling",
            "{name}"
        );
        // Hosts by rank order: halving-doubling's first step would cross.
        assert_ne!(pick(1.0, vec![0, 0, 1, 1], 16 << 20), "halving-doubling");
        let fast = pick(100_000.0, vec![0, 0, 1, 1], 16 << 20);
        assert!(!fast.starts_with("hierarchical"), "{fast}");
    }

    #[test]
    fn a_missing_or_short_cluster_file_is_an_error_naming_it() {
        let model = cluster_model(Network::File("/nonexistent/cluster.json".into()));
        let e = model.0.describe(&layout(vec![0, 1])).unwrap_err();
        assert!(e.contains("/nonexistent/cluster.json"), "{e}");
        let two = cpu_cluster::for_layout(&[0, 1], 1.0, host::measured()).unwrap();
        let e = model.0.selector(&two.to_json(), 4, 4).unwrap_err();
        assert!(e.contains('2') && e.contains('4'), "{e}");
        assert!(model.0.selector("{", 2, 4).is_err());
    }
}
