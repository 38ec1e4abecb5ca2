//! The simulator: how long a schedule takes on a topology, and which link
//! decides it.
//!
//! It interprets [execution plans](ferrocoll_core::plan): the very
//! instructions an executor runs, with their lengths, messages and waits.
//! The model is α–β with contention: each step costs a fixed overhead
//! (α, [`cost`]) plus its bytes over the bandwidth its flows get, and
//! flows that share a link, a memory or a pool of cores split it max-min
//! fairly. Segments pipeline exactly as the executors run them. The
//! **bottleneck** is the resource busiest over the whole run: the
//! narrowest path decides, as the seed article puts it.

pub mod cost;
pub(crate) mod engine;
mod fairshare;
pub(crate) mod network;
mod steady;

pub use cost::{CostModel, Overheads};

use ferrocoll_core::DataType;
use ferrocoll_core::plan::{
    Chunking, Compiler, DEVICE_CHUNK_BYTES, ExecutionPlan, HOST_CHUNK_BYTES, Layout, LinkLoad,
};
use ferrocoll_core::types::CallShape;
use serde::Serialize;

use crate::error::TopologyError;
use crate::graph::{NodeId, NodeKind, Topology};
use engine::Mode;

/// Above this many segments the run is extrapolated from two shorter runs:
/// a pipeline in steady state adds the same time per segment.
pub const MAX_SIMULATED_SEGMENTS: u32 = 32;

/// How to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    /// Largest chunk per step (the pipelining grain); `None` takes the
    /// executors' default for the devices ([`DEVICE_CHUNK_BYTES`],
    /// [`HOST_CHUNK_BYTES`]).
    pub max_chunk_bytes: Option<usize>,
    /// Messages a link holds in flight.
    pub slots_per_link: u32,
    /// Simulate the in-place call.
    pub in_place: bool,
    /// The element type (its size is what matters here).
    pub dtype: DataType,
    /// The cost model.
    pub cost: CostModel,
    /// Device of each rank; `None` puts rank `r` on the `r`-th device.
    pub placement: Option<Vec<NodeId>>,
    /// Which model answers.
    pub fidelity: Fidelity,
}

/// Which model a prediction comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fidelity {
    /// The detailed engine where its estimated work is within
    /// [`DETAILED_MAX_WORK`], the steady-state estimate past it.
    #[default]
    Auto,
    /// Max-min fair shares recomputed at every flow's start and end.
    Detailed,
    /// Each flow at its steady-state share, fixed when it starts
    /// (docs/topology.md, "The steady-state estimate"): a few heap
    /// operations per instruction.
    Steady,
}

/// Above this many work units (instructions simulated times the flows
/// and resources each fair-share pass visits, as estimated before the
/// run) [`Fidelity::Auto`] takes the steady-state estimate: about a
/// second of the detailed engine on one core.
pub const DETAILED_MAX_WORK: u64 = 100_000_000;

/// The steady-state estimate simulates at most this many instructions
/// per run; a longer pipeline is extrapolated (from a single segment if
/// need be).
pub const STEADY_MAX_INSTRUCTIONS: u64 = 1 << 20;

/// The steady-state estimate runs at most this many segments: at fixed
/// shares a pipeline settles within a segment or two, so its slope is
/// already the steady one.
pub const STEADY_MAX_SEGMENTS: u64 = 8;

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            max_chunk_bytes: None,
            slots_per_link: 4,
            in_place: false,
            dtype: DataType::F32,
            cost: CostModel::default(),
            placement: None,
            fidelity: Fidelity::Auto,
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
    /// The model that answered: detailed or steady (never auto).
    pub model: Fidelity,
    /// Every resource that carried data, busiest first.
    pub loads: Vec<Load>,
    /// Messages and bytes on every link of the plan (sender, receiver,
    /// channel), as the simulator moved them; extrapolated runs scale the
    /// two short runs' counts like the time.
    pub links: Vec<LinkLoad>,
}

impl Prediction {
    /// The busiest resource, if any carried data.
    pub fn bottleneck(&self) -> Option<&Load> {
        self.loads.first()
    }
}

