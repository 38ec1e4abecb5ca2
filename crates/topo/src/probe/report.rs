//! The result of a probe, and its text in p2pBandwidthLatencyTest's layout.

use std::fmt::Write;

use serde::Serialize;

/// A square matrix over devices; `get(i, j)` is from `i` to `j`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Matrix {
    n: usize,
    values: Vec<f64>,
}

impl Matrix {
    /// An `n × n` matrix of zeros.
    pub fn new(n: usize) -> Self {
        Matrix {
            n,
            values: vec![0.0; n * n],
        }
    }

    /// Side length.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether it has no devices.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The value from `i` to `j`.
    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.values[i * self.n + j]
    }

    /// Set the value from `i` to `j`.
    pub fn set(&mut self, i: usize, j: usize, v: f64) {
        self.values[i * self.n + j] = v;
    }

    /// The matrix as text: a `D\D` header row and one row per device.
    pub fn render(&self, title: &str, decimals: usize) -> String {
        let mut s = format!("{title}\n   D\\D");
        for j in 0..self.n {
            let _ = write!(s, "{j:>8}");
        }
        s.push('\n');
        for i in 0..self.n {
            let _ = write!(s, "{i:>6} ");
            for j in 0..self.n {
                let _ = write!(s, "{:>8.decimals$}", self.get(i, j));
            }
            s.push('\n');
        }
        s
    }
}

/// What a [`super::LinkProbe`] measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    /// What was measured (device names, the probe used).
    pub what: String,
    /// Whether peer access was used.
    pub p2p: bool,
    /// One copy at a time from `i` to `j`, GB/s; the diagonal is a copy
    /// within one device.
    pub unidirectional_gbps: Matrix,
    /// `i → j` and `j → i` at once, both counted, GB/s.
    pub bidirectional_gbps: Matrix,
    /// One-way latency of a small message from `i` to `j`, µs.
    pub latency_us: Matrix,
}

impl ProbeReport {
    /// The three matrices, titled like p2pBandwidthLatencyTest's.
    pub fn render(&self) -> String {
        let p2p = if self.p2p { "Enabled" } else { "Disabled" };
        format!(
            "{}\n{}\n{}\n{}",
            self.what,
            self.unidirectional_gbps.render(
                &format!("Unidirectional P2P={p2p} Bandwidth Matrix (GB/s)"),
                2
            ),
            self.bidirectional_gbps.render(
                &format!("Bidirectional P2P={p2p} Bandwidth Matrix (GB/s)"),
                2
            ),
            self.latency_us
                .render(&format!("P2P={p2p} Latency Matrix (us)"), 2),
        )
    }
}
