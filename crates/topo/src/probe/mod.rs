//! Measured link probes, laid out like CUDA's `p2pBandwidthLatencyTest`.
//!
//! A [`LinkProbe`] measures every ordered pair of devices: one-way copy
//! bandwidth, bandwidth with both directions busy at once, and latency.
//! The CUDA executor implements it for GPUs (peer copies with peer access
//! on or off); [`host::HostProbe`] implements it for threads of this
//! process, and [`host::measured`] gives the numbers the `host` preset and
//! the CPU executor's selector use.

pub mod host;
pub mod membw;
mod report;

pub use host::HostMeasurement;
pub use report::{Matrix, ProbeReport};

use thiserror::Error;

/// How a probe should measure.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeOptions {
    /// Bytes per copy for bandwidth (p2pBandwidthLatencyTest copies 40 MB).
    pub bytes: usize,
    /// Copies per measurement; the best is kept.
    pub repeats: u32,
    /// Use direct peer access where the hardware allows it.
    pub p2p: bool,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            bytes: 40_000_000,
            repeats: 5,
            p2p: true,
        }
    }
}

/// A probe that could not run.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProbeError {
    /// The driver or library the probe needs is not there.
    #[error("probe unavailable: {0}")]
    Unavailable(String),
    /// The probe started and failed.
    #[error("probe failed: {0}")]
    Failed(String),
}

/// Something that can measure the links between its devices.
pub trait LinkProbe {
    /// Devices it measures.
    fn device_count(&self) -> usize;
    /// Measure every ordered pair.
    fn measure(&self, options: &ProbeOptions) -> Result<ProbeReport, ProbeError>;
}
