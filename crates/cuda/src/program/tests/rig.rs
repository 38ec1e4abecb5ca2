//! The rigs the device-protocol tests run on — the Rust mirror
//! ([`Fabric`]) and the kernel's own source built for the host
//! ([`HostFabric`]) — and the harnesses, plans and layouts the tests share.

use std::sync::Arc;
use std::time::Duration;

use ferrocoll_core::Rank;
use ferrocoll_core::algorithms::{Algorithm, AlgorithmParams, generate};
use ferrocoll_core::comm::CommError;
use ferrocoll_core::conformance::{Case, Harness, KitElement, check_case, in_place_buffer};
use ferrocoll_core::plan::{CallShape, Chunking, Compiler, ExecutionPlan};
use ferrocoll_core::verify::{VerifyOptions, verify};
use ferrocoll_core::{Collective, DataType, ReduceOp};

use crate::interpreter::setup;
use crate::program::emulate::{Buffers, Fabric};
use crate::program::host_kernel::{self, HostFabric};
use crate::program::{DeviceProgram, Layout, Protocol};

/// What runs the device protocol: the Rust mirror of the kernel, or the
/// kernel's own source built for the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rig {
    Mirror,
    Source,
}

/// Threads per block on the source rig: several, so that threads stride
/// over a message and read what thread 0 set up after a barrier; not a
/// power of two, so no stride happens to line up with a message.
const SOURCE_THREADS: u32 = 3;

/// The rigs this machine has (the source needs a C++ compiler). Under
/// ThreadSanitizer only the source: the mirror's Rust atomics are not
/// instrumented, so its copies would read as races.
pub(super) fn rigs() -> Vec<Rig> {
    let mut out = if host_kernel::tsan() {
        vec![]
    } else {
        vec![Rig::Mirror]
    };
    if host_kernel::kernel().is_some() {
        out.push(Rig::Source);
    }
    out
}

/// A fabric of either rig.
pub(super) enum AnyFabric {
    Mirror(Fabric),
    Source(HostFabric),
}

impl AnyFabric {
    pub(super) fn new(rig: Rig, layout: Layout, timeout: Duration) -> AnyFabric {
        match rig {
            Rig::Mirror => AnyFabric::Mirror(Fabric::new(layout, timeout).unwrap()),
            Rig::Source => AnyFabric::Source(HostFabric::new(
                host_kernel::kernel().expect("listed by `rigs`"),
                SOURCE_THREADS,
                layout,
                timeout,
            )),
        }
    }

    pub(super) fn call<T: ferrocoll_core::types::Reduce>(
        &self,
        programs: &[&DeviceProgram],
        buffers: Vec<Buffers<'_, T>>,
    ) -> Vec<Result<(), CommError>> {
        match self {
            AnyFabric::Mirror(f) => f.call(programs, buffers),
            AnyFabric::Source(f) => f.call(programs, buffers),
        }
    }

    pub(super) fn start_after(&self, call: u64) {
        match self {
            AnyFabric::Mirror(f) => f.start_after(call),
            AnyFabric::Source(f) => f.start_after(call),
        }
    }

    pub(super) fn rank_call<T: ferrocoll_core::types::Reduce>(
        &self,
        rank: Rank,
        program: &DeviceProgram,
        buffers: Buffers<'_, T>,
    ) -> Result<(), CommError> {
        match self {
            AnyFabric::Mirror(f) => f.rank_call(rank, program, buffers),
            AnyFabric::Source(f) => f.rank_call(rank, program, buffers),
        }
    }
}

/// The plan of `case` with small chunks, so calls run many segments.
pub(super) fn plan_of(case: &Case, channels: u32) -> ExecutionPlan {
    let algorithm = case.algorithm.unwrap_or(Algorithm::Ring);
    let params = AlgorithmParams {
        channels: if algorithm == Algorithm::HalvingDoubling {
            1
        } else {
            channels
        },
        ..AlgorithmParams::default()
    };
    let s = generate(algorithm, case.collective, case.world_size, &params).unwrap();
    let compiler = Compiler::new(Arc::new(verify(s, &VerifyOptions::default()).unwrap()));
    let shape = CallShape {
        collective: case.collective,
        count: case.count,
        dtype: case.dtype,
        op: case.op,
        in_place: case.in_place,
    };
    compiler.compile(&shape, Chunking::MaxBytes(48), 2).unwrap()
}

/// Slots (and LL slots) as small as the plan allows.
pub(super) fn layout_for(plan: &ExecutionPlan, slots: u32) -> Layout {
    let largest = plan.links.iter().map(|l| l.largest).max().unwrap_or(0);
    Layout {
        world_size: plan.world_size,
        max_channels: plan.channels.max(1),
        slots,
        slot_bytes: largest.div_ceil(16).max(1) * 16,
        ll_slot_bytes: (2 * largest).div_ceil(16).max(1) * 16,
    }
}

struct Emulated {
    rig: Rig,
    channels: u32,
    protocol: Protocol,
}

impl Harness for Emulated {
    fn run<T: KitElement>(
        &self,
        case: &Case,
        inputs: &[Vec<T>],
        outputs: Vec<Vec<T>>,
    ) -> Result<Vec<Vec<T>>, String> {
        let plan = plan_of(case, self.channels);
        let program = DeviceProgram::lower(&plan, layout_for(&plan, 2), self.protocol)
            .map_err(|e| e.to_string())?;
        run_twice(self.rig, &program, case, inputs, outputs)
    }
}

