//! `ferrocoll launch -n N -- <command…>`: start N local processes of one
//! group with the `env://` variables and a fresh job secret, prefix their
//! output with their rank, and fail fast: when one exits with an error
//! (or is killed), the others are killed — after `--grace` seconds in
//! which they may report the loss themselves — and the launcher exits
//! non-zero, naming the rank that failed first.
//!
//! Like torchrun, it never leaves an orphan: SIGINT, SIGTERM and SIGHUP
//! are forwarded to every rank's process group, which gets
//! `--term-timeout` seconds to exit before it is killed (a second signal
//! kills at once); on Linux each rank also dies with the launcher if the
//! launcher itself is killed. Segments that ranks killed during setup
//! left in tmpfs are removed at the end.

mod job;
mod signals;
pub(crate) mod watchdog;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use job::Job;
use watchdog::Watchdog;

/// The most ranks one launch starts: a local launcher for one host.
const MAX_RANKS: u32 = 1024;

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
    /// After forwarding SIGINT, SIGTERM or SIGHUP to the ranks, wait this
    /// many seconds for them to exit before killing them.
    #[arg(long, default_value_t = 5.0)]
    term_timeout: f64,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Kill a rank and everything in its process group.
fn stop(child: &mut Child) {
    #[cfg(unix)]
    signals::send_group(child.id(), libc::SIGKILL);
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
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if err {
                eprintln!("[rank {rank}] {line}");
            } else {
                println!("[rank {rank}] {line}");
            }
        }
    })
}

/// Seconds from a flag: finite and at least 0.
fn seconds(flag: &str, value: f64) -> Result<Duration, String> {
    if !(value >= 0.0 && value.is_finite() && value < 1e9) {
        return Err(format!("--{flag} must be a number of seconds, at least 0"));
    }
    Ok(Duration::from_secs_f64(value))
}

pub(crate) fn run(args: &LaunchArgs) -> Result<ExitCode, String> {
    // Every argument is checked before anything starts.
    if args.nproc == 0 || args.nproc > MAX_RANKS {
        return Err(format!(
            "-n must be between 1 and {MAX_RANKS} (ranks on this host)"
        ));
    }
    let grace = seconds("grace", args.grace)?;
    let term_timeout = seconds("term-timeout", args.term_timeout)?;
    if args.command.is_empty() {
        return Err("no command given after `--`".into());
    }
    let port = match args.port {
        Some(p) => p,
        None => free_port()?,
    };
    signals::install()?;
    let job = Job::new();
    let mut watchdog = Watchdog::start(&job);
    let started = spawn_all(args, port, &job, watchdog.as_mut());
    let (children, forwarders) = match started {
        Ok(started) => started,
        Err(e) => {
            job.remove_segments();
            if let Some(w) = watchdog {
                w.done();
            }
            return Err(e);
        }
    };
    let pids: Vec<String> = children
        .iter()
        .map(|(r, c)| format!("{r}={}", c.id()))
        .collect();
    eprintln!(
        "ferrocoll launch: {} ranks, rendezvous 127.0.0.1:{port}, job {}, pids {}",
        args.nproc,
        job.id,
        pids.join(" ")
    );
    let mut end = supervise(children, grace, term_timeout);
    // A signal that stopped the starting before any rank ran.
    if end.signal.is_none() {
        end.signal = signals::received().map(|(signal, _)| signal);
    }
    for f in forwarders {
        let _ = f.join();
    }
    let removed = job.remove_segments();
    if let Some(w) = watchdog {
        w.done();
    }
    if removed > 0 {
        eprintln!("ferrocoll launch: removed {removed} shared-memory segments ranks left behind");
    }
    Ok(end.report())
}

