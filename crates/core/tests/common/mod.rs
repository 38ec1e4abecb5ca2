//! The CPU executor as a conformance-kit harness, shared by the tests that
//! run the kit on threads.

use std::sync::Mutex;
use std::time::Duration;

use ferrocoll_core::comm::Communicator;
use ferrocoll_core::conformance::{Case, Harness, KitElement, call_case};
use ferrocoll_core::cpu::{self, CpuConfig};

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
            timeout: self.timeout,
            algorithm: case.algorithm,
            max_chunk_bytes: self.max_chunk_bytes,
            ..CpuConfig::default()
        };
        let outputs: Vec<Mutex<Vec<T>>> = outputs.into_iter().map(Mutex::new).collect();
        let results = cpu::run(case.world_size, &config, |comm| {
            let r = comm.rank() as usize;
            let mut out = std::mem::take(&mut *outputs[r].lock().unwrap());
            call_case(comm, case, &inputs[r], &mut out)?;
            Ok(out)
        });
        results
            .into_iter()
            .enumerate()
            .map(|(r, x)| x.map_err(|e| format!("rank {r}: {e}")))
            .collect()
    }
}
