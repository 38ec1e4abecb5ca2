use super::*;
use crate::graph::PathClass;
use ferrocoll_core::xml::DOCUMENT;

const A100: &str = include_str!("../../../tests/fixtures/nccl_xml/dgx_a100.xml");
const PAIR: &str = include_str!("../../../tests/fixtures/nccl_xml/nvlink_pair.xml");
const PCIE: &str = include_str!("../../../tests/fixtures/nccl_xml/pcie_4gpu_nic.xml");
const UNCLOSED: &str = include_str!("../../../tests/fixtures/nccl_xml/unclosed.xml");
const MISMATCHED: &str = include_str!("../../../tests/fixtures/nccl_xml/mismatched.xml");
const BAD_ATTRIBUTE: &str = include_str!("../../../tests/fixtures/nccl_xml/bad_attribute.xml");

fn count(t: &Topology, kind: NodeKind) -> usize {
    t.nodes.iter().filter(|n| n.kind == kind).count()
}

fn class(t: &Topology, a: &str, b: &str) -> PathClass {
    t.path_class(t.node_id(a).unwrap(), t.node_id(b).unwrap())
        .unwrap()
}

fn error_at(text: &str) -> (usize, String, String) {
    match parse_nccl_xml(text).unwrap_err() {
        TopologyError::NcclXml {
            line,
            element,
            message,
        } => (line, element, message),
        other => panic!("not an NCCL XML error: {other}"),
    }
}

/// A minimal dump around one GPU's `<gpu>` body.
fn one_cpu(body: &str) -> String {
    format!(
        "<system version=\"1\">\n  <cpu numaid=\"0\" arch=\"x86_64\">\n{body}\n  </cpu>\n</system>\n"
    )
}

#[test]
fn dgx_a100_is_eight_gpus_on_one_nvswitch_fabric() {
    let t = parse_nccl_xml(A100).unwrap();
    assert_eq!(t.devices().len(), 8);
    assert_eq!(count(&t, NodeKind::Cpu), 2);
    assert_eq!(count(&t, NodeKind::Nic), 4);
    assert_eq!(count(&t, NodeKind::PcieSwitch), 8);
    assert_eq!(count(&t, NodeKind::NvSwitch), 1);
    assert_eq!(t.nodes.len(), 8 + 2 + 4 + 8 + 1);
    // Ranks follow dev, though the dump lists GPU1 before GPU0.
    for (r, &d) in t.devices().iter().enumerate() {
        assert_eq!(t.nodes[d].name, format!("GPU{r}"));
    }
    assert_eq!(t.nodes[0].pci_bus_id.as_deref(), Some("0000:07:00.0"));
    assert_eq!(t.nodes[1].pci_bus_id.as_deref(), Some("0000:0f:00.0"));
    assert_eq!(t.nodes[5].numa, Some(1));
    for a in 0..8 {
        for b in 0..8 {
            let want = if a == b {
                PathClass::Same
            } else {
                PathClass::NvLink(12)
            };
            assert_eq!(t.path_class(a, b).unwrap(), want, "GPU{a} to GPU{b}");
        }
    }
    let fabric = t.node_id("NVSwitch").unwrap();
    let bundles: Vec<_> = t.links.iter().filter(|l| l.to == fabric).collect();
    assert_eq!(bundles.len(), 8);
    for l in bundles {
        assert_eq!(
            l.kind,
            LinkKind::Nvlink {
                generation: 3,
                count: 12
            }
        );
        assert_eq!(l.bandwidth, 300.0);
    }
    assert_eq!(class(&t, "GPU0", "mlx5_0"), PathClass::Pxb);
    assert_eq!(class(&t, "GPU0", "mlx5_1"), PathClass::Phb);
    assert_eq!(class(&t, "GPU0", "mlx5_2"), PathClass::Sys);
    assert_eq!(class(&t, "mlx5_0", "mlx5_1"), PathClass::Phb);
    let plx = t.nodes.iter().find(|n| n.name == "PLX0").unwrap();
    assert_eq!(plx.pci_bus_id.as_deref(), Some("0000:01:00.0"));
    let gen4 = LinkKind::Pcie {
        generation: 4,
        width: 16,
    };
    assert!(
        t.links
            .iter()
            .filter(|l| l.kind.is_pcie())
            .all(|l| l.kind == gen4)
    );
}