/// Start every rank with its env:// variables, its output forwarded with
/// a rank prefix; on a failure to start one, stop the ones started. A
/// signal stops the starting: the ranks started so far are handed on, and
/// the supervisor forwards the signal to them.
#[allow(clippy::type_complexity)]
fn spawn_all(
    args: &LaunchArgs,
    port: u16,
    job: &Job,
    mut watchdog: Option<&mut Watchdog>,
) -> Result<(Vec<(u32, Child)>, Vec<std::thread::JoinHandle<()>>), String> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or("no command given after `--`")?;
    let program = own_program(program);
    let kernels = shared_kernel_choice();
    let mut children: Vec<(u32, Child)> = Vec::new();
    let mut forwarders = Vec::new();
    for rank in 0..args.nproc {
        if signals::received().is_some() {
            break;
        }
        let mut command = Command::new(&program);
        #[cfg(unix)]
        {
            // Each rank leads its own process group, so killing it also
            // stops what it started (a shell's children hold our pipes).
            use std::os::unix::process::CommandExt;
            command.process_group(0);
            die_with_launcher(&mut command);
        }
        if let Some(spec) = &kernels {
            command.env("FERROCOLL_KERNELS", spec);
        }
        let mut child = command
            .args(rest)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", args.nproc.to_string())
            .env("LOCAL_WORLD_SIZE", args.nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env(ferrocoll::rendezvous::JobSecret::ENV, job.secret.expose())
            .env("FERROCOLL_JOB_ID", &job.id)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                for (_, c) in &mut children {
                    stop(c);
                }
                format!("starting `{}`: {e}", program.to_string_lossy())
            })?;
        if let Some(w) = watchdog.as_deref_mut() {
            w.watch(child.id());
        }
        let streams = [
            child.stdout.take().map(|s| forward(s, rank, false)),
            child.stderr.take().map(|s| forward(s, rank, true)),
        ];
        children.push((rank, child));
        for spawned in streams.into_iter().flatten() {
            match spawned {
                Ok(handle) => forwarders.push(handle),
                Err(e) => {
                    for (_, c) in &mut children {
                        stop(c);
                        let _ = c.wait();
                    }
                    return Err(format!(
                        "cannot start a thread to forward rank {rank}'s output: {e}"
                    ));
                }
            }
        }
    }
    Ok((children, forwarders))
}

/// The host kernel width every rank should run, measured once here (the
/// ranks would time the same widths on the same arrays, but each rank
/// timing on its own beside the others is noise); the stores are left to
/// the rule, which every rank applies alike to each call's bytes, so no
/// rank is forced onto a weaker store than it would pick. `None` when the
/// caller forces a variant with `FERROCOLL_KERNELS` already.
fn shared_kernel_choice() -> Option<String> {
    if ferrocoll::settings::kernels_override().is_some() {
        return None;
    }
    Some(ferrocoll::kernels::chosen().width_spec().to_owned())
}

/// `ferrocoll` as the command means this very executable, wherever cargo
/// put it (`CARGO_TARGET_DIR`, a debug or release build) and whether or
/// not one is on `PATH`; any other command is run as given.
fn own_program(program: &str) -> std::ffi::OsString {
    match std::env::current_exe() {
        Ok(exe) if program == "ferrocoll" => exe.into_os_string(),
        _ => program.into(),
    }
}

