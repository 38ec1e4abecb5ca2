//! The launcher's watchdog: a small process of its own that outlives a
//! launcher killed by SIGKILL (which no handler sees) and then kills every
//! rank's whole process group and removes the job's segments.
//!
//! `PR_SET_PDEATHSIG` takes each rank's own process with the launcher, but
//! not what the rank started (a shell's `sleep`, a training script's
//! workers): those sit in the rank's process group, which only a `killpg`
//! reaches. The launcher tells the watchdog each group as it starts it,
//! over the watchdog's stdin, says `gone` with the group's id before it
//! reaps the group's rank, and says `done` when it ends normally; end of
//! input without `done` means the launcher died.
//!
//! `gone` is written while the rank is still a zombie, so its pid (and
//! with it the group id) cannot have been handed to another process yet;
//! the watchdog reads its input in order, so it has forgotten the group
//! before it can act on the launcher's death. Without it, a launcher
//! SIGKILLed long after a rank ended would have its watchdog kill
//! whatever group had since been given that rank's old id.

use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command, Stdio};

use clap::Args;

use super::job::Job;
use super::signals;

/// `ferrocoll launch-watchdog --job ID` (started by `launch`; not for users).
#[derive(Args, Debug)]
pub(crate) struct WatchdogArgs {
    /// The job whose segments to remove.
    #[arg(long)]
    job: String,
}

/// The launcher's end of the watchdog.
pub(crate) struct Watchdog {
    child: Child,
    to: ChildStdin,
}

impl Watchdog {
    /// Start the watchdog of `job`; `None` (with a warning) where it cannot
    /// start: the launcher then works as before, minus this guarantee.
    pub fn start(job: &Job) -> Option<Watchdog> {
        let exe = std::env::current_exe().ok()?;
        let mut command = Command::new(exe);
        command
            .args(["launch-watchdog", "--job", &job.id])
            // It needs nothing from the environment, the job secret least.
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // Its own group: a terminal's Ctrl-C must not take it first.
            command.process_group(0);
        }
        match command.spawn() {
            Ok(mut child) => {
                let to = child.stdin.take()?;
                Some(Watchdog { child, to })
            }
            Err(e) => {
                tracing::warn!(
                    "launch: no watchdog ({e}); a SIGKILLed launcher may leave rank children"
                );
                None
            }
        }
    }

    /// Tell it about a rank's process group.
    pub fn watch(&mut self, group: u32) {
        let _ = writeln!(self.to, "{group}");
    }

    /// The watchdog's pid: the one process under the launcher that is not
    /// the job's.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Forget a rank's process group: its rank has exited and is about to
    /// be reaped, after which its id may be reused by any process.
    pub fn forget(&mut self, group: u32) {
        let _ = writeln!(self.to, "gone {group}");
    }

    /// The launcher ends normally: the watchdog leaves everything alone.
    pub fn done(mut self) {
        let _ = writeln!(self.to, "done");
        drop(self.to);
        let _ = self.child.wait();
    }
}

/// The watchdog's side: read groups until `done` (exit quietly) or end of
/// input (the launcher died: kill every group, remove the segments).
pub(crate) fn run(args: &WatchdogArgs) -> Result<std::process::ExitCode, String> {
    // Only the end of its input stops it: a `pkill`'s SIGTERM, a
    // terminal's hangup or Ctrl-C must not leave the job unguarded (a
    // launcher SIGKILLed after that once left its ranks' children).
    #[cfg(unix)]
    // SAFETY: ignoring signals at the start of a single-threaded process.
    unsafe {
        for signal in [libc::SIGINT, libc::SIGHUP, libc::SIGTERM, libc::SIGQUIT] {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    let mut groups = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line == "done" {
            return Ok(std::process::ExitCode::SUCCESS);
        }
        match line.trim().split_once(' ') {
            Some(("gone", group)) => {
                if let Ok(group) = group.parse::<u32>() {
                    groups.retain(|&g| g != group);
                }
            }
            _ => {
                if let Ok(group) = line.trim().parse::<u32>() {
                    groups.push(group);
                }
            }
        }
    }
    for group in groups {
        #[cfg(unix)]
        signals::send_group(group, libc::SIGKILL);
        #[cfg(not(unix))]
        let _ = group;
    }
    Job::with_id(args.job.clone()).remove_segments();
    Ok(std::process::ExitCode::SUCCESS)
}
