//! The `ferrocoll` command-line tool: benchmark (`bench`), prove
//! (`verify`), print (`schedule`, `plan`), show topologies (`topo`),
//! predict (`sim`, `estimate`), read flight-recorder dumps (`trace`). Run `ferrocoll --help` for the commands.

mod bench;
mod busy;
mod estimate_cmd;
mod host_facts;
mod info_cmd;
mod launch;
mod plan_cmd;
mod rendezvous_cmd;
mod schedule_cmd;
mod sim_cmd;
mod spec;
mod synth_cmd;
mod topo;
mod trace_cmd;
mod verify_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ferrocoll",
    version,
    long_version = concat!(
        env!("CARGO_PKG_VERSION"),
        " (",
        env!("FERROCOLL_BUILD_PROFILE"),
        " build for ",
        env!("FERROCOLL_BUILD_TARGET"),
        ")"
    ),
    about = "Collective communication: benchmark, prove, print and simulate schedules on topologies."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmark collectives like nccl-tests (time, algbw, busbw, #wrong).
    Bench(bench::BenchArgs),
    /// Prove built-in algorithms or a schedule file correct for a range of world sizes.
    Verify(verify_cmd::VerifyArgs),
    /// Print a built-in schedule as an ASCII grid or as JSON.
    Schedule(schedule_cmd::ScheduleArgs),
    /// Print the execution plan of one call: every rank's instructions, resources and hash.
    Plan(plan_cmd::PlanArgs),
    /// Show a link graph: the nvidia-smi topo -m matrix, bandwidth and latency matrices, rings, bottlenecks.
    Topo(topo::TopoArgs),
    /// Predict the bench table on a topology, with the bottleneck link of each row.
    Sim(sim_cmd::SimArgs),
    /// Synthesize rings, tree packings or the hierarchical all-reduce for a topology (or some of its GPUs); write the proven schedule.
    Synth(synth_cmd::SynthArgs),
    /// Gradient-sync time per training step and its share of the step.
    Estimate(estimate_cmd::EstimateArgs),
    /// Start N local processes of one group (env:// variables), rank-prefixed output, fail fast.
    Launch(launch::LaunchArgs),
    /// The launcher's watchdog (started by `launch`).
    #[command(hide = true)]
    LaunchWatchdog(launch::watchdog::WatchdogArgs),
    /// Check the env:// bootstrap: every rank meets at rank 0's store (run under `launch`).
    Rendezvous(rendezvous_cmd::RendezvousArgs),
    /// What a bug report needs: build, CPU and memory bandwidth, CUDA driver, NVRTC, NCCL, GPUs and their links.
    Info(info_cmd::InfoArgs),
    /// Read the ranks' flight-recorder dumps (FERROCOLL_TRACE_DIR): who stalled in which call.
    Trace(trace_cmd::TraceArgs),
}

fn main() -> ExitCode {
    restore_sigpipe();
    // SAFETY: first thing in `main`, before any thread exists or CUDA is
    // touched.
    unsafe { ferrocoll::env::prepare_gpu_environment() };
    let cli = Cli::parse();
    match cli.command {
        Command::Launch(_) => ferrocoll::log::init_launcher(),
        _ => ferrocoll::log::init(),
    };
    let result = match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Verify(args) => verify_cmd::run(&args),
        Command::Schedule(args) => schedule_cmd::run(&args),
        Command::Plan(args) => plan_cmd::run(&args),
        Command::Topo(args) => budgeted(|| topo::run(&args)),
        Command::Sim(args) => budgeted(|| sim_cmd::run(&args)),
        Command::Synth(args) => budgeted(|| synth_cmd::run(&args)),
        Command::Estimate(args) => budgeted(|| estimate_cmd::run(&args)),
        Command::Launch(args) => launch::run(&args),
        Command::LaunchWatchdog(args) => launch::watchdog::run(&args),
        Command::Rendezvous(args) => rendezvous_cmd::run(&args),
        Command::Info(args) => info_cmd::run(&args),
        Command::Trace(args) => trace_cmd::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Work the topology tools may do for one command (simulated
/// instructions and search steps; `FERROCOLL_WORK_BUDGET` sets it).
const WORK_BUDGET: u64 = 4_000_000_000;

/// Run a topology tool within the work budget (see `ferrocoll::topo::work`).
fn budgeted(run: impl FnOnce() -> Result<ExitCode, String>) -> Result<ExitCode, String> {
    let budget = match std::env::var("FERROCOLL_WORK_BUDGET") {
        Err(_) => WORK_BUDGET,
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                format!("FERROCOLL_WORK_BUDGET={v:?} is not a whole number of at least 1")
            })?,
    };
    let (result, spent) = ferrocoll::topo::work::within(budget, run);
    tracing::debug!(spent, budget, "work of the topology tools");
    result
}

/// Let `ferrocoll topo | head` end quietly, as other Unix tools do: Rust
/// ignores SIGPIPE, which turns a closed pipe into a panic in `println!`.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first thing in `main`, before any thread exists;
    // resetting a signal to its default disposition has no other effect.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "ferrocoll",
            "verify",
            "--op",
            "all-reduce",
            "--ranks",
            "2..4",
        ]);
        assert!(cli.is_ok());
    }
}