#[test]
fn direct_nvlink_pair_is_one_bundle_read_from_both_ends() {
    let t = parse_nccl_xml(PAIR).unwrap();
    assert_eq!(t.devices().len(), 2);
    assert_eq!(t.path_class(0, 1).unwrap(), PathClass::NvLink(4));
    let nv: Vec<_> = t.links.iter().filter(|l| l.kind.is_nvlink()).collect();
    assert_eq!(nv.len(), 2, "one bundle, both directions");
    assert_eq!(
        nv[0].kind,
        LinkKind::Nvlink {
            generation: 3,
            count: 4
        }
    );
    assert_eq!(count(&t, NodeKind::NvSwitch), 0);
    assert_eq!(count(&t, NodeKind::PcieSwitch), 0);
    // Without the NVLink the two cards meet at the CPU.
    let mut pcie_only = t.clone();
    pcie_only.links.retain(|l| !l.kind.is_nvlink());
    assert_eq!(pcie_only.path_class(0, 1).unwrap(), PathClass::Phb);
}

#[test]
fn pcie_box_classes_and_fallback_link_speeds() {
    let t = parse_nccl_xml(PCIE).unwrap();
    assert_eq!(t.devices().len(), 4);
    assert_eq!(count(&t, NodeKind::Nic), 1);
    assert_eq!(count(&t, NodeKind::PcieSwitch), 2);
    assert!(t.links.iter().all(|l| !l.kind.is_nvlink()));
    assert_eq!(class(&t, "GPU0", "GPU1"), PathClass::Pix);
    assert_eq!(class(&t, "GPU2", "GPU3"), PathClass::Pix);
    assert_eq!(class(&t, "GPU0", "GPU2"), PathClass::Phb);
    assert_eq!(class(&t, "GPU1", "mlx5_0"), PathClass::Pix);
    assert_eq!(class(&t, "GPU3", "mlx5_0"), PathClass::Phb);
    let gpu0 = t.node_id("GPU0").unwrap();
    let up = t.links.iter().find(|l| l.from == gpu0).unwrap();
    assert_eq!(
        up.kind,
        LinkKind::Pcie {
            generation: 3,
            width: 16
        }
    );
    // The NIC's slot reports `Unknown speed` and width 0: PCIe 3.0 x16.
    let nic = t.node_id("mlx5_0").unwrap();
    let up = t.links.iter().find(|l| l.from == nic).unwrap();
    assert_eq!(
        up.kind,
        LinkKind::Pcie {
            generation: 3,
            width: 16
        }
    );
    // GPU3's own link is gen 4 x8.
    let gpu3 = t.node_id("GPU3").unwrap();
    let up = t.links.iter().find(|l| l.from == gpu3).unwrap();
    assert_eq!(
        up.kind,
        LinkKind::Pcie {
            generation: 4,
            width: 8
        }
    );
}

#[test]
fn malformed_fixtures_name_line_and_element() {
    let (line, element, message) = error_at(UNCLOSED);
    assert_eq!((line, element.as_str()), (5, "gpu"), "{message}");
    assert!(message.contains("never closed"), "{message}");

    let (line, element, message) = error_at(MISMATCHED);
    assert_eq!((line, element.as_str()), (8, "gpu"), "{message}");
    assert!(
        message.contains("`</pci>` closes `<gpu>` opened on line 5"),
        "{message}"
    );

    let (line, element, message) = error_at(BAD_ATTRIBUTE);
    assert_eq!((line, element.as_str()), (4, "pci"), "{message}");
    assert!(message.contains("`class` is not in quotes"), "{message}");
}

#[test]
fn link_speeds_map_to_generations() {
    assert_eq!(pcie_generation("2.5 GT/s"), Some(1));
    assert_eq!(pcie_generation("5 GT/s"), Some(2));
    assert_eq!(pcie_generation("5.0 GT/s PCIe"), Some(2));
    assert_eq!(pcie_generation("8 GT/s"), Some(3));
    assert_eq!(pcie_generation("16 GT/s"), Some(4));
    assert_eq!(pcie_generation("16.0 GT/s PCIe"), Some(4));
    assert_eq!(pcie_generation("32.0 GT/s PCIe"), Some(5));
    assert_eq!(pcie_generation("64.0 GT/s PCIe"), Some(6));
    assert_eq!(pcie_generation("Unknown speed"), None);
    assert_eq!(pcie_generation("16"), None);
    assert_eq!(pcie_generation("12 GT/s"), None);
    assert_eq!(nvlink_generation(60), 1);
    assert_eq!(nvlink_generation(70), 2);
    assert_eq!(nvlink_generation(80), 3);
    assert_eq!(nvlink_generation(86), 3);
    assert_eq!(nvlink_generation(90), 4);
    assert_eq!(nvlink_generation(100), 5);
    assert_eq!(nvlink_generation(120), 5);
    assert_eq!(bus_id_key("0000:07:00.0"), bus_id_key("00000000:07:00.0"));
    assert_ne!(bus_id_key("0000:07:00.0"), bus_id_key("0000:08:00.0"));
    assert_eq!(bus_id_key("zz"), None);
}

