use super::matrix::{Cell, header_cells};
use super::*;
use crate::graph::{NodeKind, PathClass};

const DGX1V: &str = include_str!("../../../tests/fixtures/smi/dgx1v.txt");
const H100: &str = include_str!("../../../tests/fixtures/smi/dgx_h100_nvswitch.txt");
const PCIE4: &str = include_str!("../../../tests/fixtures/smi/pcie_4gpu_tabs.txt");
const CONSUMER: &str = include_str!("../../../tests/fixtures/smi/consumer_2gpu.txt");
const HGX4: &str = include_str!("../../../tests/fixtures/smi/hgx_a100_4gpu.txt");
const BAD_CODE: &str = include_str!("../../../tests/fixtures/smi/bad_code.txt");
const SHORT_ROW: &str = include_str!("../../../tests/fixtures/smi/short_row.txt");
const ASYMMETRIC: &str = include_str!("../../../tests/fixtures/smi/asymmetric.txt");
const NOT_A_TREE: &str = include_str!("../../../tests/fixtures/smi/not_a_tree.txt");

/// The cells of a fixture, read independently of the parser: the
/// header's device names and each row's first `n` codes.
fn expected_cells(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next().unwrap();
    let names: Vec<String> = header
        .split_whitespace()
        .take_while(|w| *w != "CPU")
        .map(String::from)
        .collect();
    let rows = lines
        .take(names.len())
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .take(names.len())
                .map(|c| match c {
                    "SOC" => "SYS".to_string(),
                    "PSB" => "PXB".to_string(),
                    other => other.to_string(),
                })
                .collect()
        })
        .collect();
    (names, rows)
}

/// Every cell (GPU–GPU, GPU–NIC, NIC–NIC) comes back as the path class.
fn assert_reproduces(text: &str, t: &Topology) {
    let (names, rows) = expected_cells(text);
    for (i, a) in names.iter().enumerate() {
        for (j, b) in names.iter().enumerate() {
            let (x, y) = (t.node_id(a).unwrap(), t.node_id(b).unwrap());
            let class = t.path_class(x, y).unwrap().to_string();
            assert_eq!(class, rows[i][j], "{a} to {b}");
        }
    }
}

fn count(t: &Topology, kind: NodeKind) -> usize {
    t.nodes.iter().filter(|n| n.kind == kind).count()
}

fn line_of(e: &TopologyError) -> usize {
    match e {
        TopologyError::Smi { line, .. } => *line,
        other => panic!("not an smi error: {other}"),
    }
}

#[test]
fn dgx1v_hybrid_cube_mesh_is_reproduced_with_its_real_generations() {
    let options = SmiOptions {
        nvlink_generation: 2,
        pcie_generation: 3,
    };
    let t = parse_smi_with(DGX1V, &options).unwrap();
    assert_reproduces(DGX1V, &t);
    assert_eq!(t.devices().len(), 8);
    assert_eq!(count(&t, NodeKind::Cpu), 2);
    assert_eq!(count(&t, NodeKind::Nic), 1);
    assert_eq!(count(&t, NodeKind::NvSwitch), 0);
    // mlx5_0 is NODE to GPU0/1 and PIX to GPU2/3: two host bridges.
    assert_eq!(count(&t, NodeKind::HostBridge), 2);
    let nvlinks = t.links.iter().filter(|l| l.kind.is_nvlink()).count();
    assert_eq!(nvlinks, 2 * 16, "16 NVLink bundles, both directions");
    let gpu = |i: usize| t.node_id(&format!("GPU{i}")).unwrap();
    assert_eq!(t.path_class(gpu(0), gpu(3)).unwrap(), PathClass::NvLink(2));
    assert_eq!(t.nodes[gpu(5)].numa, Some(1));
    // Devices come first, in header order: rank r is GPUr.
    assert_eq!(t.devices(), (0..8).map(gpu).collect::<Vec<_>>());
}

#[test]
fn narrow_nvlink_bundles_keep_their_class_under_default_generations() {
    // NV1 at NVLink 3 (25 GB/s) is narrower than PCIe 4.0 x16 (31.5
    // GB/s), but peer traffic takes NVLink whenever it exists.
    let t = parse_smi(DGX1V).unwrap();
    assert_reproduces(DGX1V, &t);
    let gpu = |i: usize| t.node_id(&format!("GPU{i}")).unwrap();
    assert_eq!(t.path_class(gpu(0), gpu(1)).unwrap(), PathClass::NvLink(1));
}

