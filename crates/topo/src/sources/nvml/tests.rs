use super::*;
use crate::graph::PathClass;

use CommonAncestor::*;

/// A GPU with PCIe facts and no NVLink.
fn gpu(i: usize, numa: u32, pcie: (u8, u8)) -> GpuFacts {
    GpuFacts {
        name: "Test GPU".into(),
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + i * 0x10),
        numa: Some(numa),
        pcie_generation: Some(pcie.0),
        pcie_width: Some(pcie.1),
        memory_bus_width_bits: None,
        max_memory_clock_mhz: None,
        nvlinks: Vec::new(),
    }
}

fn nvlinks(count: u32, generation: u8, remote: &str, class: u32) -> Vec<NvlinkFacts> {
    (0..count)
        .map(|link| NvlinkFacts {
            link,
            generation,
            remote_pci_bus_id: Some(remote.into()),
            remote_pci_class: Some(class),
        })
        .collect()
}

fn snapshot(
    gpus: Vec<GpuFacts>,
    level: impl Fn(usize, usize) -> CommonAncestor,
    p2p: bool,
) -> NvmlSnapshot {
    let n = gpus.len();
    NvmlSnapshot {
        driver_version: Some("550.54.15".into()),
        ancestors: (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| if i == j { Internal } else { level(i, j) })
                    .collect()
            })
            .collect(),
        p2p_read_ok: vec![vec![p2p; n]; n],
        gpus,
    }
}

fn class(t: &Topology, a: usize, b: usize) -> PathClass {
    let id = |i: usize| t.node_id(&format!("GPU{i}")).unwrap();
    t.path_class(id(a), id(b)).unwrap()
}

fn count(t: &Topology, kind: NodeKind) -> usize {
    t.nodes.iter().filter(|n| n.kind == kind).count()
}

/// DGX H100 as NVML would describe it: 18 NVLink 4 links per GPU, all
/// ending at NVSwitch chips (PCI class 0x068000), GPUs in pairs behind
/// PCIe 5.0 switches, four per socket.
fn dgx_h100() -> NvmlSnapshot {
    let gpus = (0..8)
        .map(|i| GpuFacts {
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_bus_width_bits: Some(5120),
            max_memory_clock_mhz: Some(2619),
            // NVML's version code 6 is NVLink 4.0.
            nvlinks: nvlinks(
                18,
                nvlink_generation(6).unwrap(),
                &format!("00000000:{:02X}:00.0", 0xc0 + i / 2),
                0x068000,
            ),
            ..gpu(i, (i / 4) as u32, (5, 16))
        })
        .collect();
    snapshot(
        gpus,
        |a, b| {
            if a / 2 == b / 2 {
                Single
            } else if a / 4 == b / 4 {
                Node
            } else {
                System
            }
        },
        true,
    )
}

#[test]
fn nvlink_version_codes_map_to_generations() {
    let expected = [
        (0, None),
        (1, Some(1)),
        (2, Some(2)),
        (3, Some(2)),
        (4, Some(3)),
        (5, Some(3)),
        (6, Some(4)),
        (7, Some(5)),
        (8, None),
    ];
    for (code, generation) in expected {
        assert_eq!(nvlink_generation(code), generation, "code {code}");
    }
}

