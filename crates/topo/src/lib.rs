//! # ferrocoll-topo
//!
//! The topology-aware half of ferrocoll: what the machine's links are, how
//! long a schedule takes on them, and which schedule to run.
//!
//! - [`Topology`] is the link graph: devices (GPUs, or threads for the CPU
//!   executor), CPUs, PCIe switches, NVSwitches and NICs joined by directed
//!   links with a kind, a per-direction bandwidth and a latency. It saves
//!   to and loads from a versioned JSON file of our own.
//! - [`sources`] builds one from `nvidia-smi topo -m` text, an NCCL
//!   topology XML dump, or NVML at run time; [`presets`] holds the
//!   well-known machines; [`probe`] measures links (the CPU host probe is
//!   here; the CUDA executor implements the GPU one).
//! - [`sim`] times any schedule on any topology, with links shared by
//!   concurrent transfers, and names the bottleneck link.
//! - [`bound`] computes the throughput bound of a member set: the
//!   highest bus bandwidth any all-gather, reduce-scatter or all-reduce
//!   schedule can reach on the links (a minimum cut, by maximum flows).
//! - [`search`] builds ring orders and tree orders from the graph;
//!   [`select`] picks algorithm, channels and segment size per call by
//!   simulating the candidates.
//!
//! Invariants: every topology a loader or [`presets::by_name`] hands out
//! has passed [`Topology::validate`], and the selector validates what it is
//! given; routes, simulations and selections are
//! deterministic functions of their inputs, so every rank of a group that
//! loads the same topology makes the same choice. Bandwidths are GB/s
//! (1e9 bytes per second) per direction, latencies microseconds.

pub mod bound;
mod error;
pub mod graph;
pub mod presets;
pub mod probe;
pub mod render;
pub mod search;
pub mod select;
pub mod sim;
pub mod sources;
pub mod work;

pub use error::TopologyError;
pub use graph::{LinkKind, Node, NodeKind, PathClass, PhysicalLink, Route, Topology};
