//! ferrocoll's own topology file: versioned JSON that round-trips exactly.
//!
//! ```json
//! { "format": "ferrocoll-topology", "version": 1, "name": "pair",
//!   "description": "two GPUs on one NVLink bridge",
//!   "nodes": [ { "name": "GPU0", "kind": "gpu" }, { "name": "GPU1", "kind": "gpu" } ],
//!   "links": [ { "from": "GPU0", "to": "GPU1", "kind": { "nvlink": { "generation": 3, "count": 4 } },
//!                "bandwidth": 100.0, "latency_us": 0.6 } ],
//!   "p2p_blocked": [] }
//! ```
//!
//! Links name their ends by node name, and are directed: a duplex
//! connection is two entries. Unknown fields are refused, so a typo is an
//! error and not a silently ignored setting.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{LinkKind, Node, PhysicalLink, Topology};
use crate::error::TopologyError;

/// The `format` field every file carries.
pub const FORMAT_NAME: &str = "ferrocoll-topology";
/// The version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileV1 {
    format: String,
    version: u32,
    name: String,
    #[serde(default)]
    description: String,
    nodes: Vec<Node>,
    links: Vec<FileLink>,
    #[serde(default)]
    p2p_blocked: Vec<[String; 2]>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLink {
    from: String,
    to: String,
    kind: LinkKind,
    bandwidth: f64,
    latency_us: f64,
}

/// Only the header, read first so another version gets a precise error.
#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    version: Option<u32>,
}

impl Topology {
    /// The topology as a version-1 file.
    pub fn to_json(&self) -> String {
        let name = |id: usize| self.nodes[id].name.clone();
        let file = FileV1 {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            name: self.name.clone(),
            description: self.description.clone(),
            nodes: self.nodes.clone(),
            links: self
                .links
                .iter()
                .map(|l| FileLink {
                    from: name(l.from),
                    to: name(l.to),
                    kind: l.kind.clone(),
                    bandwidth: l.bandwidth,
                    latency_us: l.latency_us,
                })
                .collect(),
            p2p_blocked: self
                .p2p_blocked
                .iter()
                .map(|&(a, b)| [name(a), name(b)])
                .collect(),
        };
        let mut text = serde_json::to_string_pretty(&file).expect("a topology always serialises");
        text.push('\n');
        text
    }

    /// Parse a file written by [`Topology::to_json`] (or by hand).
    pub fn from_json(text: &str) -> Result<Topology, TopologyError> {
        let syntax = |e: serde_json::Error| TopologyError::Json {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        };
        let header: Header = serde_json::from_str(text).map_err(syntax)?;
        if header.format.as_deref() != Some(FORMAT_NAME) {
            return Err(TopologyError::NotATopologyFile {
                found: header.format,
            });
        }
        if header.version != Some(FORMAT_VERSION) {
            return Err(TopologyError::UnsupportedVersion {
                found: header.version,
                supported: FORMAT_VERSION,
            });
        }
        let file: FileV1 = serde_json::from_str(text).map_err(syntax)?;
        let mut topo = Topology::new(file.name, file.description);
        topo.nodes = file.nodes;
        let id = |name: &str, at: String, topo: &Topology| {
            topo.node_id(name)
                .ok_or_else(|| TopologyError::UnknownNode(format!("{name}` in `{at}")))
        };
        for (i, l) in file.links.into_iter().enumerate() {
            let link = PhysicalLink {
                from: id(&l.from, format!("links[{i}].from"), &topo)?,
                to: id(&l.to, format!("links[{i}].to"), &topo)?,
                kind: l.kind,
                bandwidth: l.bandwidth,
                latency_us: l.latency_us,
            };
            topo.links.push(link);
        }
        for (i, [a, b]) in file.p2p_blocked.iter().enumerate() {
            let (a, b) = (
                id(a, format!("p2p_blocked[{i}]"), &topo)?,
                id(b, format!("p2p_blocked[{i}]"), &topo)?,
            );
            topo.p2p_blocked.push((a.min(b), a.max(b)));
        }
        topo.validate()?;
        Ok(topo)
    }

    /// Read a topology file.
    pub fn load(path: impl AsRef<Path>) -> Result<Topology, TopologyError> {
        let path = path.as_ref();
        let text = ferrocoll_core::input::read_text(path).map_err(|e| TopologyError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Topology::from_json(&text)
    }
}