/// The plans the device interpreter's group makes: its planner, with its
/// settings, lowered for the layout its windows are set up with.
struct GroupPlanned {
    rig: Rig,
    config: crate::CudaConfig,
}

impl Harness for GroupPlanned {
    fn run<T: KitElement>(
        &self,
        case: &Case,
        inputs: &[Vec<T>],
        outputs: Vec<Vec<T>>,
    ) -> Result<Vec<Vec<T>>, String> {
        let config = crate::CudaConfig {
            algorithm: case.algorithm,
            ..self.config.clone()
        };
        let layout = setup::layout(case.world_size, &config).map_err(|e| e.to_string())?;
        let mut planner = ferrocoll_core::plan::Planner::new(
            case.world_size,
            setup::planner_settings(&config, &layout),
        );
        let shape = CallShape {
            collective: case.collective,
            count: case.count,
            dtype: case.dtype,
            op: case.op,
            in_place: case.in_place,
        };
        let planned = planner.plan(&shape).map_err(|e| e.to_string())?;
        let protocol = setup::protocol(&planned, &layout, &config);
        let program =
            DeviceProgram::lower(&planned.plan, layout, protocol).map_err(|e| e.to_string())?;
        run_twice(self.rig, &program, case, inputs, outputs)
    }
}

/// `case` as the group plans it, on every rig.
pub(super) fn check_group_planned(config: &crate::CudaConfig, case: &Case) {
    for rig in rigs() {
        let harness = GroupPlanned {
            rig,
            config: config.clone(),
        };
        check_case(&harness, case).unwrap_or_else(|e| panic!("{rig:?} {case:?}: {e}"));
    }
}

/// `case` on its algorithm's plan at `channels`, on every rig.
pub(super) fn check_emulated(channels: u32, protocol: Protocol, case: &Case) {
    for rig in rigs() {
        let harness = Emulated {
            rig,
            channels,
            protocol,
        };
        check_case(&harness, case).unwrap_or_else(|e| panic!("{rig:?} {case:?}: {e}"));
    }
}

/// Run `case` twice on one fabric and return the second call's outputs.
fn run_twice<T: KitElement>(
    rig: Rig,
    program: &DeviceProgram,
    case: &Case,
    inputs: &[Vec<T>],
    outputs: Vec<Vec<T>>,
) -> Result<Vec<Vec<T>>, String> {
    let fabric = AnyFabric::new(rig, program.layout, Duration::from_secs(20));
    let programs: Vec<&DeviceProgram> = vec![&program; case.world_size as usize];
    // Twice: the second call's counters start where the first left them.
    // The first call moves other values, so a read of a stale slot in
    // the second shows as a wrong element.
    let other = Case {
        seed: case.seed ^ 0x9e37_79b9,
        ..*case
    };
    let first_inputs = ferrocoll_core::conformance::case_inputs::<T>(&other);
    let mut results = Vec::new();
    for inputs in [first_inputs.as_slice(), inputs] {
        // In place the one buffer holds the input where the call
        // defines (what `call_case` does for communicators).
        let mut outs: Vec<Vec<T>> = if case.in_place {
            (0..case.world_size)
                .map(|r| {
                    in_place_buffer(
                        case.collective,
                        r,
                        case.count,
                        &inputs[r as usize],
                        outputs[r as usize].clone(),
                    )
                })
                .collect()
        } else {
            outputs.clone()
        };
        let buffers = outs
            .iter_mut()
            .zip(inputs)
            .map(|(o, i)| Buffers {
                input: if case.in_place { &[] } else { i.as_slice() },
                output: o.as_mut_slice(),
            })
            .collect();
        for (r, x) in fabric.call(&programs, buffers).into_iter().enumerate() {
            x.map_err(|e| format!("rank {r}: {e}"))?;
        }
        if case.in_place && case.collective == Collective::ReduceScatter {
            for (r, o) in outs.iter_mut().enumerate() {
                *o = o[r * case.count..(r + 1) * case.count].to_vec();
            }
        }
        results.push(outs);
    }
    Ok(results.pop().expect("two calls"))
}

/// `case`'s plan on two channels, lowered for each protocol.
pub(super) fn both_protocols(case: &Case) -> (DeviceProgram, DeviceProgram) {
    let plan = plan_of(case, 2);
    let layout = layout_for(&plan, 2);
    let lower = |p| DeviceProgram::lower(&plan, layout, p).unwrap();
    (lower(Protocol::Simple), lower(Protocol::Ll))
}

/// Both ways messages travel.
pub(super) const PROTOCOLS: [Protocol; 2] = [Protocol::Simple, Protocol::Ll];

/// Each rank's f32 buffers, out of place.
pub(super) fn f32_buffers<'a>(
    outputs: &'a mut [Vec<f32>],
    inputs: &'a [Vec<f32>],
) -> Vec<Buffers<'a, f32>> {
    outputs
        .iter_mut()
        .zip(inputs)
        .map(|(o, i)| Buffers {
            input: i,
            output: o,
        })
        .collect()
}

pub(super) fn all_reduce(count: usize) -> Case {
    Case {
        collective: Collective::AllReduce,
        algorithm: Some(Algorithm::Ring),
        world_size: 3,
        count,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        in_place: false,
        seed: 1,
    }
}