#[test]
fn tokenizer_reads_what_nccl_writes_and_a_little_more() {
    let text = "\u{feff}<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
                <!-- dumped by hand -->\n\
                <system version='1'>\n\
                <cpu numaid = \"0\" vendor=\"A &amp; B &lt;&gt;&quot;&apos;&#65;&#x42;\"/>\n\
                stray text\n\
                </system >\n\
                <!-- trailing -->\n";
    let root = parse_document(text).unwrap();
    assert_eq!(root.name, "system");
    assert_eq!(root.attr("version"), Some("1"));
    assert_eq!(root.children.len(), 1);
    let cpu = &root.children[0];
    assert_eq!(cpu.line, 4);
    assert_eq!(cpu.attr("vendor"), Some("A & B <>\"'AB"));
    assert_eq!(cpu.attr("numaid"), Some("0"));
}

#[test]
fn malformed_xml_is_refused_with_line_and_element() {
    let deep = format!("<system>{}", "\n<pci>".repeat(300));
    let cases: &[(&str, usize, &str, &str)] = &[
        ("", 1, DOCUMENT, "empty"),
        ("  \n <!-- only -->\n", 3, DOCUMENT, "empty"),
        ("<system>\n</cpu>\n", 2, "system", "mismatched"),
        ("<system/>\n</system>\n", 2, "system", "never opened"),
        ("<system/>\n<system/>\n", 2, DOCUMENT, "second root"),
        (
            "<system>\n<cpu a=\"1\"b=\"2\"/>\n</system>",
            2,
            "cpu",
            "whitespace",
        ),
        (
            "<system>\n<cpu a=\"1\" a=\"2\"/>\n</system>",
            2,
            "cpu",
            "twice",
        ),
        ("<system>\n<cpu a/>\n</system>", 2, "cpu", "no `=`"),
        (
            "<system>\n<cpu a=\"1/>\n<x b=\"2\"/>\n</system>",
            2,
            "cpu",
            "holds a `<`",
        ),
        ("<system>\n<cpu a=\"1\n", 2, "cpu", "never closed"),
        (
            "<system>\n<cpu a=\"&nbsp;\"/>\n</system>",
            2,
            "cpu",
            "unknown entity",
        ),
        ("<system>\n<cpu a=\"&amp\"/>\n</system>", 2, "cpu", "no `;`"),
        ("<system>\n< cpu/>\n</system>", 2, DOCUMENT, "element name"),
        (
            "<system>\n<cpu $=\"1\"/>\n</system>",
            2,
            "cpu",
            "expected a name",
        ),
        ("<system>\n<cpu\n", 2, "cpu", "never ends"),
        ("<system>\n<!-- open\n</system>", 2, DOCUMENT, "comment"),
        ("<system>\n<![CDATA[x]]>\n</system>", 2, DOCUMENT, "CDATA"),
        ("<?xml version=\"1.0\"\n", 1, DOCUMENT, "`?>`"),
        ("text\n<system/>", 1, DOCUMENT, "outside"),
        ("<system/>\n\n junk", 3, DOCUMENT, "outside"),
        ("<topology>\n</topology>", 1, "topology", "<system>"),
        ("<system>\n</system", 2, "system", "not closed by `>`"),
        (&deep, 257, "pci", "deeper than 256"),
    ];
    for &(text, line, element, needle) in cases {
        let (l, e, m) = error_at(text);
        assert_eq!((l, e.as_str()), (line, element), "{text:?}: {m}");
        assert!(m.contains(needle), "{text:?}: {m}");
    }
}

#[test]
fn semantic_problems_are_refused() {
    let gpu = |dev: &str, bus: &str| {
        format!(
            "    <pci busid=\"{bus}\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n      <gpu dev=\"{dev}\" sm=\"80\" rank=\"{dev}\" gdr=\"1\"/>\n    </pci>"
        )
    };
    let text = one_cpu(&format!(
        "{}\n{}",
        gpu("0", "0000:07:00.0"),
        gpu("0", "0000:08:00.0")
    ));
    let (line, element, message) = error_at(&text);
    assert_eq!((line, element.as_str()), (7, "gpu"), "{message}");
    assert!(message.contains("dev 0"), "{message}");

    let text = one_cpu(&gpu("x", "0000:07:00.0"));
    let (line, _, message) = error_at(&text);
    assert_eq!(line, 4);
    assert!(message.contains("not a number"), "{message}");

    let text = one_cpu(
        "    <pci busid=\"0000:07:00.0\" class=\"0x030200\">\n      <gpu sm=\"80\"/>\n    </pci>",
    );
    assert!(error_at(&text).2.contains("without `dev`"));

    let text = one_cpu(
        "    <pci busid=\"0000:07:00.0\" class=\"0x030200\">\n      <gpu dev=\"0\" sm=\"80\">\n        <nvlink target=\"0000:08:00.0\" count=\"2\"/>\n      </gpu>\n    </pci>",
    );
    let (line, element, _) = error_at(&text);
    assert_eq!((line, element.as_str()), (5, "nvlink"));

    let nic = |name: &str| format!("    <nic>\n      <net name=\"{name}\" dev=\"0\"/>\n    </nic>");
    let text = one_cpu(&format!("{}\n{}", nic("eth0"), nic("eth0")));
    let (line, element, message) = error_at(&text);
    assert_eq!((line, element.as_str()), (7, "net"), "{message}");
}