/// The devices the ranks run on, checked against the topology.
fn placement(
    topology: &Topology,
    world_size: u32,
    options: &SimOptions,
) -> Result<Vec<NodeId>, TopologyError> {
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
    if devices.len() < world_size as usize {
        return Err(TopologyError::TooFewDevices {
            ranks: world_size,
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
    Ok(devices)
}

/// Work units ([`crate::work`]) charged per instruction of a compiled plan.
const COMPILE_WORK: u64 = 32;

/// Simulate a call of `size` bytes (in the nccl-tests sense: the larger
/// of one rank's input and output buffers) of `compiler`'s schedule on
/// `topology`: compile its plan as `options` say and run it; a pipeline
/// longer than [`MAX_SIMULATED_SEGMENTS`] is extrapolated from two
/// shorter plans with the same chunks.
pub fn simulate(
    compiler: &Compiler,
    topology: &Topology,
    size: usize,
    options: &SimOptions,
) -> Result<Prediction, TopologyError> {
    options.cost.check()?;
    let s = compiler.verified().schedule();
    let Call {
        devices,
        shape: whole,
        chunk,
        segments,
        ..
    } = call_of(compiler, topology, size, options)?;
    let element = options.dtype.size_bytes();
    let c = s.collective;
    let n = s.world_size;
    let blocks = c.size_blocks(n) as usize;
    let shape = |count| CallShape { count, ..whole };
    let count = whole.count;
    let compile = |count, chunking| {
        // The simulator never compares plans: no hash.
        let plan = compiler
            .compile_unhashed(&shape(count), chunking, options.slots_per_link.max(1))
            .map_err(|e| TopologyError::Invalid(e.to_string()))?;
        // Compiling costs about as much per instruction as a few dozen
        // simulated steps.
        crate::work::charge(COMPILE_WORK * plan.instruction_count() as u64)?;
        Ok::<_, TopologyError>(plan)
    };
    let mut network = network::Network::new(topology, devices, &options.cost);
    let steps = s.step_count() as u64;
    let mode = mode_for(options.fidelity, &network, s, segments);
    let (most, model) = match mode {
        Mode::Fair => (MAX_SIMULATED_SEGMENTS, Fidelity::Detailed),
        Mode::Steady => {
            let fit = (STEADY_MAX_INSTRUCTIONS / steps.max(1)).clamp(1, STEADY_MAX_SEGMENTS);
            (fit as u32, Fidelity::Steady)
        }
    };
    let factor = c.bus_bandwidth_factor(n);
    if segments <= most {
        // A plan compiled here needs no check.
        let plan = compile(count, Chunking::MaxBytes(chunk))?;
        let raw = engine::run(&mut network, &plan, mode)?;
        let bytes = plan.size_bytes() as usize;
        let p = prediction(&network, factor, bytes, segments, raw, model);
        return Ok(p);
    }
    // Same chunk size, fewer segments: two runs give the per-segment
    // slope of the steady state.
    let per_segment = count.div_ceil(segments as usize);
    let short = |k: u32| compile(per_segment * k as usize, Chunking::Segments(k));
    let (k1, k2) = (most / 2, most);
    let b = engine::run(&mut network, &short(k2)?, mode)?;
    let a = if k1 > 0 {
        engine::run(&mut network, &short(k1)?, mode)?
    } else {
        // Only one segment fits: every further one adds what the busiest
        // resource carried in it.
        let slope = busiest(&b.carried, &network);
        engine::Raw {
            time_us: (b.time_us - slope).max(0.0),
            carried: vec![0.0; b.carried.len()],
            links: Vec::new(),
        }
    };
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
    let time = (b.time_us + (b.time_us - a.time_us) * extra).max(busiest(&carried, &network));
    let links = extrapolate_links(&a.links, &b.links, extra);
    let bytes = count * blocks * element;
    let raw = engine::Raw {
        time_us: time,
        carried,
        links,
    };
    Ok(prediction(&network, factor, bytes, segments, raw, model))
}

/// A call of `size` bytes of a compiler's schedule, as `options` lay it
/// out: where its ranks run, its shape, its chunk and its segments.
struct Call {
    devices: Vec<NodeId>,
    shape: CallShape,
    chunk: usize,
    segments: u32,
    layout: Layout,
}

fn call_of(
    compiler: &Compiler,
    topology: &Topology,
    size: usize,
    options: &SimOptions,
) -> Result<Call, TopologyError> {
    let s = compiler.verified().schedule();
    let devices = placement(topology, s.world_size, options)?;
    let blocks = s.collective.size_blocks(s.world_size) as usize;
    let shape = CallShape {
        collective: s.collective,
        count: size / (options.dtype.size_bytes() * blocks),
        dtype: options.dtype,
        op: ferrocoll_core::ReduceOp::Sum,
        in_place: options.in_place,
        purpose: Default::default(),
    };
    let chunk = options.max_chunk_bytes.unwrap_or_else(|| {
        if topology.nodes[devices[0]].kind == NodeKind::Thread {
            HOST_CHUNK_BYTES
        } else {
            DEVICE_CHUNK_BYTES
        }
    });
    let layout = compiler.layout(&shape, Chunking::MaxBytes(chunk));
    Ok(Call {
        devices,
        shape,
        chunk,
        segments: layout.segments(),
        layout,
    })
}

/// How [`simulate`] would cut a call of `size` bytes into chunks: the
/// only thing the chunk size in `options` decides, so two option sets
/// that differ in `max_chunk_bytes` alone and give equal layouts give
/// equal predictions (a selector comparing chunk sizes simulates once).
pub fn layout_of(
    compiler: &Compiler,
    topology: &Topology,
    size: usize,
    options: &SimOptions,
) -> Result<Layout, TopologyError> {
    Ok(call_of(compiler, topology, size, options)?.layout)
}

/// The model [`simulate`] would answer with for these arguments: what
/// [`Fidelity::Auto`] resolves to (detailed or steady), so a caller
/// comparing several schedules can ask all of them of one model.
pub fn model_for(
    compiler: &Compiler,
    topology: &Topology,
    size: usize,
    options: &SimOptions,
) -> Result<Fidelity, TopologyError> {
    if options.fidelity != Fidelity::Auto {
        return Ok(options.fidelity);
    }
    let call = call_of(compiler, topology, size, options)?;
    let s = compiler.verified().schedule();
    let network = network::Network::new(topology, call.devices, &options.cost);
    Ok(match mode_for(Fidelity::Auto, &network, s, call.segments) {
        Mode::Fair => Fidelity::Detailed,
        Mode::Steady => Fidelity::Steady,
    })
}

/// The time the busiest resource needs for what it `carried`.
fn busiest(carried: &[f64], network: &network::Network) -> f64 {
    carried
        .iter()
        .zip(&network.resources)
        .map(|(bytes, r)| bytes / r.capacity)
        .fold(0.0, f64::max)
}

/// The engine's mode for `fidelity`: on [`Fidelity::Auto`], detailed
/// while its work (instructions simulated times the resources and flows
/// a fair-share pass visits, at most every rank's channels twice over)
/// stays within [`DETAILED_MAX_WORK`].
fn mode_for(
    fidelity: Fidelity,
    network: &network::Network,
    schedule: &ferrocoll_core::Schedule,
    segments: u32,
) -> Mode {
    match fidelity {
        Fidelity::Detailed => Mode::Fair,
        Fidelity::Steady => Mode::Steady,
        Fidelity::Auto => {
            let runs = if segments <= MAX_SIMULATED_SEGMENTS {
                u64::from(segments)
            } else {
                u64::from(MAX_SIMULATED_SEGMENTS + MAX_SIMULATED_SEGMENTS / 2)
            };
            let instructions = (schedule.step_count() as u64).saturating_mul(runs);
            let streams = u64::from(schedule.world_size) * schedule.channel_count() as u64;
            let per_pass = network.resources.len() as u64 + 3 * streams;
            if instructions.saturating_mul(per_pass) <= DETAILED_MAX_WORK {
                Mode::Fair
            } else {
                Mode::Steady
            }
        }
    }
}

/// Simulate exactly `plan` — every segment — on `topology`. The plan's
/// structure is checked first, so a hand-edited plan is an error, not a
/// panic; `options` gives the cost model and placement (its chunking,
/// slots, in-place and type fields are the plan's own here).
pub fn simulate_plan(
    plan: &ExecutionPlan,
    topology: &Topology,
    options: &SimOptions,
) -> Result<Prediction, TopologyError> {
    plan.check()
        .map_err(|e| TopologyError::Invalid(e.to_string()))?;
    options.cost.check()?;
    let devices = placement(topology, plan.world_size, options)?;
    let mut network = network::Network::new(topology, devices, &options.cost);
    let (mode, model) = match options.fidelity {
        Fidelity::Steady => (Mode::Steady, Fidelity::Steady),
        _ => (Mode::Fair, Fidelity::Detailed),
    };
    let raw = engine::run(&mut network, plan, mode)?;
    let factor = plan.collective.bus_bandwidth_factor(plan.world_size);
    let bytes = plan.size_bytes() as usize;
    Ok(prediction(
        &network,
        factor,
        bytes,
        plan.segments,
        raw,
        model,
    ))
}

fn extrapolate_links(a: &[LinkLoad], b: &[LinkLoad], extra: f64) -> Vec<LinkLoad> {
    let scale = |x: u64, y: u64| (y as f64 + (y as f64 - x as f64) * extra).round().max(0.0) as u64;
    b.iter()
        .map(|lb| {
            let la = a.iter().find(|l| l.link == lb.link);
            let (m, bytes) = la.map_or((0, 0), |l| (l.messages, l.bytes));
            LinkLoad {
                link: lb.link,
                messages: scale(m, lb.messages),
                bytes: scale(bytes, lb.bytes),
                largest: lb.largest,
            }
        })
        .collect()
}

fn prediction(
    network: &network::Network,
    factor: f64,
    bytes: usize,
    segments: u32,
    raw: engine::Raw,
    model: Fidelity,
) -> Prediction {
    let engine::Raw {
        time_us,
        carried,
        links,
    } = raw;
    let mut loads: Vec<Load> = network
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
    let algbw = if time_us > 0.0 {
        bytes as f64 / time_us / 1e3
    } else {
        0.0
    };
    Prediction {
        time_us,
        algbw,
        busbw: algbw * factor,
        segments,
        model,
        loads,
        links,
    }
}

#[cfg(test)]
mod tests;
