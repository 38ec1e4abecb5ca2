//! A topology from the connection matrix that `nvidia-smi topo -m` prints.
//!
//! The matrix names every GPU and NIC in a header row and gives, for each
//! pair, the kind of path between them: `X` (itself), `NV#` (a bonded set
//! of `#` NVLinks), `PIX` (at most one PCIe switch), `PXB` (several PCIe
//! switches), `PHB` (through a PCIe host bridge, the CPU), `NODE` (between
//! host bridges of one NUMA node) or `SYS` (across the socket
//! interconnect). [`parse_smi`] builds the smallest graph — CPUs, host
//! bridges, PCIe switches, NVLinks, an NVSwitch — on which
//! [`Topology::path_class`] gives back every cell of the matrix.
//!
//! Tolerated, because drivers print them differently over the years:
//! cells separated by tabs or by runs of spaces; the multi-word columns
//! `CPU Affinity`, `NUMA Affinity` and `GPU NUMA ID`, any of them absent;
//! rows that end early or in empty cells (newer drivers leave a NIC's
//! affinity empty); NICs named `NIC0` or by device (`mlx5_0`); the legacy
//! codes `SOC` (now `SYS`) and `PSB` (now `PXB`); a trailing `Legend:`
//! block and a `NIC Legend:` block, whose names go into the description;
//! Windows line endings. Anything else that does not fit — an unknown
//! code, a row of the wrong length, a row the header does not name, a
//! matrix that is not square or not symmetric, or one no PCIe tree can
//! produce — is a [`TopologyError::Smi`] with its 1-based line.
//!
//! What the matrix does not say is assumed: the NVLink and PCIe
//! generations come from [`SmiOptions`], every PCIe link is x16, and
//! peer-to-peer is on for every pair.

mod assemble;
mod matrix;

use crate::error::TopologyError;
use crate::graph::{LinkKind, NodeId, Topology};
use crate::presets::pcie::{UPI_GBPS, UPI_LATENCY_US};
use assemble::build;
use matrix::Matrix;

/// Join every pair of CPU nodes with the socket interconnect, at the
/// presets' UPI figures. A full mesh, not a chain: multi-socket boards
/// link every socket pair directly, and NCCL models CPUs the same way
/// (`ncclTopoConnectCpus`).
pub(crate) fn join_cpus(t: &mut Topology, cpus: &[NodeId]) {
    for (i, &a) in cpus.iter().enumerate() {
        for &b in &cpus[i + 1..] {
            t.connect_with(a, b, LinkKind::CpuInterconnect, UPI_GBPS, UPI_LATENCY_US);
        }
    }
}

/// What `nvidia-smi topo -m` leaves out and the graph needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmiOptions {
    /// NVLink generation (1..=5) of every `NV#` bundle: 1 for P100, 2 for
    /// V100, 3 for A100, 4 for H100, 5 for Blackwell. It sets the rate per
    /// link and how many links a GPU has (4, 6, 12, 18, 18), which decides
    /// between a direct mesh and an NVSwitch.
    pub nvlink_generation: u8,
    /// PCIe generation (1..=6) of every PCIe link; all are taken as x16.
    pub pcie_generation: u8,
}

impl Default for SmiOptions {
    /// NVLink 3 and PCIe 4.0: an A100-era server.
    fn default() -> Self {
        SmiOptions {
            nvlink_generation: 3,
            pcie_generation: 4,
        }
    }
}

/// Parse the output of `nvidia-smi topo -m` with the default
/// [`SmiOptions`] (NVLink 3, PCIe 4.0).
pub fn parse_smi(text: &str) -> Result<Topology, TopologyError> {
    parse_smi_with(text, &SmiOptions::default())
}

/// Parse the output of `nvidia-smi topo -m`, taking the link generations
/// the matrix does not print from `options`.
///
/// On the result, [`Topology::path_class`] of any two GPUs or NICs is the
/// cell the matrix gives them; a matrix no graph can reproduce is an
/// error. The generations only set the rates.
pub fn parse_smi_with(text: &str, options: &SmiOptions) -> Result<Topology, TopologyError> {
    if !(1..=5).contains(&options.nvlink_generation) {
        return Err(TopologyError::Invalid(format!(
            "SmiOptions: NVLink generation {} is not 1..=5",
            options.nvlink_generation
        )));
    }
    if !(1..=6).contains(&options.pcie_generation) {
        return Err(TopologyError::Invalid(format!(
            "SmiOptions: PCIe generation {} is not 1..=6",
            options.pcie_generation
        )));
    }
    let matrix = Matrix::parse(text)?;
    build(&matrix, options)
}

#[cfg(test)]
mod tests;
