//! `ferrocoll launch -n N -- <command…>`: start N local processes of one
//! group with the `env://` variables and a fresh job secret, prefix their
//! output with their rank, and fail fast: when one exits with an error
//! (or is killed), the others are killed — after `--grace` seconds in
//! which they may report the loss themselves — and the launcher exits
//! non-zero, naming the rank that failed first. With
//! `FERROCOLL_TRACE_DIR` set, ranks about to be killed first get SIGUSR1
//! and a second to dump their flight recorders, so a hang's survivors
//! leave their record instead of only the first rank to time out.
//!
//! Like torchrun, it never leaves an orphan: SIGINT, SIGTERM and SIGHUP
//! are forwarded to every rank's process group, which gets
//! `--term-timeout` seconds to exit before it is killed (a second signal
//! kills at once); on Linux each rank also dies with the launcher if the
//! launcher itself is killed. The launcher is a child subreaper, so
//! what left a rank's process group (`setsid`) and was orphaned comes
//! back to it and is killed at the end (see [`tree`] for what remains
//! possible). Segments that ranks killed during setup left in tmpfs are
//! removed at the end.

mod forward;
mod job;
mod nodes;
mod notes;
pub(crate) mod signals;
mod supervise;
mod tree;
pub(crate) mod watchdog;

use std::process::{Child, Command, ExitCode, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Args;

use forward::forward;
use job::Job;
use nodes::{Cluster, NodeSpec};
use notes::Notes;
use supervise::{Timing, Watchers, stop, supervise};
use watchdog::Watchdog;

/// The most ranks one launch starts: a local launcher for one host.
const MAX_RANKS: u32 = 1024;

#[derive(Args, Debug)]
pub(crate) struct LaunchArgs {
    /// Processes to start on this host.
    #[arg(
        short = 'n',
        long = "nproc",
        visible_alias = "nproc-per-node",
        default_value_t = 2
    )]
    nproc: u32,
    /// MASTER_PORT for the rendezvous; default: a free port (one host only).
    #[arg(long)]
    port: Option<u16>,
    /// Hosts the job spans: run one launcher per host, each with its
    /// `--node-rank`, the same `--rdzv-endpoint`, `--nproc-per-node` and
    /// job secret (`FERROCOLL_JOB_SECRET` or `--secret-file`).
    #[arg(long, default_value_t = 1)]
    nnodes: u32,
    /// This host's place among the `--nnodes` (0 hosts the launchers' store).
    #[arg(long, default_value_t = 0)]
    node_rank: u32,
    /// HOST:PORT where node 0's launcher hosts the launchers' store (an
    /// address of node 0 every host reaches); the ranks' store goes on a
    /// free port of the same host.
    #[arg(long)]
    rdzv_endpoint: Option<String>,
    /// Seconds the launchers wait for each other.
    #[arg(long, default_value_t = 300.0)]
    rdzv_timeout: f64,
    /// A file holding the job secret (instead of `FERROCOLL_JOB_SECRET`).
    #[arg(long)]
    secret_file: Option<std::path::PathBuf>,
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

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port for the rendezvous: {e}"))
}

/// How long the launcher waits, once every rank has ended and what they
/// left behind is killed, for their output to drain: only a process that
/// left the rank's process group (`setsid`) can still hold a pipe then.
const DRAIN: Duration = Duration::from_secs(1);

/// How long the launcher keeps killing what the ranks left behind (a
/// stray may fork while it is being killed).
const STRAYS: Duration = Duration::from_secs(2);

/// Seconds from a flag: finite and at least 0.
fn seconds(flag: &str, value: f64) -> Result<Duration, String> {
    if !(value >= 0.0 && value.is_finite() && value < 1e9) {
        return Err(format!("--{flag} must be a number of seconds, at least 0"));
    }
    Ok(Duration::from_secs_f64(value))
}