#[test]
fn h100_nvswitch_machine_gets_one_fabric_and_its_nic_legend() {
    let options = SmiOptions {
        nvlink_generation: 4,
        pcie_generation: 5,
    };
    let t = parse_smi_with(H100, &options).unwrap();
    assert_reproduces(H100, &t);
    assert_eq!(t.devices().len(), 8);
    assert_eq!(count(&t, NodeKind::NvSwitch), 1);
    assert_eq!(count(&t, NodeKind::Nic), 4);
    assert_eq!(count(&t, NodeKind::Cpu), 2);
    let fabric = t.node_id("NVSwitch").unwrap();
    let to_fabric: Vec<_> = t.links.iter().filter(|l| l.to == fabric).collect();
    assert_eq!(to_fabric.len(), 8);
    for l in to_fabric {
        assert_eq!(
            l.kind,
            LinkKind::Nvlink {
                generation: 4,
                count: 18
            }
        );
        assert_eq!(l.bandwidth, 450.0);
    }
    assert!(t.description.contains("NIC0 = mlx5_0"), "{}", t.description);
    assert!(t.description.contains("NIC3 = mlx5_3"), "{}", t.description);
    let nic = t.node_id("NIC2").unwrap();
    assert_eq!(t.nodes[nic].numa, Some(1));
    // Default generations change rates, not shape.
    let d = parse_smi(H100).unwrap();
    assert_reproduces(H100, &d);
}

#[test]
fn pcie_box_with_tabs() {
    let t = parse_smi(PCIE4).unwrap();
    assert_reproduces(PCIE4, &t);
    assert_eq!(count(&t, NodeKind::Cpu), 2);
    assert_eq!(count(&t, NodeKind::PcieSwitch), 1);
    assert_eq!(count(&t, NodeKind::HostBridge), 0);
    assert!(t.links.iter().all(|l| !l.kind.is_nvlink()));
    let cpu1 = t.node_id("CPU1").unwrap();
    let gpu3 = t.node_id("GPU3").unwrap();
    assert_eq!(t.nodes[gpu3].numa, Some(1));
    assert!(t.links.iter().any(|l| l.from == gpu3 && l.to == cpu1));
}

#[test]
fn legacy_driver_codes_soc_and_psb() {
    // Kepler-era drivers: SOC for SYS, PSB for PXB, spaces only.
    let text = "        GPU0    GPU1    GPU2    GPU3    CPU Affinity
GPU0     X      PSB     SOC     SOC     0-7
GPU1    PSB      X      SOC     SOC     0-7
GPU2    SOC     SOC      X      PIX     8-15
GPU3    SOC     SOC     PIX      X      8-15
";
    let t = parse_smi(text).unwrap();
    assert_reproduces(text, &t);
    assert_eq!(t.path_class(0, 1).unwrap(), PathClass::Pxb);
    assert_eq!(t.path_class(0, 2).unwrap(), PathClass::Sys);
    // GPU0/GPU1 each below a switch of their own, under a shared one.
    assert_eq!(count(&t, NodeKind::PcieSwitch), 4);
}

#[test]
fn consumer_box_hangs_both_cards_on_the_cpu() {
    let t = parse_smi(CONSUMER).unwrap();
    assert_reproduces(CONSUMER, &t);
    assert_eq!(t.nodes.len(), 3);
    assert_eq!(t.path_class(0, 1).unwrap(), PathClass::Phb);
    assert_eq!(
        t.links[0].kind,
        LinkKind::Pcie {
            generation: 4,
            width: 16
        }
    );
}

#[test]
fn four_gpu_nv4_mesh_stays_a_mesh_and_pxb_gets_two_switch_levels() {
    let t = parse_smi(HGX4).unwrap();
    assert_reproduces(HGX4, &t);
    // 3 peers × 4 links fit in an A100's 12: a real mesh, no switch.
    assert_eq!(count(&t, NodeKind::NvSwitch), 0);
    let bundles = t.links.iter().filter(|l| l.kind.is_nvlink()).count();
    assert_eq!(bundles, 2 * 6);
    assert_eq!(count(&t, NodeKind::HostBridge), 2);
    assert_eq!(count(&t, NodeKind::PcieSwitch), 6);
}

#[test]
fn tab_and_space_layouts_parse_alike() {
    let spaced = PCIE4.replace('\t', "    ");
    let a = parse_smi(PCIE4).unwrap();
    let b = parse_smi(&spaced).unwrap();
    assert_eq!(a, b);
    let crlf = CONSUMER.replace('\n', "\r\n");
    assert_eq!(parse_smi(&crlf).unwrap(), parse_smi(CONSUMER).unwrap());
}

#[test]
fn header_cells_rejoin_multi_word_columns() {
    let cells = header_cells("  GPU0  GPU1  NIC0  CPU Affinity  NUMA Affinity  GPU NUMA ID");
    assert_eq!(
        cells,
        [
            "GPU0",
            "GPU1",
            "NIC0",
            "CPU Affinity",
            "NUMA Affinity",
            "GPU NUMA ID"
        ]
    );
    let tabs = header_cells("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\t\t");
    assert_eq!(tabs, ["GPU0", "GPU1", "CPU Affinity", "NUMA Affinity"]);
}

#[test]
fn cell_codes() {
    assert_eq!(Cell::parse("NV18"), Some(Cell::Nv(18)));
    assert_eq!(Cell::parse("SOC"), Some(Cell::Sys));
    assert_eq!(Cell::parse("PSB"), Some(Cell::Pxb));
    assert_eq!(Cell::parse("NV0"), None);
    assert_eq!(Cell::parse("NV"), None);
    assert_eq!(Cell::parse("NV+3"), None);
    assert_eq!(Cell::parse("NV999"), None);
    assert_eq!(Cell::parse("pix"), None);
}

