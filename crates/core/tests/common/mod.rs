//! The CPU executor as a conformance-kit harness, shared by the tests that
//! run the kit on threads.

use std::time::Duration;

use ferrocoll_core::comm::Planning;
use ferrocoll_core::conformance::{Case, CpuThreads, Harness, KitElement};
use ferrocoll_core::cpu::CpuConfig;

/// Every rank a thread; the case's algorithm forced.
pub struct Cpu {
    /// Chunk size: small, so short buffers still cross many segments.
    pub max_chunk_bytes: usize,
    /// Bound on every wait.
    pub timeout: Duration,
}

impl Harness for Cpu {
    fn run<T: KitElement>(
        &self,
        case: &Case,
        inputs: &[Vec<T>],
        outputs: Vec<Vec<T>>,
    ) -> Result<Vec<Vec<T>>, String> {
        let config = CpuConfig {
            planning: Planning {
                timeout: self.timeout,
                max_chunk_bytes: Some(self.max_chunk_bytes),
                ..CpuConfig::default().planning
            },
            ..CpuConfig::default()
        };
        CpuThreads { config }.run(case, inputs, outputs)
    }
}
