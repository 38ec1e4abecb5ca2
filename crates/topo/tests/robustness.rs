//! Stable-toolchain fuzzing of every text the topology crate reads: valid
//! fixtures, mutated at random (bytes replaced, inserted, deleted, lines
//! duplicated or cut), must parse to a topology or a typed error — never a
//! panic. The `fuzz/` targets do the same with libFuzzer on nightly.

use ferrocoll_topo::Topology;
use ferrocoll_topo::sources::{nccl_xml, smi};
use proptest::prelude::*;

const SMI: &[&str] = &[
    include_str!("fixtures/smi/dgx1v.txt"),
    include_str!("fixtures/smi/dgx_h100_nvswitch.txt"),
    include_str!("fixtures/smi/pcie_4gpu_tabs.txt"),
    include_str!("fixtures/smi/hgx_a100_4gpu.txt"),
];
const XML: &[&str] = &[
    include_str!("fixtures/nccl_xml/dgx_a100.xml"),
    include_str!("fixtures/nccl_xml/nvlink_pair.xml"),
    include_str!("fixtures/nccl_xml/pcie_4gpu_nic.xml"),
];

/// `text` with a few random edits.
fn mutate(text: &str, edits: &[(u8, usize, u8)]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for &(kind, at, byte) in edits {
        if bytes.is_empty() {
            bytes.push(byte);
            continue;
        }
        let i = at % bytes.len();
        match kind % 5 {
            0 => bytes[i] = byte,
            1 => bytes.insert(i, byte),
            2 => {
                bytes.remove(i);
            }
            3 => {
                // Duplicate the rest of the line.
                let end = bytes[i..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(bytes.len(), |p| i + p);
                let copy = bytes[i..end].to_vec();
                bytes.splice(i..i, copy);
            }
            _ => bytes.truncate(i),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn edits() -> impl Strategy<Value = Vec<(u8, usize, u8)>> {
    prop::collection::vec(
        (
            any::<u8>(),
            any::<usize>(),
            prop::sample::select(b" \t\nXNV1SYS<>=\"/0-9ax".to_vec()),
        ),
        1..8,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn mutated_smi_text_never_panics(pick in 0usize..4, e in edits()) {
        let text = mutate(SMI[pick % SMI.len()], &e);
        if let Ok(t) = smi::parse_smi(&text) {
            prop_assert!(t.validate().is_ok());
        }
    }

    #[test]
    fn mutated_nccl_xml_never_panics(pick in 0usize..3, e in edits()) {
        let text = mutate(XML[pick % XML.len()], &e);
        if let Ok(t) = nccl_xml::parse_nccl_xml(&text) {
            prop_assert!(t.validate().is_ok());
        }
    }

    #[test]
    fn mutated_topology_files_never_panic(pick in 0usize..16, e in edits()) {
        let name = ferrocoll_topo::presets::NAMES[pick % 15];
        let text = mutate(&ferrocoll_topo::presets::by_name(name, 2).unwrap().to_json(), &e);
        if let Ok(t) = Topology::from_json(&text) {
            prop_assert!(t.validate().is_ok());
            // A loaded topology is usable: every route and class resolves
            // or is a typed error.
            let d = t.devices();
            for &a in d.iter().take(3) {
                for &b in d.iter().take(3) {
                    let _ = t.route(a, b);
                    let _ = t.path_class(a, b);
                }
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = smi::parse_smi(&text);
        let _ = nccl_xml::parse_nccl_xml(&text);
        let _ = Topology::from_json(&text);
    }
}
