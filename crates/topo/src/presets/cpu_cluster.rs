//! Hosts of CPU ranks joined by a network: `cpu-cluster:hosts=H,ranks=L,gbit=R`
//! — H hosts like this one (its measured memory, cores and hand-off, see
//! [`super::host`]), L ranks on each linked by shared memory, one network
//! port of R Gbit/s per host on one switch. What the process executor
//! runs across hosts (shared memory inside each, TCP between), and what
//! the emulated cluster of `scripts/lab.sh` measures (docs/benchmarks.md,
//! "Across hosts").
//!
//! The port's rate is the line rate; the simulator's
//! `network_efficiency` says what payload gets of it. A TCP hop on one
//! switch is taken as 30 µs one way (loopback and veth round trips
//! measured here are 20–60 µs; a switched gigabit LAN is of the same
//! order): only small calls feel it.

use crate::error::TopologyError;
use crate::graph::{LinkKind, Node, NodeKind, Topology};
use crate::probe::HostMeasurement;

/// One way through the host's network stack and the switch, µs.
const TCP_HOP_US: f64 = 30.0;

/// A cluster of CPU hosts.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuCluster {
    /// Hosts.
    pub hosts: u32,
    /// Ranks on each host.
    pub ranks: u32,
    /// Each host's port, Gbit/s per direction.
    pub gbit: f64,
}

/// `cpu-cluster[:hosts=H,ranks=L,gbit=R]` (defaults 2 hosts, 2 ranks,
/// 1 Gbit/s), or `None` for another name.
pub fn parse(name: &str) -> Option<Result<CpuCluster, TopologyError>> {
    let (base, params) = name.split_once(':').unwrap_or((name, ""));
    if base != "cpu-cluster" {
        return None;
    }
    let mut c = CpuCluster {
        hosts: 2,
        ranks: 2,
        gbit: 1.0,
    };
    for part in params.split(',').filter(|p| !p.is_empty()) {
        let bad = || {
            TopologyError::Invalid(format!(
                "`{part}` in `{name}`: parameters are hosts=1..=1024, ranks=1..=1024 and gbit=(0, 100000]"
            ))
        };
        let Some((key, value)) = part.split_once('=') else {
            return Some(Err(bad()));
        };
        let count = |v: &str| {
            v.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=1024).contains(n))
        };
        match key.trim() {
            "hosts" => match count(value) {
                Some(n) => c.hosts = n,
                None => return Some(Err(bad())),
            },
            "ranks" => match count(value) {
                Some(n) => c.ranks = n,
                None => return Some(Err(bad())),
            },
            "gbit" => match value.trim().parse::<f64>() {
                Ok(r) if r > 0.0 && r <= 100_000.0 => c.gbit = r,
                _ => return Some(Err(bad())),
            },
            _ => return Some(Err(bad())),
        }
    }
    if u64::from(c.hosts) * u64::from(c.ranks) > 65_536 {
        return Some(Err(TopologyError::Invalid(format!(
            "`{name}`: {} ranks in all; at most 65536",
            u64::from(c.hosts) * u64::from(c.ranks)
        ))));
    }
    Some(Ok(c))
}

impl CpuCluster {
    /// The topology, every host as `measured` describes this one: ranks
    /// (rank `h * ranks + r` is thread `r` of host `h`, the order
    /// `ferrocoll launch --nnodes` numbers them in), each host's memory,
    /// its port and the switch.
    pub fn build(&self, measured: &HostMeasurement) -> Result<Topology, TopologyError> {
        let mut t = Topology::new(
            format!(
                "cpu-cluster:hosts={},ranks={},gbit={}",
                self.hosts, self.ranks, self.gbit
            ),
            format!(
                "{} hosts of {} ranks each (shared memory inside a host, as this one measures: {:.1} GB/s of memory, {} cores), one {} Gbit/s port per host on one switch",
                self.hosts, self.ranks, measured.memory_gbps, measured.cores, self.gbit
            ),
        );
        let host = super::host(self.ranks, measured);
        let mut ports = Vec::new();
        for h in 0..self.hosts {
            let ids = super::cluster::append(&mut t, &host, &format!("h{h}-"));
            let cpu = host
                .nodes
                .iter()
                .position(|n| n.kind == NodeKind::Cpu)
                .map(|v| ids[v])
                .ok_or_else(|| TopologyError::Invalid("the host preset has no CPU".into()))?;
            let nic = t.add_node(Node::new(format!("h{h}-NIC"), NodeKind::Nic));
            // The port reads and writes host memory: no narrower than it.
            t.connect_with(nic, cpu, LinkKind::SharedMemory, measured.memory_gbps, 0.0);
            ports.push(nic);
        }
        let switch = t.add_node(Node::new("SWITCH", NodeKind::NetworkSwitch));
        for nic in ports {
            t.connect_with(
                nic,
                switch,
                LinkKind::Network,
                self.gbit / 8.0,
                TCP_HOP_US / 2.0,
            );
        }
        t.validate()?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_with_defaults_and_bad_parameters_are_refused() {
        let c = parse("cpu-cluster").unwrap().unwrap();
        assert_eq!((c.hosts, c.ranks, c.gbit), (2, 2, 1.0));
        let c = parse("cpu-cluster:hosts=4,ranks=3,gbit=10")
            .unwrap()
            .unwrap();
        assert_eq!((c.hosts, c.ranks, c.gbit), (4, 3, 10.0));
        for bad in [
            "cpu-cluster:hosts=0",
            "cpu-cluster:gbit=-1",
            "cpu-cluster:x=1",
            "cpu-cluster:ranks",
        ] {
            assert!(parse(bad).unwrap().is_err(), "{bad}");
        }
        assert!(parse("cpu-cluster:hosts=1024,ranks=1024").unwrap().is_err());
        assert!(parse("dgx-h100").is_none());
    }

    #[test]
    fn ranks_are_numbered_host_by_host_and_the_hosts_are_its_machines() {
        let t = parse("cpu-cluster:hosts=3,ranks=2")
            .unwrap()
            .unwrap()
            .build(&HostMeasurement::example())
            .unwrap();
        let names: Vec<&str> = t
            .devices()
            .iter()
            .map(|&d| t.nodes[d].name.as_str())
            .collect();
        assert_eq!(
            names,
            ["h0-T0", "h0-T1", "h1-T0", "h1-T1", "h2-T0", "h2-T1"]
        );
        let h = crate::search::hierarchy(&t, &t.devices(), &crate::sim::CostModel::default())
            .unwrap()
            .expect("three machines");
        assert_eq!(h.nodes.len(), 3);
        let network: Vec<f64> = t
            .links
            .iter()
            .filter(|l| l.kind == LinkKind::Network)
            .map(|l| l.bandwidth)
            .collect();
        // Both directions of every host's port.
        assert_eq!(network, [0.125; 6]);
    }
}
