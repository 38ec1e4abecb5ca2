//! Text and picture renderings of a topology: the `nvidia-smi topo -m`
//! style matrix, predicted bandwidth and latency matrices laid out like
//! `p2pBandwidthLatencyTest`, Graphviz DOT and a self-contained SVG.

mod matrix;
mod picture;

pub use matrix::{bandwidth_matrix, latency_matrix, smi_matrix};
pub use picture::{dot, svg};
