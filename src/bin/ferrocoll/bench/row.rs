//! What a timed section produces: one row per size, nccl-tests' columns.

use serde::Serialize;

use super::paired::Paired;

/// One mode's numbers for one size.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Measure {
    /// The mean over the timed loop (the table's `time`).
    pub time_us: f64,
    /// Rank 0's fastest single call of the loop.
    pub time_us_min: f64,
    /// Rank 0's median single call.
    pub time_us_median: f64,
    /// Rank 0's slowest single call.
    pub time_us_max: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub wrong: u64,
    /// With `--membw`, rows past the cache: busbw against the memory
    /// probed between the loop's rounds.
    pub paired: Option<Paired>,
}

/// One size of one section.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    pub collective: String,
    pub algorithm: String,
    pub ranks: u32,
    pub size: usize,
    pub count: usize,
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub out_of_place: Option<Measure>,
    pub in_place: Option<Measure>,
    /// The simulator's out-of-place time on this host (`--predict`), µs.
    pub predicted_us: Option<f64>,
    /// Rank 0's time outside the timed calls (host backends' clocks).
    pub outside: Option<Outside>,
}

/// Where rank 0 spent a size's time outside its timed calls, in seconds:
/// what makes a large row take minutes when its calls take a second.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Outside {
    /// Making this rank's input.
    pub data_s: f64,
    /// Placing buffers and writing outputs anew before each mode.
    pub placing_s: f64,
    /// Calls outside the timed loop: settling, warm-up, the in-place
    /// check's fresh call, and the memory probes between rounds.
    pub untimed_calls_s: f64,
    /// Reading the output back and counting wrong elements.
    pub checking_s: f64,
    /// Bytes of this rank's buffers (input and output).
    pub buffer_bytes: usize,
}
