//! The simulator: how long a schedule takes on a topology, and which link
//! decides it.
//!
//! The model is α–β with contention: each step costs a fixed overhead
//! (α, [`cost`]) plus its bytes over the bandwidth its flows get, and
//! flows that share a link, a memory or a pool of cores split it max-min
//! fairly. Segments pipeline exactly as the executors run them. The
//! **bottleneck** is the resource busiest over the whole run: the
//! narrowest path decides, as the seed article puts it.

pub mod cost;
pub(crate) mod engine;
mod fairshare;

pub use cost::{CostModel, Overheads};

use ferrocoll_core::schedule::Schedule;
use ferrocoll_core::schedule::layout::Layout;
use serde::Serialize;

use crate::error::TopologyError;
use crate::graph::{NodeId, NodeKind, Topology};

/// Above this many segments the run is extrapolated from two shorter runs:
/// a pipeline in steady state adds the same time per segment.
pub const MAX_SIMULATED_SEGMENTS: u32 = 32;

/// The largest chunk a GPU step moves by default: NCCL's Simple protocol
/// splits its 4 MiB buffer into 8 slots (`NCCL_STEPS`), 512 KiB each.
pub const GPU_CHUNK_BYTES: usize = 512 << 10;
/// The CPU executor's default largest chunk (`CpuConfig::max_chunk_bytes`).
pub const THREAD_CHUNK_BYTES: usize = 4 << 20;

/// How to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    /// Largest chunk per step (the pipelining grain); `None` takes the
    /// devices' default ([`GPU_CHUNK_BYTES`], [`THREAD_CHUNK_BYTES`]).
    pub max_chunk_bytes: Option<usize>,
    /// Messages a link holds in flight.
    pub slots_per_link: u32,
    /// Simulate the in-place call.
    pub in_place: bool,
    /// Bytes per element.
    pub element_size: usize,
    /// The cost model.
    pub cost: CostModel,
    /// Device of each rank; `None` puts rank `r` on the `r`-th device.
    pub placement: Option<Vec<NodeId>>,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            max_chunk_bytes: None,
            slots_per_link: 4,
            in_place: false,
            element_size: 4,
            cost: CostModel::default(),
            placement: None,
        }
    }
}

/// How busy one resource was.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Load {
    /// `GPU0 -> NVSwitch (NVLink4 x18)`, `CPU0 memory`, `CPU0 cores`.
    pub resource: String,
    /// Bytes it carried (a staged copy counts twice on the memory).
    pub bytes: f64,
    /// Carried bytes over what it could have carried in the run's time.
    pub utilisation: f64,
}

/// The simulator's answer for one call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// Predicted time of the call, µs.
    pub time_us: f64,
    /// `size / time`, GB/s (nccl-tests' algbw).
    pub algbw: f64,
    /// algbw × the collective's bus factor, GB/s.
    pub busbw: f64,
    /// Segments the buffer ran in.
    pub segments: u32,
    /// Every resource that carried data, busiest first.
    pub loads: Vec<Load>,
}

impl Prediction {
    /// The busiest resource, if any carried data.
    pub fn bottleneck(&self) -> Option<&Load> {
        self.loads.first()
    }
}