/// On Linux, the rank is killed if the launcher dies (even by SIGKILL,
/// which no handler sees), so no rank outlives it.
#[cfg(unix)]
fn die_with_launcher(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: getpid before the fork; the closure runs in the child
        // between fork and exec and calls only async-signal-safe functions.
        let launcher = unsafe { libc::getpid() };
        // SAFETY: as above.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher may have died before the prctl took hold.
                if libc::getppid() != launcher {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

#[cfg(not(unix))]
fn die_with_launcher(_command: &mut Command) {}

/// How long after the first failure a rank killed by a signal still
/// takes the blame from it: a killed rank's peers can see the broken link
/// and exit with an error before the kernel has finished tearing the
/// killed process down and the launcher can reap it.
const BLAME_SETTLE: Duration = Duration::from_millis(500);

/// How the ranks ended.
struct End {
    /// The first rank to fail, and how.
    failed: Option<(u32, String)>,
    /// When `failed` was set, and whether that rank was killed by a signal.
    failed_at: Option<(Instant, bool)>,
    /// A signal the launcher received and forwarded.
    signal: Option<i32>,
    /// How the others ended after that.
    after: Vec<String>,
}

impl End {
    /// Say how the job ended; the exit code follows the shell's
    /// convention (128 + signal) when the launcher was interrupted.
    fn report(&self) -> ExitCode {
        let rest = if self.after.is_empty() {
            String::new()
        } else {
            format!("; then {}", self.after.join(", "))
        };
        if let Some(signal) = self.signal {
            eprintln!(
                "ferrocoll launch: interrupted by {}: forwarded to every rank{rest}",
                signals::name(signal)
            );
            return ExitCode::from(128u8.saturating_add(signal.clamp(0, 127) as u8));
        }
        match &self.failed {
            None => ExitCode::SUCCESS,
            Some((rank, why)) => {
                eprintln!("ferrocoll launch: rank {rank} failed first ({why}){rest}");
                ExitCode::from(1)
            }
        }
    }
}

/// Wait for every rank. The first failure kills the rest after `grace`;
/// a signal is forwarded to every rank, which are killed `term_timeout`
/// later (at once on a second signal).
fn supervise(children: Vec<(u32, Child)>, grace: Duration, term_timeout: Duration) -> End {
    let mut end = End {
        failed: None,
        failed_at: None,
        signal: None,
        after: Vec::new(),
    };
    let mut kill_at: Option<Instant> = None;
    let mut forwarded = 0u32;
    let mut running: Vec<(u32, Child)> = children;
    while !running.is_empty() {
        if let Some((signal, count)) = signals::received()
            && count > forwarded
        {
            forwarded = count;
            end.signal = Some(signal);
            for (_, child) in &running {
                signals::send_group(child.id(), signal);
            }
            let at = if count > 1 {
                Instant::now()
            } else {
                Instant::now() + term_timeout
            };
            kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
        }
        running = reap(running, &mut end);
        if end.failed.is_some() && kill_at.is_none() {
            kill_at = Some(Instant::now() + grace);
        }
        if kill_at.is_some_and(|at| Instant::now() >= at) {
            for (rank, child) in &mut running {
                stop(child);
                end.after.push(format!("rank {rank} killed"));
            }
            for (_, child) in &mut running {
                let _ = child.wait();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    end
}

/// Collect the ranks that ended since the last look; keep the rest.
fn reap(running: Vec<(u32, Child)>, end: &mut End) -> Vec<(u32, Child)> {
    let mut still = Vec::new();
    let mut ended = Vec::new();
    for (rank, mut child) in running {
        match child.try_wait() {
            Ok(Some(status)) => ended.push((rank, status)),
            Ok(None) => still.push((rank, child)),
            Err(e) => {
                end.failed.get_or_insert((rank, e.to_string()));
            }
        }
    }
    // Of ranks that ended since the last look, one killed by a signal
    // is the likelier cause: its peers exit with errors right after.
    ended.sort_by_key(|(_, status)| !killed_by_signal(status));
    for (rank, status) in ended {
        end.record(rank, status);
    }
    still
}

impl End {
    /// Note how one rank ended.
    fn record(&mut self, rank: u32, status: std::process::ExitStatus) {
        let signaled = killed_by_signal(&status);
        if self.signal.is_none() && !status.success() && self.takes_blame(signaled) {
            if let Some((first, why)) = self.failed.take() {
                self.after.insert(0, format!("rank {first} {why}"));
            }
            self.failed = Some((rank, status.to_string()));
            self.failed_at = Some((Instant::now(), signaled));
        } else if self.failed.is_some() || self.signal.is_some() {
            self.after.push(if status.success() {
                format!("rank {rank} exited cleanly")
            } else {
                format!("rank {rank} {status}")
            });
        }
    }

    /// Whether a rank that just failed (by a signal or not) is the one to
    /// name: the first failure, or a killed rank reaped shortly after a
    /// first failure that was an ordinary error exit.
    fn takes_blame(&self, signaled: bool) -> bool {
        match self.failed_at {
            None => self.failed.is_none(),
            Some((at, first_signaled)) => {
                signaled && !first_signaled && at.elapsed() < BLAME_SETTLE
            }
        }
    }
}

fn killed_by_signal(status: &std::process::ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        status.signal().is_some()
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        false
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    fn fresh() -> End {
        End {
            failed: None,
            failed_at: None,
            signal: None,
            after: Vec::new(),
        }
    }

    const EXIT_2: i32 = 2 << 8;
    const SIGKILL: i32 = 9;

    #[test]
    fn a_killed_rank_reaped_just_after_its_peers_error_takes_the_blame() {
        let mut end = fresh();
        end.record(0, ExitStatus::from_raw(EXIT_2));
        end.record(2, ExitStatus::from_raw(SIGKILL));
        end.record(1, ExitStatus::from_raw(EXIT_2));
        assert_eq!(end.failed.as_ref().unwrap().0, 2);
        assert_eq!(end.after.len(), 2);
        assert!(end.after[0].starts_with("rank 0 "), "{:?}", end.after);
    }

    #[test]
    fn a_first_error_stands_once_the_settle_time_is_over() {
        let mut end = fresh();
        end.record(0, ExitStatus::from_raw(EXIT_2));
        end.failed_at = Some((Instant::now() - BLAME_SETTLE, false));
        end.record(2, ExitStatus::from_raw(SIGKILL));
        assert_eq!(end.failed.as_ref().unwrap().0, 0);
    }

    #[test]
    fn a_first_kill_is_never_replaced() {
        let mut end = fresh();
        end.record(3, ExitStatus::from_raw(SIGKILL));
        end.record(1, ExitStatus::from_raw(SIGKILL));
        end.record(0, ExitStatus::from_raw(0));
        assert_eq!(end.failed.as_ref().unwrap().0, 3);
        assert_eq!(end.after.len(), 2);
    }
}
