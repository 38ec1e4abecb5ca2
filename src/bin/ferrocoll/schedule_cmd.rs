//! `ferrocoll schedule`: print a built-in schedule to read or to start a
//! custom one from.

use std::process::ExitCode;

use clap::Args;
use ferrocoll::schedule::render_grid;
use ferrocoll::{Algorithm, AlgorithmParams, CollectiveKind, VerifyOptions, generate, verify};

#[derive(Args)]
pub(crate) struct ScheduleArgs {
    /// `ring`, `tree`, `direct` or `halving-doubling`.
    #[arg(long)]
    algo: Algorithm,
    /// The collective, e.g. `all-reduce`.
    #[arg(long)]
    op: CollectiveKind,
    /// World size.
    #[arg(long)]
    ranks: u32,
    /// Root of broadcast and reduce.
    #[arg(long, default_value_t = 0)]
    root: u32,
    /// Channels for ring, tree and direct.
    #[arg(long, default_value_t = 1)]
    channels: u32,
    /// Print the JSON form instead of the grid.
    #[arg(long, conflicts_with = "msccl_xml")]
    json: bool,
    /// Print MSCCL's algorithm XML instead of the grid (what the MSCCL
    /// executors run); refused, naming the step, where MSCCL's one peer
    /// per threadblock cannot express the schedule.
    #[arg(long)]
    msccl_xml: bool,
}

pub(crate) fn run(args: &ScheduleArgs) -> Result<ExitCode, String> {
    let params = AlgorithmParams {
        channels: args.channels,
        ..AlgorithmParams::default()
    };
    let schedule = generate(args.algo, args.op.with_root(args.root), args.ranks, &params)
        .map_err(|e| e.to_string())?;
    // Built-ins are proven in the test suite; prove this instance too, so a
    // user starting from it knows it was sound.
    let verified = verify(schedule, &VerifyOptions::default()).map_err(|e| e.to_string())?;
    let schedule = verified.schedule();
    if args.json {
        println!("{}", schedule.to_json());
    } else if args.msccl_xml {
        print!("{}", schedule.to_msccl_xml().map_err(|e| e.to_string())?);
    } else {
        print!("{}", render_grid(schedule));
    }
    Ok(ExitCode::SUCCESS)
}
