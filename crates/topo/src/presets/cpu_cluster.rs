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
        let sizes = vec![self.ranks; self.hosts as usize];
        on_one_switch(&sizes, self.gbit, measured)
    }
}

/// The cluster a group across hosts runs on, from its layout: rank `r`
/// on host `host_of[r]` (hosts numbered from 0, each holding a rank, in
/// any order and any number per host), every host like this one
/// (`measured`), one port of `gbit` Gbit/s per host on one switch.
pub fn for_layout(
    host_of: &[u32],
    gbit: f64,
    measured: &HostMeasurement,
) -> Result<Topology, TopologyError> {
    if !(gbit.is_finite() && gbit > 0.0 && gbit <= 100_000.0) {
        return Err(TopologyError::Invalid(format!(
            "a network rate of {gbit} Gbit/s: expected (0, 100000]"
        )));
    }
    let hosts = host_of.iter().max().map_or(0, |&h| h as usize + 1);
    let mut sizes = vec![0u32; hosts];
    for &h in host_of {
        sizes[h as usize] += 1;
    }
    if host_of.is_empty() || sizes.contains(&0) || host_of.len() > 65_536 {
        return Err(TopologyError::Invalid(format!(
            "a layout of {} ranks on {hosts} hosts: every host from 0 must hold a rank, at most 65536 in all",
            host_of.len()
        )));
    }
    let t = on_one_switch(&sizes, gbit, measured)?;
    // The devices come host by host; rank r is the next thread of its host.
    let first: Vec<usize> = sizes
        .iter()
        .scan(0, |next, &n| {
            let at = *next;
            *next += n as usize;
            Some(at)
        })
        .collect();
    let mut taken = vec![0usize; hosts];
    let order: Vec<usize> = host_of
        .iter()
        .map(|&h| {
            let h = h as usize;
            taken[h] += 1;
            first[h] + taken[h] - 1
        })
        .collect();
    t.with_rank_order(&order)
}

/// Hosts of `sizes[h]` ranks each, one port of `gbit` Gbit/s per host on
/// one switch; devices host by host.
fn on_one_switch(
    sizes: &[u32],
    gbit: f64,
    measured: &HostMeasurement,
) -> Result<Topology, TopologyError> {
    let equal = sizes.windows(2).all(|w| w[0] == w[1]);
    let shape = if equal {
        format!("hosts={},ranks={}", sizes.len(), sizes[0])
    } else {
        let each: Vec<String> = sizes.iter().map(u32::to_string).collect();
        format!("ranks={}", each.join("+"))
    };
    let mut t = Topology::new(
        format!("cpu-cluster:{shape},gbit={gbit}"),
        format!(
            "{} hosts ({} ranks in all; shared memory inside a host, as this one measures: {:.1} GB/s of memory, {} cores), one {gbit} Gbit/s port per host on one switch",
            sizes.len(),
            sizes.iter().sum::<u32>(),
            measured.memory_gbps,
            measured.cores
        ),
    );
    let mut ports = Vec::new();
    for (h, &ranks) in sizes.iter().enumerate() {
        let host = super::host(ranks, measured);
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
        t.connect_with(nic, switch, LinkKind::Network, gbit / 8.0, TCP_HOP_US / 2.0);
    }
    t.validate()?;
    Ok(t)
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

    #[test]
    fn a_layout_places_each_rank_on_its_host_and_equal_hosts_match_the_preset() {
        let m = HostMeasurement::example();
        let t = for_layout(&[0, 1, 0, 1], 1.0, &m).unwrap();
        let names: Vec<&str> = t
            .devices()
            .iter()
            .map(|&d| t.nodes[d].name.as_str())
            .collect();
        assert_eq!(names, ["h0-T0", "h1-T0", "h0-T1", "h1-T1"]);
        assert_eq!(t.name, "cpu-cluster:hosts=2,ranks=2,gbit=1");
        let h = crate::search::hierarchy(&t, &t.devices(), &crate::sim::CostModel::default())
            .unwrap()
            .expect("two machines");
        assert_eq!(h.nodes, [vec![0, 2], vec![1, 3]]);
        let preset = parse("cpu-cluster:hosts=2,ranks=2").unwrap().unwrap();
        assert_eq!(
            for_layout(&[0, 0, 1, 1], 1.0, &m).unwrap(),
            preset.build(&m).unwrap()
        );
        let uneven = for_layout(&[0, 0, 1], 10.0, &m).unwrap();
        assert_eq!(uneven.name, "cpu-cluster:ranks=2+1,gbit=10");
        for (host_of, gbit) in [
            (&[][..], 1.0),
            (&[0, 2][..], 1.0),
            (&[0, 1][..], 0.0),
            (&[0, 1][..], f64::NAN),
        ] {
            assert!(for_layout(host_of, gbit, &m).is_err(), "{host_of:?} {gbit}");
        }
    }
}