/// Where this launcher's ranks sit in the job.
struct Placement {
    /// The first rank started here.
    first: u32,
    world: u32,
    /// This host's node rank (torchrun's `GROUP_RANK`).
    node: u32,
    master: (String, u16),
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
    let rdzv_timeout = seconds("rdzv-timeout", args.rdzv_timeout)?;
    if args.command.is_empty() {
        return Err("no command given after `--`".into());
    }
    let spec = node_spec(args)?;
    let port = one_host_port(args, spec.is_some())?;
    signals::install()?;
    // Our output closing (piped into `head`) must not take the launcher,
    // and with it every rank, down: forwarders see EPIPE and drain. The
    // ranks start with SIGPIPE at its default (std resets it on spawn).
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let (job, placement, cluster) = place(args, spec.as_ref(), port, rdzv_timeout)?;
    // Orphans from anywhere in the job become ours, not init's, so the
    // end can find what left its rank's process group.
    tree::become_subreaper();
    // Bound before any rank starts, so no rank's note is lost.
    let notes = Notes::bind(&job.id);
    let mut watchdog = Watchdog::start(&job);
    let started = spawn_all(args, &placement, &job, watchdog.as_mut());
    let (children, forwarders) = match started {
        Ok(started) => started,
        Err(e) => {
            job.remove_segments();
            if let Some(w) = watchdog {
                w.done();
            }
            if let Some(c) = cluster {
                c.report_failure(&e);
                c.finish();
            }
            return Err(e);
        }
    };
    let pids: Vec<String> = children
        .iter()
        .map(|(r, c)| format!("{r}={}", c.id()))
        .collect();
    let (addr, port) = &placement.master;
    let node = match &spec {
        Some(s) => format!("node {} of {}, ", s.node_rank, s.nnodes),
        None => String::new(),
    };
    eprintln!(
        "ferrocoll launch: {node}{} ranks, rendezvous {addr}:{port}, job {}, pids {}",
        args.nproc,
        job.id,
        pids.join(" ")
    );
    let mut end = supervise(
        children,
        &Timing {
            grace,
            term_timeout,
            dump_wait: ferrocoll::settings::trace_settings().dir.map(|_| DUMP_WAIT),
        },
        Watchers {
            watchdog: watchdog.as_mut(),
            notes,
            cluster: cluster.as_ref(),
        },
    );
    // A signal that stopped the starting before any rank ran.
    if end.signal.is_none() {
        end.signal = signals::received().map(|(signal, _)| signal);
    }
    let strays = tree::kill_strays(watchdog.as_ref().map(Watchdog::pid), STRAYS);
    if strays > 0 {
        eprintln!(
            "ferrocoll launch: killed {strays} processes the ranks left running outside \
             their process groups"
        );
    }
    drain(forwarders, DRAIN);
    let removed = job.remove_segments();
    if let Some(w) = watchdog {
        w.done();
    }
    if removed > 0 {
        eprintln!("ferrocoll launch: removed {removed} shared-memory segments ranks left behind");
    }
    if let Some(c) = cluster {
        c.finish();
    }
    Ok(end.report())
}

/// The ranks' store port of a job on one host (`--port`, else a free
/// one); across hosts node 0 picks it (0 here).
fn one_host_port(args: &LaunchArgs, across_hosts: bool) -> Result<u16, String> {
    match (args.port, across_hosts) {
        (Some(_), true) => Err(
            "--port is for one host; across hosts the ranks' store goes beside --rdzv-endpoint"
                .into(),
        ),
        (Some(0), false) => Err(
            "--port must be between 1 and 65535 (0 is no port: omit the flag for a free one)"
                .into(),
        ),
        (Some(p), false) => Ok(p),
        (None, false) => free_port(),
        (None, true) => Ok(0),
    }
}

/// The job and where this launcher's ranks sit in it: the whole job on
/// one host, or (across hosts) what the launchers agreed, with the
/// watcher of the other hosts.
fn place(
    args: &LaunchArgs,
    spec: Option<&NodeSpec>,
    port: u16,
    rdzv_timeout: Duration,
) -> Result<(Job, Placement, Option<Cluster>), String> {
    let Some(spec) = spec else {
        let placement = Placement {
            first: 0,
            world: args.nproc,
            node: 0,
            master: ("127.0.0.1".to_owned(), port),
        };
        return Ok((Job::new(), placement, None));
    };
    let secret = job_secret(args)?;
    let verdict = nodes::meet(spec, &secret, &Job::new().id, rdzv_timeout)?;
    let placement = Placement {
        first: spec.node_rank * spec.nproc_per_node,
        world: spec.world_size(),
        node: spec.node_rank,
        master: verdict.master.clone(),
    };
    let job = Job {
        secret: secret.clone(),
        id: verdict.job_id.clone(),
    };
    let cluster = Cluster::watch(spec, &secret, verdict.store)?;
    Ok((job, placement, Some(cluster)))
}

