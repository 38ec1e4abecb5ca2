//! The `ferrocoll` command-line tool: prove schedules (`verify`) and print
//! them (`schedule`). Run `ferrocoll --help` for the commands.

mod bench;
mod schedule_cmd;
mod spec;
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
    about = "Collective communication: benchmark, prove and print schedules."
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_max_level(ferrocoll::env::log_level())
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Verify(args) => verify_cmd::run(&args),
        Command::Schedule(args) => schedule_cmd::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
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
