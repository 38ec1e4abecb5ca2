//! The graph as Graphviz DOT and as a standalone SVG drawing.

use std::f64::consts::PI;
use std::fmt::Write;

use crate::graph::{LinkKind, NodeKind, Topology};

/// Each duplex connection once (the direction with the lower source id),
/// with one-way links kept as they are.
fn connections(topo: &Topology) -> Vec<usize> {
    (0..topo.links.len())
        .filter(|&i| {
            let l = &topo.links[i];
            let reverse = topo
                .links
                .iter()
                .any(|m| m.from == l.to && m.to == l.from && m.kind == l.kind);
            !reverse || l.from < l.to
        })
        .collect()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Graphviz DOT: devices as boxes, CPUs as ellipses, switches as
/// diamonds; each connection labelled with its kind and per-direction rate.
pub fn dot(topo: &Topology) -> String {
    let mut s = format!(
        "graph \"{}\" {{\n  layout=neato; overlap=false; splines=true;\n",
        topo.name.replace('"', "'")
    );
    for n in &topo.nodes {
        let shape = match n.kind {
            NodeKind::Gpu | NodeKind::Thread => "box",
            NodeKind::Cpu => "ellipse",
            NodeKind::Nic => "hexagon",
            NodeKind::NetworkSwitch => "octagon",
            _ => "diamond",
        };
        let _ = writeln!(s, "  \"{}\" [shape={shape}];", n.name.replace('"', "'"));
    }
    for i in connections(topo) {
        let l = &topo.links[i];
        let style = if l.kind.is_nvlink() { "bold" } else { "solid" };
        let _ = writeln!(
            s,
            "  \"{}\" -- \"{}\" [label=\"{} {:.0} GB/s\", style={style}];",
            topo.nodes[l.from].name.replace('"', "'"),
            topo.nodes[l.to].name.replace('"', "'"),
            l.kind,
            l.bandwidth
        );
    }
    s.push_str("}\n");
    s
}

/// A self-contained SVG: devices on an outer circle, everything else on an
/// inner one; NVLink green, PCIe blue, CPU links orange, shared memory
/// grey; stroke width grows with the logarithm of the rate.
pub fn svg(topo: &Topology) -> String {
    let (w, h) = (900.0, 760.0);
    let (cx, cy) = (w / 2.0, h / 2.0 + 20.0);
    let outer: Vec<usize> = (0..topo.nodes.len())
        .filter(|&i| topo.nodes[i].kind.is_device())
        .collect();
    let inner: Vec<usize> = (0..topo.nodes.len())
        .filter(|&i| !topo.nodes[i].kind.is_device())
        .collect();
    let mut pos = vec![(0.0, 0.0); topo.nodes.len()];
    let place = |ids: &[usize], r: f64, pos: &mut Vec<(f64, f64)>| {
        for (k, &i) in ids.iter().enumerate() {
            let a = 2.0 * PI * k as f64 / ids.len().max(1) as f64 - PI / 2.0;
            pos[i] = (cx + r * a.cos(), cy + r * a.sin());
        }
    };
    place(&outer, 300.0, &mut pos);
    place(&inner, if inner.len() == 1 { 0.0 } else { 150.0 }, &mut pos);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"12\" y=\"22\" font-size=\"15\">{}: {}</text>\n",
        escape(&topo.name),
        escape(&topo.description.chars().take(110).collect::<String>())
    );
    for i in connections(topo) {
        let l = &topo.links[i];
        let colour = match l.kind {
            LinkKind::Nvlink { .. } => "#2e7d32",
            LinkKind::Pcie { .. } => "#1565c0",
            LinkKind::CpuInterconnect => "#ef6c00",
            LinkKind::Network => "#6a1b9a",
            LinkKind::SharedMemory => "#757575",
        };
        let width = 1.0 + l.bandwidth.max(1.0).ln();
        let ((x1, y1), (x2, y2)) = (pos[l.from], pos[l.to]);
        let _ = writeln!(
            s,
            "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{colour}\" stroke-width=\"{width:.1}\" stroke-opacity=\"0.7\"><title>{} - {}: {} {:.1} GB/s</title></line>",
            escape(&topo.nodes[l.from].name),
            escape(&topo.nodes[l.to].name),
            l.kind,
            l.bandwidth
        );
    }
    for (i, n) in topo.nodes.iter().enumerate() {
        let (x, y) = pos[i];
        let fill = match n.kind {
            NodeKind::Gpu => "#c8e6c9",
            NodeKind::Thread => "#eeeeee",
            NodeKind::Cpu => "#ffe0b2",
            NodeKind::Nic => "#e1bee7",
            NodeKind::NetworkSwitch => "#f8bbd0",
            _ => "#bbdefb",
        };
        let _ = writeln!(
            s,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"76\" height=\"26\" rx=\"5\" fill=\"{fill}\" stroke=\"#333\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            x - 38.0,
            y - 13.0,
            y + 4.0,
            escape(&n.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    #[test]
    fn drawings_name_every_node_and_each_connection_once() {
        let t = presets::by_name("dgx-h100", 1).unwrap();
        let d = dot(&t);
        assert_eq!(d.matches(" -- ").count(), t.links.len() / 2);
        assert!(
            d.contains("\"GPU0\" -- \"NVSwitch\" [label=\"NVLink4 x18 450 GB/s\""),
            "{d}"
        );
        let s = svg(&t);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        for n in &t.nodes {
            assert!(s.contains(&format!(">{}</text>", n.name)));
        }
    }
}