#[test]
fn malformed_fixtures_name_their_line() {
    let e = parse_smi(BAD_CODE).unwrap_err();
    assert_eq!(line_of(&e), 4, "{e}");
    assert!(e.to_string().contains("unknown cell `QPI`"), "{e}");
    assert!(e.to_string().contains("column `GPU3`"), "{e}");

    let e = parse_smi(SHORT_ROW).unwrap_err();
    assert_eq!(line_of(&e), 3, "{e}");
    assert!(e.to_string().contains("3 matrix cells"), "{e}");

    let e = parse_smi(ASYMMETRIC).unwrap_err();
    assert_eq!(line_of(&e), 5, "{e}");
    assert!(e.to_string().contains("asymmetric"), "{e}");

    let e = parse_smi(NOT_A_TREE).unwrap_err();
    assert!(e.to_string().contains("no PCIe tree"), "{e}");
    assert_eq!(line_of(&e), 4, "{e}");
}

#[test]
fn malformed_text_is_a_typed_error_with_a_line() {
    let e = parse_smi("").unwrap_err();
    assert_eq!(line_of(&e), 1);
    assert!(e.to_string().contains("empty"), "{e}");
    let e = parse_smi("\n  \n").unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");

    // The header is missing: the first line is a row.
    let e = parse_smi("\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n").unwrap_err();
    assert_eq!(line_of(&e), 2);
    assert!(e.to_string().contains("missing header"), "{e}");

    // A row the header does not name.
    let text = "\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU7\tPHB\t X \n";
    let e = parse_smi(text).unwrap_err();
    assert_eq!(line_of(&e), 3);
    assert!(e.to_string().contains("`GPU7` is not a column"), "{e}");

    // Not square: a row is missing.
    let text = "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPHB\tPHB\nGPU1\tPHB\t X \tPHB\n\nLegend:\n";
    let e = parse_smi(text).unwrap_err();
    assert_eq!(line_of(&e), 4);
    assert!(e.to_string().contains("no row for `GPU2`"), "{e}");

    // A row twice.
    let text = "\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU0\t X \tPHB\n";
    assert_eq!(line_of(&parse_smi(text).unwrap_err()), 3);

    // Too many cells after the matrix.
    let text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-3\t7\nGPU1\tPHB\t X \t0-3\n";
    let e = parse_smi(text).unwrap_err();
    assert_eq!(line_of(&e), 2);
    assert!(e.to_string().contains("only 3 columns"), "{e}");

    // X off the diagonal, and something else on it.
    let text = "\tGPU0\tGPU1\nGPU0\t X \t X \nGPU1\t X \t X \n";
    assert!(
        parse_smi(text)
            .unwrap_err()
            .to_string()
            .contains("off the diagonal")
    );
    let text = "\tGPU0\tGPU1\nGPU0\tPHB\tPHB\nGPU1\tPHB\t X \n";
    assert!(
        parse_smi(text)
            .unwrap_err()
            .to_string()
            .contains("expected X")
    );

    // NVLink to a NIC.
    let text = "\tGPU0\tNIC0\nGPU0\t X \tNV2\nNIC0\tNV2\t X \n";
    assert!(
        parse_smi(text)
            .unwrap_err()
            .to_string()
            .contains("GPUs only")
    );

    // No GPU at all.
    let text = "\tNIC0\tNIC1\nNIC0\t X \tPIX\nNIC1\tPIX\t X \n";
    assert!(parse_smi(text).unwrap_err().to_string().contains("no GPU"));

    // A column named twice.
    let text = "\tGPU0\tGPU0\nGPU0\t X \tPHB\n";
    assert!(parse_smi(text).unwrap_err().to_string().contains("twice"));
}

#[test]
fn options_out_of_range_are_refused() {
    let bad = SmiOptions {
        nvlink_generation: 9,
        pcie_generation: 4,
    };
    assert!(matches!(
        parse_smi_with(CONSUMER, &bad),
        Err(TopologyError::Invalid(_))
    ));
    let bad = SmiOptions {
        nvlink_generation: 3,
        pcie_generation: 0,
    };
    assert!(parse_smi_with(CONSUMER, &bad).is_err());
}

#[test]
fn devices_known_only_through_nvlink_join_a_cpu_by_affinity() {
    // GPU1 is NVLink to everything; its CPU affinity puts it with GPU0.
    let text = "\tGPU0\tGPU1\tGPU2\tCPU Affinity\n\
                GPU0\t X \tNV2\tSYS\t0-7\n\
                GPU1\tNV2\t X \tNV2\t0-7\n\
                GPU2\tSYS\tNV2\t X \t8-15\n";
    let t = parse_smi(text).unwrap();
    assert_reproduces(text, &t);
    assert_eq!(count(&t, NodeKind::Cpu), 2);
    assert_eq!(t.nodes[1].numa, t.nodes[0].numa);
}
