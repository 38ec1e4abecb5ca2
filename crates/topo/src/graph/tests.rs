use super::*;
use crate::presets;

#[test]
fn files_round_trip_exactly_for_every_preset() {
    for name in presets::NAMES {
        let t = presets::by_name(name, 3).unwrap();
        let text = t.to_json();
        let back = Topology::from_json(&text).unwrap();
        assert_eq!(back, t, "{name}");
        assert_eq!(back.to_json(), text, "{name}");
    }
}

#[test]
fn malformed_files_are_typed_errors_with_positions() {
    let good = presets::by_name("pcie4-4gpu", 1).unwrap().to_json();
    let err = Topology::from_json("{ \"format\": ").unwrap_err();
    assert!(matches!(err, TopologyError::Json { line: 1, .. }), "{err}");
    let err = Topology::from_json(&good.replace("\"version\": 1", "\"version\": 7")).unwrap_err();
    assert!(matches!(
        err,
        TopologyError::UnsupportedVersion { found: Some(7), .. }
    ));
    let err = Topology::from_json(&good.replace("ferrocoll-topology", "other")).unwrap_err();
    assert!(matches!(err, TopologyError::NotATopologyFile { .. }));
    let err =
        Topology::from_json(&good.replacen("\"to\": \"PLX0\"", "\"to\": \"PLX9\"", 1)).unwrap_err();
    assert!(
        matches!(&err, TopologyError::UnknownNode(m) if m.contains("PLX9") && m.contains("links[")),
        "{err}"
    );
    let err = Topology::from_json(&good.replacen("\"bandwidth\"", "\"bandwith\"", 1)).unwrap_err();
    assert!(
        matches!(&err, TopologyError::Json { message, .. } if message.contains("bandwith")),
        "{err}"
    );
    let err = Topology::from_json(&good.replacen("\"latency_us\": 1.0", "\"latency_us\": -1.0", 1))
        .unwrap_err();
    assert!(matches!(err, TopologyError::Invalid(_)), "{err}");
}

#[test]
fn path_classes_follow_nvidia_smi() {
    let t = presets::by_name("pcie4-8gpu-2numa", 1).unwrap();
    let class = |a, b| t.path_class(a, b).unwrap().to_string();
    assert_eq!(class(0, 0), "X");
    assert_eq!(class(0, 1), "PIX");
    assert_eq!(class(0, 2), "PHB");
    assert_eq!(class(0, 7), "SYS");
    let h = presets::by_name("dgx-h100", 1).unwrap();
    assert_eq!(h.path_class(0, 5).unwrap(), PathClass::NvLink(18));
    let v = presets::by_name("dgx1-v100", 1).unwrap();
    assert_eq!(v.path_class(0, 3).unwrap(), PathClass::NvLink(2));
    assert_eq!(v.path_class(0, 1).unwrap(), PathClass::NvLink(1));
    assert_eq!(v.path_class(0, 5).unwrap(), PathClass::Sys);
    let host = presets::by_name("host", 2).unwrap();
    assert_eq!(host.path_class(0, 1).unwrap(), PathClass::Shm);
}

#[test]
fn routes_prefer_nvlink_and_stage_without_p2p() {
    let v = presets::by_name("dgx1-v100", 1).unwrap();
    let r = v.route(0, 3).unwrap();
    assert_eq!(r.links.len(), 1);
    assert_eq!(r.bandwidth, 50.0);
    // 0 and 5 have no NVLink: PCIe up through both sockets.
    let r = v.route(0, 5).unwrap();
    assert!(
        r.links
            .iter()
            .any(|&l| v.links[l].kind == LinkKind::CpuInterconnect)
    );
    let t = presets::by_name("pcie4-4gpu-nop2p", 1).unwrap();
    let r = t.route(0, 1).unwrap();
    assert_eq!(r.staged_in, t.node_id("CPU0"));
    let on = presets::by_name("pcie4-4gpu", 1).unwrap();
    assert_eq!(on.route(0, 1).unwrap().links.len(), 2);
}

#[test]
fn validation_names_the_problem() {
    let mut t = Topology::new("bad", "");
    let a = t.add_node(Node::new("A", NodeKind::Gpu));
    let b = t.add_node(Node::new("A", NodeKind::Gpu));
    t.connect(
        a,
        b,
        LinkKind::Pcie {
            generation: 4,
            width: 16,
        },
    );
    assert!(matches!(t.validate(), Err(TopologyError::Invalid(m)) if m.contains("used twice")));
    t.nodes[1].name = "B".into();
    t.validate().unwrap();
    t.links[0].bandwidth = f64::NAN;
    assert!(t.validate().is_err());
    let mut t = Topology::new("islands", "");
    let a = t.add_node(Node::new("A", NodeKind::Gpu));
    let b = t.add_node(Node::new("B", NodeKind::Gpu));
    assert!(matches!(
        t.route(a, b),
        Err(TopologyError::Unreachable { .. })
    ));
}

#[test]
fn among_the_widest_paths_the_shortest_wins() {
    // A-S-C is wider than A-C, but the route to B is capped by C-B anyway:
    // the two-hop A-C-B is as wide as A-S-C-B and shorter.
    let mut t = Topology::new("detour", "");
    let a = t.add_node(Node::new("A", NodeKind::Gpu));
    let b = t.add_node(Node::new("B", NodeKind::Gpu));
    let s = t.add_node(Node::new("S", NodeKind::PcieSwitch));
    let c = t.add_node(Node::new("C", NodeKind::PcieSwitch));
    let pcie = LinkKind::Pcie {
        generation: 4,
        width: 16,
    };
    t.connect_with(a, s, pcie.clone(), 31.5, 1.0);
    t.connect_with(s, c, pcie.clone(), 31.5, 1.0);
    t.connect_with(a, c, pcie.clone(), 15.0, 1.0);
    t.connect_with(c, b, pcie, 10.0, 1.0);
    let r = t.route(a, b).unwrap();
    assert_eq!(r.links.len(), 2, "{r:?}");
    assert_eq!(r.bandwidth, 10.0);
}