/// Simulate `schedule` on `topology` for a call of `size` bytes, in the
/// nccl-tests sense: the larger of one rank's input and output buffers.
pub fn simulate(
    schedule: &Schedule,
    topology: &Topology,
    size: usize,
    options: &SimOptions,
) -> Result<Prediction, TopologyError> {
    check_schedule(schedule)?;
    options.cost.check()?;
    let n = schedule.world_size;
    let devices = match &options.placement {
        Some(p) => p.clone(),
        None => topology.devices(),
    };
    let mut seen = devices.clone();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != devices.len() {
        return Err(TopologyError::Invalid(
            "placement puts two ranks on one device".into(),
        ));
    }
    if devices.len() < n as usize {
        return Err(TopologyError::TooFewDevices {
            ranks: n,
            devices: devices.len(),
            topology: topology.name.clone(),
        });
    }
    if let Some(&bad) = devices
        .iter()
        .find(|&&d| d >= topology.nodes.len() || !topology.nodes[d].kind.is_device())
    {
        return Err(TopologyError::Invalid(format!(
            "placement names node {bad}, which is not a device"
        )));
    }
    let element = options.element_size.max(1);
    let c = schedule.collective;
    let blocks = c.input_blocks(n).max(c.output_blocks(n)) as usize;
    let count = size / (element * blocks);
    let chunk_bytes = options.max_chunk_bytes.unwrap_or_else(|| {
        if topology.nodes[devices[0]].kind == NodeKind::Thread {
            THREAD_CHUNK_BYTES
        } else {
            GPU_CHUNK_BYTES
        }
    });
    let layout =
        Layout::with_max_chunk_bytes(count, schedule.chunks_per_block, element, chunk_bytes);
    let segments = layout.segments();
    let mut fabric = engine::Fabric::new(topology, devices, &options.cost);
    let mut run = |layout: &Layout| {
        engine::run(
            &mut fabric,
            schedule,
            layout,
            element,
            options.slots_per_link.max(1),
            options.in_place,
        )
    };
    let (time_us, carried) = if segments <= MAX_SIMULATED_SEGMENTS {
        let raw = run(&layout)?;
        (raw.time_us, raw.carried)
    } else {
        // Same chunk size, fewer segments: two runs give the per-segment
        // slope of the steady state.
        let short = |k: u32| {
            let per_segment = count.div_ceil(segments as usize);
            Layout::new(per_segment * k as usize, schedule.chunks_per_block, k)
        };
        let (k1, k2) = (MAX_SIMULATED_SEGMENTS / 2, MAX_SIMULATED_SEGMENTS);
        let a = run(&short(k1))?;
        let b = run(&short(k2))?;
        let extra = f64::from(segments - k2) / f64::from(k2 - k1);
        let carried: Vec<f64> = a
            .carried
            .iter()
            .zip(&b.carried)
            .map(|(x, y)| y + (y - x) * extra)
            .collect();
        // A pipeline not yet in steady state can show a slope below the
        // real one; no resource can carry more than its capacity, so that
        // bounds the time from below.
        let busiest = carried
            .iter()
            .zip(&fabric.resources)
            .map(|(bytes, r)| bytes / r.capacity)
            .fold(0.0, f64::max);
        let time = (b.time_us + (b.time_us - a.time_us) * extra).max(busiest);
        (time, carried)
    };
    let mut loads: Vec<Load> = fabric
        .resources
        .iter()
        .zip(carried)
        .filter(|(_, b)| *b > 0.0)
        .map(|(r, bytes)| Load {
            resource: r.name.clone(),
            bytes,
            utilisation: bytes / (r.capacity * time_us.max(f64::MIN_POSITIVE)),
        })
        .collect();
    loads.sort_by(|a, b| b.utilisation.total_cmp(&a.utilisation));
    let bytes = count * blocks * element;
    let algbw = if time_us > 0.0 {
        bytes as f64 / time_us / 1e3
    } else {
        0.0
    };
    Ok(Prediction {
        time_us,
        algbw,
        busbw: algbw * c.bus_bandwidth_factor(n),
        segments,
        loads,
    })
}

/// The structure the engine relies on, checked so that a hand-built,
/// unverified schedule is an error and not a panic: ranks and channels
/// exist, peers are ranks, `after` names existing steps.
fn check_schedule(s: &Schedule) -> Result<(), TopologyError> {
    let bad = |what: String| {
        Err(TopologyError::Invalid(format!(
            "schedule `{}`: {what}",
            s.name
        )))
    };
    let n = s.world_size;
    if n == 0 || s.ranks.len() != n as usize {
        return bad(format!(
            "world size {n} with {} rank programs",
            s.ranks.len()
        ));
    }
    if s.chunks_per_block == 0 {
        return bad("zero chunks per block".into());
    }
    for (r, program) in s.ranks.iter().enumerate() {
        for (c, steps) in program.channels.iter().enumerate() {
            for (i, step) in steps.iter().enumerate() {
                let at = format!("rank {r} channel {c} step {i}");
                if step.recv_from.iter().chain(&step.send_to).any(|&p| p >= n) {
                    return bad(format!("{at} names a rank outside 0..{n}"));
                }
                let missing = step.after.iter().any(|a| {
                    program
                        .channels
                        .get(a.channel as usize)
                        .is_none_or(|ch| a.step as usize >= ch.len())
                });
                if missing {
                    return bad(format!("{at} waits for a step that does not exist"));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
