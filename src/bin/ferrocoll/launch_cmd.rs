//! `ferrocoll launch -n N -- <command…>`: start N local processes of one
//! group with the `env://` variables, prefix their output with their rank,
//! and fail fast: when one exits with an error (or is killed), the others
//! are killed — after `--grace` seconds in which they may report the loss
//! themselves — and the launcher exits non-zero.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct LaunchArgs {
    /// Processes to start.
    #[arg(short = 'n', long = "nproc", default_value_t = 2)]
    nproc: u32,
    /// MASTER_PORT for the rendezvous; default: a free port.
    #[arg(long)]
    port: Option<u16>,
    /// After a rank fails, give the others this many seconds to notice
    /// and exit on their own (ferrocoll's communicators report a lost peer
    /// within milliseconds) before killing them; 0 kills at once.
    #[arg(long, default_value_t = 0.0)]
    grace: f64,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Kill a rank and everything in its process group.
fn stop(child: &mut Child) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: signalling the process group this launcher created for
        // the child (its pid is the group id); no memory is involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port for the rendezvous: {e}"))
}

/// Copy a child's stream to ours, one prefixed line at a time.
fn forward(
    stream: impl std::io::Read + Send + 'static,
    rank: u32,
    err: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if err {
                eprintln!("[rank {rank}] {line}");
            } else {
                println!("[rank {rank}] {line}");
            }
        }
    })
}

pub(crate) fn run(args: &LaunchArgs) -> Result<ExitCode, String> {
    if args.nproc == 0 {
        return Err("-n must be at least 1".into());
    }
    if !(args.grace >= 0.0 && args.grace.is_finite()) {
        return Err("--grace must be a number of seconds, at least 0".into());
    }
    let port = match args.port {
        Some(p) => p,
        None => free_port()?,
    };
    let (children, forwarders) = spawn_all(args, port)?;
    let pids: Vec<String> = children
        .iter()
        .map(|(r, c)| format!("{r}={}", c.id()))
        .collect();
    eprintln!(
        "ferrocoll launch: {} ranks, rendezvous 127.0.0.1:{port}, pids {}",
        args.nproc,
        pids.join(" ")
    );
    let (failed, after) = supervise(children, Duration::from_secs_f64(args.grace));
    for f in forwarders {
        let _ = f.join();
    }
    match failed {
        None => Ok(ExitCode::SUCCESS),
        Some((rank, why)) => {
            let rest = if after.is_empty() {
                String::new()
            } else {
                format!("; then {}", after.join(", "))
            };
            eprintln!("ferrocoll launch: rank {rank} failed ({why}){rest}");
            Ok(ExitCode::from(1))
        }
    }
}

/// Start every rank with its env:// variables, its output forwarded with
/// a rank prefix; on a failure to start one, stop the ones started.
#[allow(clippy::type_complexity)]
fn spawn_all(
    args: &LaunchArgs,
    port: u16,
) -> Result<(Vec<(u32, Child)>, Vec<std::thread::JoinHandle<()>>), String> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or("no command given after `--`")?;
    let mut children: Vec<(u32, Child)> = Vec::new();
    let mut forwarders = Vec::new();
    for rank in 0..args.nproc {
        let mut command = Command::new(program);
        #[cfg(unix)]
        {
            // Each rank leads its own process group, so killing it also
            // stops what it started (a shell's children hold our pipes).
            use std::os::unix::process::CommandExt;
            command.process_group(0);
        }
        let mut child = command
            .args(rest)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", args.nproc.to_string())
            .env("LOCAL_WORLD_SIZE", args.nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                for (_, c) in &mut children {
                    stop(c);
                }
                format!("starting `{program}`: {e}")
            })?;
        if let Some(out) = child.stdout.take() {
            forwarders.push(forward(out, rank, false));
        }
        if let Some(err) = child.stderr.take() {
            forwarders.push(forward(err, rank, true));
        }
        children.push((rank, child));
    }
    Ok((children, forwarders))
}

/// Wait for every rank; the first failure kills the rest after `grace`.
/// Returns the first failure and how the others ended after it.
fn supervise(children: Vec<(u32, Child)>, grace: Duration) -> (Option<(u32, String)>, Vec<String>) {
    let mut failed: Option<(u32, String)> = None;
    let mut kill_at: Option<Instant> = None;
    let mut after: Vec<String> = Vec::new();
    let mut running: Vec<(u32, Child)> = children;
    while !running.is_empty() {
        let mut still = Vec::new();
        let mut ended = Vec::new();
        for (rank, mut child) in running {
            match child.try_wait() {
                Ok(Some(status)) => ended.push((rank, status)),
                Ok(None) => still.push((rank, child)),
                Err(e) => {
                    failed.get_or_insert((rank, e.to_string()));
                }
            }
        }
        // Of ranks that ended since the last look, one killed by a signal
        // is the likelier cause: its peers exit with errors right after.
        #[cfg(unix)]
        ended.sort_by_key(|(_, status)| {
            use std::os::unix::process::ExitStatusExt;
            status.signal().is_none()
        });
        for (rank, status) in ended {
            if failed.is_some() {
                after.push(if status.success() {
                    format!("rank {rank} exited cleanly")
                } else {
                    format!("rank {rank} {status}")
                });
            } else if !status.success() {
                failed = Some((rank, status.to_string()));
            }
        }
        running = still;
        if failed.is_some() {
            let at = *kill_at.get_or_insert_with(|| Instant::now() + grace);
            if Instant::now() >= at {
                for (rank, child) in &mut running {
                    stop(child);
                    after.push(format!("rank {rank} killed"));
                }
                for (_, child) in &mut running {
                    let _ = child.wait();
                }
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    (failed, after)
}