#[test]
fn unknown_elements_cpu_links_and_invisible_switches() {
    // A POWER9-style NVLink to the CPU (0x068001), a link to a switch
    // NCCL could not see (written as a bridge, 0x060400), a c2c link,
    // a pcilink and attributes NCCL adds in newer versions.
    let text = "<system version=\"1\">
  <cpu host_hash=\"0x1234\" numaid=\"0\" arch=\"ppc64\">
<pci busid=\"0000:01:00.0\" class=\"0x060400\" link_speed=\"16 GT/s\" link_width=\"16\">
  <pcilink target=\"0000:02:00.0\"/>
  <pci busid=\"0000:04:00.0\" class=\"0x030200\" link_speed=\"16 GT/s\" link_width=\"16\">
    <gpu dev=\"0\" sm=\"70\" rank=\"0\" gdr=\"1\" future=\"yes\">
      <nvlink target=\"0000:00:00.0\" count=\"3\" tclass=\"0x068001\"/>
      <c2c count=\"10\" bw=\"45000\"/>
    </gpu>
  </pci>
  <pci busid=\"0000:05:00.0\" class=\"0x030200\" link_speed=\"16 GT/s\" link_width=\"16\">
    <gpu dev=\"1\" sm=\"90\" rank=\"1\" gdr=\"1\">
      <nvlink target=\"ffffffff:ff:ff.0\" count=\"18\" tclass=\"0x060400\"/>
      <nvlink target=\"0000:99:00.0\" count=\"1\" tclass=\"0x030200\"/>
      <nvlink target=\"0000:04:00.0\" count=\"0\" tclass=\"0x030200\"/>
    </gpu>
  </pci>
</pci>
<telemetry/>
  </cpu>
  <extra/>
</system>
";
    let t = parse_nccl_xml(text).unwrap();
    assert_eq!(t.devices().len(), 2);
    let cpu = t.node_id("CPU0").unwrap();
    let to_cpu = t.links.iter().find(|l| l.from == 0 && l.to == cpu).unwrap();
    assert_eq!(
        to_cpu.kind,
        LinkKind::Nvlink {
            generation: 2,
            count: 3
        }
    );
    let fabric = t.node_id("NVSwitch").unwrap();
    let to_fabric = t.links.iter().find(|l| l.to == fabric).unwrap();
    assert_eq!(to_fabric.from, 1);
    assert_eq!(
        to_fabric.kind,
        LinkKind::Nvlink {
            generation: 4,
            count: 18
        }
    );
    // GPU0 reaches the CPU by NVLink and GPU1 by PCIe: they meet on
    // PCIe through the bridge.
    assert_eq!(t.path_class(0, 1).unwrap(), PathClass::Pix);
}

#[test]
fn nvlink_counts_from_both_ends_and_one_end() {
    let gpu = |dev: u32, bus: &str, links: &str| {
        format!(
            "    <pci busid=\"{bus}\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n      <gpu dev=\"{dev}\" sm=\"80\" rank=\"{dev}\" gdr=\"1\">\n{links}\n      </gpu>\n    </pci>"
        )
    };
    let link = |to: &str, n: u32| {
        format!("        <nvlink target=\"{to}\" count=\"{n}\" tclass=\"0x030200\"/>")
    };
    // GPU0 says 4 links to GPU1, GPU1 says 2: the smaller stands. GPU2
    // is listed only by GPU0 (NVML's target in the long form).
    let text = one_cpu(&format!(
        "{}\n{}\n{}",
        gpu(
            0,
            "0000:07:00.0",
            &format!(
                "{}\n{}",
                link("0000:08:00.0", 4),
                link("00000000:09:00.0", 2)
            )
        ),
        gpu(1, "0000:08:00.0", &link("0000:07:00.0", 2)),
        gpu(2, "0000:09:00.0", "")
    ));
    let t = parse_nccl_xml(&text).unwrap();
    assert_eq!(t.path_class(0, 1).unwrap(), PathClass::NvLink(2));
    assert_eq!(t.path_class(0, 2).unwrap(), PathClass::NvLink(2));
    assert_eq!(t.path_class(1, 2).unwrap(), PathClass::Phb);
    assert_eq!(t.links.iter().filter(|l| l.kind.is_nvlink()).count(), 4);
}
