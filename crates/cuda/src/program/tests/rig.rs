//! The rig the device-protocol tests run on — the kernel's own source
//! built for the host ([`HostFabric`]) — and the harnesses, plans and
//! layouts the tests share.

use std::sync::Arc;
use std::time::Duration;

use ferrocoll_core::algorithms::{Algorithm, AlgorithmParams, generate};
use ferrocoll_core::comm::Planning;
use ferrocoll_core::conformance::{Case, Harness, KitElement, check_case, in_place_buffer};
use ferrocoll_core::plan::{Chunking, Compiler, ExecutionPlan};
use ferrocoll_core::types::CallShape;
use ferrocoll_core::verify::{VerifyOptions, verify};
use ferrocoll_core::{Collective, DataType, ReduceOp};

use crate::host_kernel::{self, Buffers, HostFabric};
use crate::interpreter::setup;
use crate::program::{DeviceProgram, Layout, Protocol};

/// Threads per block: several, so that threads stride over a message and
/// read what thread 0 set up after a barrier; not a power of two, so no
/// stride happens to line up with a message.
const THREADS: u32 = 3;

/// The kernel's source on the host, or `None` (the test passes, having
/// said why) when this machine has no C++ compiler and none is required.
pub(super) fn kernel() -> Option<&'static host_kernel::HostKernel> {
    host_kernel::kernel()
}

/// A fabric for `layout` on the host build.
pub(super) fn fabric(layout: Layout, timeout: Duration) -> Option<HostFabric> {
    Some(HostFabric::new(kernel()?, THREADS, layout, timeout))
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
        purpose: Default::default(),
    };
    compiler.compile(&shape, Chunking::MaxBytes(48), 2).unwrap()
}

/// Slots (and LL slots) as small as the plan allows.
pub(super) fn layout_for(plan: &ExecutionPlan, slots: u32, zero_copy: bool) -> Layout {
    let largest = plan.links.iter().map(|l| l.largest).max().unwrap_or(0);
    Layout {
        world_size: plan.world_size,
        max_channels: plan.channels.max(1),
        slots,
        slot_bytes: largest.div_ceil(16).max(1) * 16,
        ll_slot_bytes: (2 * largest).div_ceil(16).max(1) * 16,
        zero_copy,
    }
}

/// How a test's messages travel: LL (always staged), or Simple, staged or
/// zero-copy where the plan allows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Way {
    pub protocol: Protocol,
    pub zero_copy: bool,
}

/// Every way.
pub(super) const WAYS: [Way; 3] = [
    Way {
        protocol: Protocol::Simple,
        zero_copy: true,
    },
    Way {
        protocol: Protocol::Simple,
        zero_copy: false,
    },
    Way {
        protocol: Protocol::LowLatency,
        zero_copy: false,
    },
];

struct Emulated {
    channels: u32,
    way: Way,
}

impl Harness for Emulated {
    fn run<T: KitElement>(
        &self,
        case: &Case,
        inputs: &[Vec<T>],
        outputs: Vec<Vec<T>>,
    ) -> Result<Vec<Vec<T>>, String> {
        let plan = plan_of(case, self.channels);
        let layout = layout_for(&plan, 2, self.way.zero_copy);
        let program =
            DeviceProgram::lower(&plan, layout, self.way.protocol).map_err(|e| e.to_string())?;
        run_twice(&program, case, inputs, outputs)
    }
}

/// The plans the device interpreter's group makes: its planner, with its
/// settings, lowered for the layout its windows are set up with.
struct GroupPlanned {
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
            planning: Planning {
                algorithm: case.algorithm,
                ..self.config.clone().planning
            },
            ..self.config.clone()
        };
        let layout = setup::layout(
            case.world_size,
            config.planning.channels.unwrap_or(1),
            &config,
            true,
        )
        .map_err(|e| e.to_string())?;
        let mut planner = ferrocoll_core::comm::Planner::new(
            case.world_size,
            setup::planner_settings(&config, &layout),
        );
        let shape = CallShape {
            collective: case.collective,
            count: case.count,
            dtype: case.dtype,
            op: case.op,
            in_place: case.in_place,
            purpose: Default::default(),
        };
        let planned = planner.plan(&shape).map_err(|e| e.to_string())?;
        let protocol = setup::protocol(&planned, &layout, &config);
        let program =
            DeviceProgram::lower(&planned.plan, layout, protocol).map_err(|e| e.to_string())?;
        run_twice(&program, case, inputs, outputs)
    }
}

/// `case` as the group plans it.
pub(super) fn check_group_planned(config: &crate::CudaConfig, case: &Case) {
    if kernel().is_none() {
        return;
    }
    let harness = GroupPlanned {
        config: config.clone(),
    };
    check_case(&harness, case).unwrap_or_else(|e| panic!("{case:?}: {e}"));
}

/// `case` on its algorithm's plan at `channels`, its messages travelling
/// `way`.
pub(super) fn check_emulated(channels: u32, way: Way, case: &Case) {
    if kernel().is_none() {
        return;
    }
    let harness = Emulated { channels, way };
    check_case(&harness, case).unwrap_or_else(|e| panic!("{way:?} {case:?}: {e}"));
}

/// Run `case` twice on one fabric and return the second call's outputs.
fn run_twice<T: KitElement>(
    program: &DeviceProgram,
    case: &Case,
    inputs: &[Vec<T>],
    outputs: Vec<Vec<T>>,
) -> Result<Vec<Vec<T>>, String> {
    let fabric = fabric(program.layout, Duration::from_secs(20)).expect("a kernel");
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

/// `case`'s plan on two channels, lowered for each protocol (zero copy
/// where Simple allows it).
pub(super) fn both_protocols(case: &Case) -> (DeviceProgram, DeviceProgram) {
    let plan = plan_of(case, 2);
    let layout = layout_for(&plan, 2, true);
    let lower = |p| DeviceProgram::lower(&plan, layout, p).unwrap();
    (lower(Protocol::Simple), lower(Protocol::LowLatency))
}

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