/// The job's shape across hosts, when the flags ask for more than one
/// host's launcher (`None`: this launcher is the whole job).
fn node_spec(args: &LaunchArgs) -> Result<Option<NodeSpec>, String> {
    let Some(endpoint) = &args.rdzv_endpoint else {
        if args.nnodes > 1 || args.node_rank > 0 {
            return Err(
                "--nnodes and --node-rank need --rdzv-endpoint HOST:PORT (node 0's address)".into(),
            );
        }
        return Ok(None);
    };
    let spec = NodeSpec {
        nnodes: args.nnodes,
        node_rank: args.node_rank,
        nproc_per_node: args.nproc,
        endpoint: endpoint.clone(),
    };
    spec.check()?;
    if spec.world_size() > MAX_WORLD {
        return Err(format!(
            "--nnodes × --nproc-per-node must be at most {MAX_WORLD}"
        ));
    }
    Ok(Some(spec))
}

/// The most ranks of a job across hosts.
const MAX_WORLD: u32 = 1 << 20;

/// The secret every node's launcher was given: from `--secret-file`, else
/// `FERROCOLL_JOB_SECRET`. A job across hosts cannot make one up: the
/// others would not know it.
fn job_secret(args: &LaunchArgs) -> Result<ferrocoll::rendezvous::JobSecret, String> {
    use ferrocoll::rendezvous::JobSecret;
    match &args.secret_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--secret-file {}: {e}", path.display()))?;
            JobSecret::new(text.trim_end_matches(['\n', '\r']))
                .ok_or_else(|| format!("--secret-file {}: the file is empty", path.display()))
        }
        None => JobSecret::from_env().ok_or_else(|| {
            format!(
                "a job across hosts needs the same secret on every node: set {} (or pass --secret-file)",
                JobSecret::ENV
            )
        }),
    }
}

/// Wait up to `within` for the forwarders to pass on what is left; a
/// forwarder still blocked then (its pipe held by an escaped process) is
/// left behind, to end with the launcher.
fn drain(forwarders: Vec<JoinHandle<()>>, within: Duration) {
    let until = Instant::now() + within;
    while forwarders.iter().any(|f| !f.is_finished()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    for f in forwarders.into_iter().filter(JoinHandle::is_finished) {
        let _ = f.join();
    }
}

/// Start every rank with its env:// variables, its output forwarded with
/// a rank prefix; on a failure to start one, stop the ones started. A
/// signal stops the starting: the ranks started so far are handed on, and
/// the supervisor forwards the signal to them.
#[allow(clippy::type_complexity)]
fn spawn_all(
    args: &LaunchArgs,
    at: &Placement,
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
    for local in 0..args.nproc {
        let rank = at.first + local;
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
            .env("LOCAL_RANK", local.to_string())
            .env("WORLD_SIZE", at.world.to_string())
            .env("LOCAL_WORLD_SIZE", args.nproc.to_string())
            .env("GROUP_RANK", at.node.to_string())
            .env("MASTER_ADDR", &at.master.0)
            .env("MASTER_PORT", at.master.1.to_string())
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

/// How long ranks about to be killed get to write their flight
/// recorders' dumps (a dump is one small file written in milliseconds;
/// ranks on a loaded host get the rest).
const DUMP_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The host kernels every rank should run, timed once here for both
/// regimes (in the cache and past it): the ranks would time the same
/// variants on the same arrays, but each rank timing on its own beside
/// the others is noise, and ranks that chose differently would run at
/// different rates. Hand-offs keep the rule, which every rank applies
/// alike. `None` when the caller forces a variant with
/// `FERROCOLL_KERNELS` already.
fn shared_kernel_choice() -> Option<String> {
    if ferrocoll::settings::kernels_override().is_some() {
        return None;
    }
    Some(ferrocoll::kernels::calibration().spec())
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