#[test]
fn bus_ids_are_normalised_to_the_sysfs_form() {
    assert_eq!(normalize_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
    assert_eq!(normalize_bus_id("0000:1b:00.0"), "0000:1b:00.0");
    assert_eq!(normalize_bus_id("00000001:C0:00.0"), "0001:c0:00.0");
    assert_eq!(normalize_bus_id("1B:00.0"), "0000:1b:00.0");
}

#[test]
fn nvml_dgx_h100_is_nv18_everywhere_with_its_pcie_tree_behind() {
    let t = build_topology(&dgx_h100()).unwrap();
    assert_eq!(t.devices().len(), 8);
    for a in 0..8 {
        for b in 0..8 {
            if a != b {
                assert_eq!(class(&t, a, b), PathClass::NvLink(18), "GPU{a}-GPU{b}");
                assert!(t.p2p(a, b));
            }
        }
    }
    assert_eq!(count(&t, NodeKind::NvSwitch), 1);
    assert_eq!(count(&t, NodeKind::Cpu), 2);
    // Two host bridges per socket: the pairs are NODE apart.
    assert_eq!(count(&t, NodeKind::HostBridge), 4);
    assert_eq!(count(&t, NodeKind::PcieSwitch), 4);
    let g0 = &t.nodes[0];
    assert_eq!(g0.pci_bus_id.as_deref(), Some("0000:10:00.0"));
    assert_eq!(g0.numa, Some(0));
    assert_eq!(t.nodes[7].numa, Some(1));
    let hbm = g0.memory_bandwidth.unwrap();
    assert!((hbm - 3352.3).abs() < 0.1, "{hbm}");
    let fabric = t.node_id("NVSwitch").unwrap();
    let to_fabric = t.links_from(0).find(|(_, l)| l.to == fabric).unwrap().1;
    assert_eq!(
        to_fabric.kind,
        LinkKind::Nvlink {
            generation: 4,
            count: 18
        }
    );
    assert_eq!(to_fabric.bandwidth, 450.0);
    let to_switch = t.links_from(0).find(|(_, l)| l.kind.is_pcie()).unwrap().1;
    assert_eq!(
        to_switch.kind,
        LinkKind::Pcie {
            generation: 5,
            width: 16
        }
    );
    assert!(
        t.description.contains("8 x NVIDIA H100 80GB HBM3"),
        "{}",
        t.description
    );
}

#[test]
fn nvml_dgx_h100_pcie_classes_show_once_nvlink_is_gone() {
    let mut s = dgx_h100();
    for g in &mut s.gpus {
        g.nvlinks.clear();
    }
    let t = build_topology(&s).unwrap();
    assert_eq!(count(&t, NodeKind::NvSwitch), 0);
    assert_eq!(class(&t, 0, 1), PathClass::Pix);
    assert_eq!(class(&t, 0, 2), PathClass::Node);
    assert_eq!(class(&t, 0, 4), PathClass::Sys);
}

/// A 4-GPU PCIe 4.0 box with peer-to-peer off: two cards behind one
/// switch, a third on another root port of the same socket, the fourth
/// on the other socket.
#[test]
fn nvml_pcie_box_without_p2p_stages_through_host_memory() {
    let gpus = (0..4).map(|i| gpu(i, u32::from(i == 3), (4, 16))).collect();
    let s = snapshot(
        gpus,
        |a, b| match (a.min(b), a.max(b)) {
            (0, 1) => Single,
            (_, 3) => System,
            _ => Node,
        },
        false,
    );
    let t = build_topology(&s).unwrap();
    assert_eq!(class(&t, 0, 1), PathClass::Pix);
    assert_eq!(class(&t, 0, 2), PathClass::Node);
    assert_eq!(class(&t, 1, 2), PathClass::Node);
    assert_eq!(class(&t, 2, 3), PathClass::Sys);
    assert_eq!(class(&t, 0, 3), PathClass::Sys);
    for a in 0..4 {
        for b in 0..4 {
            if a != b {
                assert!(!t.p2p(a, b), "GPU{a}-GPU{b}");
            }
        }
    }
    let route = t.route(0, 1).unwrap();
    let cpu0 = t.node_id("CPU0").unwrap();
    assert_eq!(route.staged_in, Some(cpu0));
    let cpu1 = t.node_id("CPU1").unwrap();
    assert_eq!(t.nodes[cpu1].numa, Some(1));
    let upi = t.links_from(cpu0).find(|(_, l)| l.to == cpu1).unwrap().1;
    assert_eq!(upi.kind, LinkKind::CpuInterconnect);
    assert_eq!(upi.bandwidth, UPI_GBPS);
}

#[test]
fn every_ancestor_level_becomes_its_path_class() {
    // 0,1 share a switch; 2 is in the same switch tree; 3 under the same
    // host bridge; 4 on another bridge of the socket; 5 on the other
    // socket.
    let rank = |g: usize| match g {
        0 | 1 => 0,
        g => g - 1,
    };
    let levels = [Single, Multiple, HostBridge, Node, System];
    let gpus = (0..6).map(|i| gpu(i, u32::from(i == 5), (4, 16))).collect();
    let s = snapshot(gpus, |a, b| levels[rank(a).max(rank(b))], true);
    let t = build_topology(&s).unwrap();
    let expect = [
        (0, 1, PathClass::Pix),
        (0, 2, PathClass::Pxb),
        (1, 2, PathClass::Pxb),
        (0, 3, PathClass::Phb),
        (2, 3, PathClass::Phb),
        (0, 4, PathClass::Node),
        (3, 4, PathClass::Node),
        (0, 5, PathClass::Sys),
        (4, 5, PathClass::Sys),
    ];
    for (a, b, c) in expect {
        assert_eq!(class(&t, a, b), c, "GPU{a}-GPU{b}");
        assert_eq!(class(&t, b, a), c, "GPU{b}-GPU{a}");
    }
}

#[test]
fn a_single_host_bridge_socket_is_phb() {
    let gpus = (0..2).map(|i| gpu(i, 0, (3, 16))).collect();
    let t = build_topology(&snapshot(gpus, |_, _| HostBridge, true)).unwrap();
    assert_eq!(class(&t, 0, 1), PathClass::Phb);
    assert_eq!(count(&t, NodeKind::HostBridge), 0);
    assert_eq!(count(&t, NodeKind::PcieSwitch), 0);
}

/// Two GPUs joined by a 4-link NVLink 3 bridge (NVML code 5, NVLink
/// 3.1), each on a CPU root port.
#[test]
fn nvml_nvlink_pair_is_nv4() {
    let mut gpus: Vec<GpuFacts> = (0..2).map(|i| gpu(i, 0, (4, 16))).collect();
    let ids: Vec<String> = gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
    gpus[0].nvlinks = nvlinks(4, nvlink_generation(5).unwrap(), &ids[1], 0x030000);
    // The far side in the other spelling, to check that matching
    // normalises.
    gpus[1].nvlinks = nvlinks(4, 3, &normalize_bus_id(&ids[0]), 0x030000);
    let t = build_topology(&snapshot(gpus, |_, _| HostBridge, true)).unwrap();
    assert_eq!(class(&t, 0, 1), PathClass::NvLink(4));
    assert!(t.p2p(0, 1));
    let route = t.route(0, 1).unwrap();
    assert_eq!(route.bandwidth, 100.0);
    assert_eq!(route.links.len(), 1);
    assert_eq!(count(&t, NodeKind::NvSwitch), 0);
    // One bundle each way, not one per side's report.
    assert_eq!(t.links.iter().filter(|l| l.kind.is_nvlink()).count(), 2);
}

#[test]
fn links_to_hidden_gpus_are_left_out_and_unknown_far_ends_are_the_fabric() {
    let mut gpus: Vec<GpuFacts> = (0..2).map(|i| gpu(i, 0, (4, 16))).collect();
    gpus[0].nvlinks = nvlinks(2, 2, "0000:ee:00.0", 0x030200);
    gpus[1].nvlinks = vec![NvlinkFacts {
        link: 0,
        generation: 2,
        remote_pci_bus_id: None,
        remote_pci_class: None,
    }];
    let t = build_topology(&snapshot(gpus, |_, _| HostBridge, true)).unwrap();
    let fabric = t.node_id("NVSwitch").unwrap();
    assert_eq!(
        t.links_from(0).filter(|(_, l)| l.kind.is_nvlink()).count(),
        0
    );
    assert_eq!(
        t.links_from(1)
            .find(|(_, l)| l.to == fabric)
            .unwrap()
            .1
            .kind,
        LinkKind::Nvlink {
            generation: 2,
            count: 1
        }
    );
}

#[test]
fn one_way_p2p_refusal_blocks_the_pair() {
    let gpus = (0..3).map(|i| gpu(i, 0, (4, 16))).collect();
    let mut s = snapshot(gpus, |_, _| Single, true);
    s.p2p_read_ok[2][0] = false;
    let t = build_topology(&s).unwrap();
    assert!(!t.p2p(0, 2));
    assert!(t.p2p(0, 1) && t.p2p(1, 2));
}

#[test]
fn malformed_snapshots_are_refused_not_panicked_on() {
    let good = dgx_h100();
    let mut s = good.clone();
    s.ancestors.pop();
    assert!(matches!(build_topology(&s), Err(TopologyError::Invalid(_))));
    let mut s = good.clone();
    s.p2p_read_ok[3].push(true);
    assert!(matches!(build_topology(&s), Err(TopologyError::Invalid(_))));
    let mut s = good.clone();
    s.gpus[1].pci_bus_id = "0000:10:00.0".into();
    assert!(matches!(build_topology(&s), Err(TopologyError::Invalid(_))));
    let mut s = good.clone();
    s.gpus[0].pcie_generation = Some(7);
    assert!(matches!(build_topology(&s), Err(TopologyError::Invalid(_))));
    let mut s = good.clone();
    s.gpus[0].pcie_width = Some(0);
    assert!(matches!(build_topology(&s), Err(TopologyError::Invalid(_))));
    let mut s = good;
    s.gpus[2].nvlinks[0].generation = 6;
    assert!(matches!(build_topology(&s), Err(TopologyError::Invalid(_))));
    let empty = NvmlSnapshot {
        driver_version: None,
        gpus: Vec::new(),
        ancestors: Vec::new(),
        p2p_read_ok: Vec::new(),
    };
    assert!(matches!(
        build_topology(&empty),
        Err(TopologyError::Invalid(_))
    ));
}

#[test]
fn missing_pcie_facts_fall_back_to_gen3_x16() {
    let mut gpus: Vec<GpuFacts> = (0..2).map(|i| gpu(i, 0, (4, 16))).collect();
    gpus[1].pcie_generation = None;
    gpus[1].pcie_width = None;
    gpus[1].numa = None;
    let t = build_topology(&snapshot(gpus, |_, _| Single, true)).unwrap();
    let link = t.links_from(1).next().unwrap().1;
    assert_eq!(
        link.kind,
        LinkKind::Pcie {
            generation: 3,
            width: 16
        }
    );
    assert_eq!(t.nodes[1].numa, None);
}

#[test]
fn snapshots_round_trip_through_json() {
    let s = dgx_h100();
    let text = serde_json::to_string_pretty(&s).unwrap();
    assert!(text.contains("\"single\"") && text.contains("\"system\""));
    let back: NvmlSnapshot = serde_json::from_str(&text).unwrap();
    assert_eq!(back, s);
    assert_eq!(build_topology(&back).unwrap(), build_topology(&s).unwrap());
}

/// On a machine without the driver (this one, and CI) discovery must
/// say so through the error, not panic. Where there are GPUs it must
/// hand back a valid graph.
#[test]
fn discover_fails_cleanly_without_nvml() {
    match discover() {
        Err(TopologyError::Nvml(message)) => assert!(message.contains("NVML"), "{message}"),
        Ok(t) => {
            t.validate().unwrap();
            assert!(!t.devices().is_empty());
        }
        Err(other) => panic!("expected an NVML error, got {other}"),
    }
}
