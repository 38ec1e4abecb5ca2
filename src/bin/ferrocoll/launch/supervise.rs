//! Watching the ranks until they end: the first failure kills the rest
//! after `--grace`, a signal is forwarded and kills `--term-timeout`
//! later, ranks left stopped with nothing else running are a failure,
//! and the end says who failed first.
//!
//! Blame goes to the first failure in time, with two corrections: a rank
//! that said it fails because a peer failed first (its note, see
//! [`super::notes`]) yields to any rank that did not; and a rank killed
//! by a signal, reaped shortly after, takes it from an exit (its peers
//! can see the broken link before the launcher reaps the killed one). A
//! panic is no evidence either way: `.unwrap()` on the error a peer's
//! death gave is the commonest panic there is.

use std::collections::HashSet;
use std::process::{Child, ExitCode, ExitStatus};
use std::time::{Duration, Instant};

use super::nodes::Cluster;
use super::notes::{Notes, group_of};
use super::signals;
use super::tree::Table;
use super::watchdog::Watchdog;

/// How long after the first failure a rank killed by a signal still takes
/// the blame from it: its peers see the broken link and exit with an
/// error before the kernel has torn the killed process down and the
/// launcher can reap it.
pub(super) const BLAME_SETTLE: Duration = Duration::from_millis(500);

/// The exit code of a Rust program whose main thread panicked.
const PANIC_EXIT: i32 = 101;

/// How the ranks ended.
pub(super) struct End {
    /// The first rank to fail, and how.
    failed: Option<(u32, String)>,
    /// When `failed` was set, and how hard that rank failed.
    failed_at: Option<(Instant, Severity)>,
    /// Ranks that said they fail because a peer failed first.
    consequences: HashSet<u32>,
    /// The job failed on another host first, and how.
    elsewhere: Option<String>,
    /// A signal the launcher received and forwarded.
    pub(super) signal: Option<i32>,
    /// How the others ended after that.
    after: Vec<String>,
}

/// How a rank failed: of ranks failing at about the same time, one killed
/// by a signal is the likelier cause (nothing in the job kills a rank
/// before the launcher does, and the launcher records its own kills apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Severity {
    /// An exit with an error status, a panic's included.
    Exited,
    /// Killed by a signal.
    Killed,
}

fn severity(status: &ExitStatus) -> Severity {
    if killed_by_signal(status) {
        Severity::Killed
    } else {
        Severity::Exited
    }
}

impl End {
    pub(super) fn new() -> End {
        End {
            failed: None,
            failed_at: None,
            consequences: HashSet::new(),
            elsewhere: None,
            signal: None,
            after: Vec::new(),
        }
    }

    /// Say how the job ended. A signal before any failure exits the
    /// shell's way (128 + signal); a failure stays the job's outcome even
    /// when a signal came during the grace after it.
    pub(super) fn report(&self) -> ExitCode {
        let rest = if self.after.is_empty() {
            String::new()
        } else {
            format!("; then {}", self.after.join(", "))
        };
        if let Some(why) = &self.elsewhere {
            eprintln!(
                "ferrocoll launch: the job failed on another host ({why}): stopped this host's ranks{rest}"
            );
            return ExitCode::from(1);
        }
        match (&self.failed, self.signal) {
            (Some((rank, why)), Some(signal)) => {
                eprintln!(
                    "ferrocoll launch: rank {rank} failed first ({why}); then interrupted by {}: \
                     forwarded to every rank{rest}",
                    signals::name(signal)
                );
                ExitCode::from(1)
            }
            (None, Some(signal)) => {
                eprintln!(
                    "ferrocoll launch: interrupted by {}: forwarded to every rank{rest}",
                    signals::name(signal)
                );
                ExitCode::from(128u8.saturating_add(signal.clamp(0, 127) as u8))
            }
            (Some((rank, why)), None) => {
                eprintln!("ferrocoll launch: rank {rank} failed first ({why}){rest}");
                ExitCode::from(1)
            }
            (None, None) => ExitCode::SUCCESS,
        }
    }

    /// Note that `rank` said it fails because a peer failed first.
    pub(super) fn consequence(&mut self, rank: u32) {
        self.consequences.insert(rank);
    }

    /// Note how one rank ended.
    pub(super) fn record(&mut self, rank: u32, status: ExitStatus) {
        let how = severity(&status);
        let ours = self.signal.is_none() && self.elsewhere.is_none();
        if ours && !status.success() && self.takes_blame(rank, how) {
            if let Some((first, why)) = self.failed.take() {
                self.after.insert(0, format!("rank {first} {why}"));
            }
            self.failed = Some((rank, describe(&status)));
            self.failed_at = Some((Instant::now(), how));
        } else if self.failed.is_some() || self.signal.is_some() || self.elsewhere.is_some() {
            self.after.push(if status.success() {
                format!("rank {rank} exited cleanly")
            } else if self.consequences.contains(&rank) {
                format!("rank {rank} {} (a peer had failed)", describe(&status))
            } else {
                format!("rank {rank} {}", describe(&status))
            });
        }
    }

    /// A failure that is not an exit (the launcher could not wait for a
    /// rank, or stopped one that could not go on).
    fn fail(&mut self, rank: u32, why: String) {
        if self.failed.is_none() {
            self.failed = Some((rank, why));
            self.failed_at = Some((Instant::now(), Severity::Killed));
        } else {
            self.after.push(format!("rank {rank} {why}"));
        }
    }

    /// Whether `rank`, which just failed this hard, is the one to name: the
    /// first failure; a cause after a named consequence; or a kill reaped
    /// shortly after an exit.
    fn takes_blame(&self, rank: u32, how: Severity) -> bool {
        let Some((first, _)) = &self.failed else {
            return true;
        };
        if self.consequences.contains(&rank) {
            return false;
        }
        if self.consequences.contains(first) {
            return true;
        }
        match self.failed_at {
            None => false,
            Some((at, first)) => how > first && at.elapsed() < BLAME_SETTLE,
        }
    }
}

/// An exit status in words ("exit status: 101 (panicked)").
fn describe(status: &ExitStatus) -> String {
    if status.code() == Some(PANIC_EXIT) {
        format!("{status} (panicked)")
    } else {
        status.to_string()
    }
}

/// The supervision's timing: grace after a failure, and the time allowed
/// after a forwarded signal (and to ranks left stopped alone).
pub(super) struct Timing {
    pub grace: Duration,
    pub term_timeout: Duration,
    /// With flight-recorder dumps on (`FERROCOLL_TRACE_DIR`): how long
    /// the ranks about to be killed get to write theirs after a SIGUSR1.
    pub dump_wait: Option<Duration>,
}

/// What the supervision keeps informed and reads besides the ranks.
pub(super) struct Watchers<'a> {
    /// Told each rank's group before the rank is reaped.
    pub watchdog: Option<&'a mut Watchdog>,
    /// The ranks' notes of failing after a peer.
    pub notes: Option<Notes>,
    /// The launchers of the job's other hosts.
    pub cluster: Option<&'a Cluster>,
}

impl Watchers<'_> {
    /// Tell the other hosts' launchers of this host's first failure, and
    /// learn of theirs: whichever came first is the job's.
    fn exchange(&self, end: &mut End) {
        let Some(cluster) = self.cluster else { return };
        if let Some((rank, why)) = &end.failed {
            if end.elsewhere.is_none() {
                cluster.report_failure(&format!("rank {rank} failed first ({why})"));
            }
        } else if end.elsewhere.is_none()
            && end.signal.is_none()
            && let Some(why) = cluster.failed_elsewhere()
        {
            end.elsewhere = Some(why);
        }
    }

    /// A rank's process group is about to be reaped with its rank.
    fn forget(&mut self, group: u32) {
        if let Some(w) = self.watchdog.as_deref_mut() {
            w.forget(group);
        }
    }

    /// Mark the ranks that noted they fail after a peer.
    fn read_notes(&self, running: &[(u32, Child)], end: &mut End) {
        let Some(notes) = &self.notes else { return };
        for pid in notes.consequences() {
            let group = group_of(pid);
            if let Some((rank, _)) = running
                .iter()
                .find(|(_, c)| c.id() == pid || Some(c.id()) == group)
            {
                end.consequence(*rank);
            }
        }
    }
}

/// Wait for every rank. The first failure kills the rest after `grace`;
/// a signal is forwarded to every rank, which are killed `term_timeout`
/// later (at once on a second signal); ranks left stopped (SIGSTOP) once
/// some rank has ended, with none running, are killed `term_timeout`
/// later as a failure.
pub(super) fn supervise(
    children: Vec<(u32, Child)>,
    timing: &Timing,
    mut watchers: Watchers<'_>,
) -> End {
    let mut end = End::new();
    let mut kill_at: Option<Instant> = None;
    let mut forwarded = 0u32;
    let total = children.len();
    let mut running: Vec<(u32, Child)> = children;
    let mut stopped_since: Option<Instant> = None;
    let mut looks = 0u64;
    let mut asked_for_dumps = false;
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
                Instant::now() + timing.term_timeout
            };
            kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
        }
        watchers.read_notes(&running, &mut end);
        running = reap(running, &mut end, &mut watchers);
        watchers.exchange(&mut end);
        if end.failed.is_some() && kill_at.is_none() {
            kill_at = Some(Instant::now() + timing.grace);
        }
        if end.elsewhere.is_some() && kill_at.is_none() {
            // The ranks here learn of it from their own links soon; give
            // them the grace to say so themselves.
            kill_at = Some(Instant::now() + timing.grace);
        }
        // Reading the process table is a few hundred small files: not
        // on every 5 ms turn.
        looks += 1;
        if looks % 20 == 0 {
            stopped_since = alone_and_stopped(&running, total, stopped_since);
        }
        if let Some(since) = stopped_since
            && since.elapsed() >= timing.term_timeout
        {
            for (rank, _) in &running {
                end.fail(
                    *rank,
                    "stayed stopped (SIGSTOP) after the other ranks ended".into(),
                );
            }
            kill_at = Some(Instant::now());
        }
        if kill_at.is_some_and(|at| Instant::now() >= at) {
            // A rank killed unasked leaves no dump, and the survivors of a
            // hang are the ranks whose dumps say where it stalled.
            if let Some(wait) = timing.dump_wait.filter(|_| !asked_for_dumps) {
                asked_for_dumps = true;
                for (_, child) in &running {
                    #[cfg(unix)]
                    signals::send(child.id(), libc::SIGUSR1);
                }
                kill_at = Some(Instant::now() + wait);
                continue;
            }
            for (rank, child) in &mut running {
                stop(child);
                end.after.push(format!("rank {rank} killed"));
            }
            for (_, child) in &mut running {
                watchers.forget(child.id());
                let _ = child.wait();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    end
}

/// Kill a rank and everything in its process group.
pub(super) fn stop(child: &mut Child) {
    #[cfg(unix)]
    signals::send_group(child.id(), libc::SIGKILL);
    let _ = child.kill();
}

/// Since when every rank still running has been stopped by a signal,
/// once some rank has ended (`None` otherwise): such ranks wait for a
/// SIGCONT that nothing in the job will send. A rank counts as stopped
/// when its whole tree waits on a stop (a wrapper shell waiting on its
/// stopped child is as stuck as a stopped rank).
fn alone_and_stopped(
    running: &[(u32, Child)],
    total: usize,
    since: Option<Instant>,
) -> Option<Instant> {
    if running.len() == total || running.is_empty() {
        return None;
    }
    let table = Table::read();
    let all_stopped = running.iter().all(|(_, c)| table.stuck_stopped(c.id()));
    all_stopped.then(|| since.unwrap_or_else(Instant::now))
}

/// Collect the ranks that ended since the last look; keep the rest.
fn reap(
    running: Vec<(u32, Child)>,
    end: &mut End,
    watchers: &mut Watchers<'_>,
) -> Vec<(u32, Child)> {
    let mut still = Vec::new();
    let mut ended = Vec::new();
    for (rank, mut child) in running {
        // The job ends when its ranks do: what a rank left running in its
        // process group (a shell's `cmd &`, holding the rank's pipes)
        // goes with it — killed, and the watchdog told to forget the
        // group, while the rank is still unreaped, so its group's id
        // cannot have been reused. Only a rank seen exited is reaped.
        if !exited_unreaped(child.id()) {
            still.push((rank, child));
            continue;
        }
        #[cfg(unix)]
        signals::send_group(child.id(), libc::SIGKILL);
        watchers.forget(child.id());
        match child.try_wait() {
            Ok(Some(status)) => ended.push((rank, status)),
            Ok(None) => still.push((rank, child)),
            Err(e) => end.fail(rank, e.to_string()),
        }
    }
    // Of ranks that ended since the last look, the hardest failure is the
    // likelier cause: its peers exit with errors right after.
    ended.sort_by_key(|(_, status)| std::cmp::Reverse(severity(status)));
    for (rank, status) in ended {
        end.record(rank, status);
    }
    still
}

/// Whether the child `pid` has exited, without reaping it.
#[cfg(unix)]
fn exited_unreaped(pid: u32) -> bool {
    let id: libc::id_t = pid;
    // SAFETY: a zeroed siginfo for the kernel to fill; WNOWAIT leaves the
    // child waitable, so `Child::try_wait` still reaps it.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            id,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        rc == 0 && info.si_pid() != 0
    }
}

#[cfg(not(unix))]
fn exited_unreaped(_pid: u32) -> bool {
    true
}

fn killed_by_signal(status: &ExitStatus) -> bool {
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

    const EXIT_2: i32 = 2 << 8;
    const PANICKED: i32 = PANIC_EXIT << 8;
    const SIGKILL: i32 = 9;

    #[test]
    fn a_killed_rank_reaped_just_after_its_peers_error_takes_the_blame() {
        let mut end = End::new();
        end.record(0, ExitStatus::from_raw(EXIT_2));
        end.record(2, ExitStatus::from_raw(SIGKILL));
        end.record(1, ExitStatus::from_raw(EXIT_2));
        assert_eq!(end.failed.as_ref().unwrap().0, 2);
        assert_eq!(end.after.len(), 2);
        assert!(end.after[0].starts_with("rank 0 "), "{:?}", end.after);
    }

    #[test]
    fn a_panicking_rank_reaped_after_the_survivors_it_failed_takes_the_blame() {
        // The survivors report the panic and exit before the panicking
        // rank has finished unwinding; their notes say they followed a
        // peer, so the panicking rank is named when it is reaped.
        let mut end = End::new();
        end.consequence(1);
        end.consequence(3);
        end.record(1, ExitStatus::from_raw(EXIT_2));
        end.record(3, ExitStatus::from_raw(EXIT_2));
        end.record(0, ExitStatus::from_raw(PANICKED));
        let (rank, why) = end.failed.clone().unwrap();
        assert_eq!(rank, 0);
        assert!(why.contains("panicked"), "{why}");
        assert!(end.after.iter().any(|a| a.contains("a peer had failed")));
        // A kill reaped within the settle time still outranks it.
        end.record(2, ExitStatus::from_raw(SIGKILL));
        assert_eq!(end.failed.as_ref().unwrap().0, 2);
    }

    #[test]
    fn survivors_that_unwrap_a_peers_failure_do_not_take_the_blame() {
        // R1: the culprit exits with an error; the survivors `.unwrap()`
        // the PeerFailed it gave them and exit 101 moments later. Before,
        // a panic outranked an error and a survivor was named.
        for noted in [false, true] {
            let mut end = End::new();
            end.record(1, ExitStatus::from_raw(3 << 8));
            for survivor in [0, 2] {
                if noted {
                    end.consequence(survivor);
                }
                end.record(survivor, ExitStatus::from_raw(PANICKED));
            }
            assert_eq!(end.failed.as_ref().unwrap().0, 1, "noted={noted}");
        }
    }

    #[test]
    fn a_first_error_stands_once_the_settle_time_is_over() {
        let mut end = End::new();
        end.record(0, ExitStatus::from_raw(EXIT_2));
        end.failed_at = Some((Instant::now() - BLAME_SETTLE, Severity::Exited));
        end.record(2, ExitStatus::from_raw(SIGKILL));
        assert_eq!(end.failed.as_ref().unwrap().0, 0);
    }

    #[test]
    fn a_first_kill_is_never_replaced() {
        let mut end = End::new();
        end.record(3, ExitStatus::from_raw(SIGKILL));
        end.record(1, ExitStatus::from_raw(SIGKILL));
        end.record(0, ExitStatus::from_raw(0));
        assert_eq!(end.failed.as_ref().unwrap().0, 3);
        assert_eq!(end.after.len(), 2);
    }

    #[test]
    fn a_signal_during_the_grace_keeps_the_first_failure() {
        // Before: Ctrl-C while the others had their grace replaced the
        // failure with "interrupted" and exit 130.
        let mut end = End::new();
        end.record(2, ExitStatus::from_raw(EXIT_2));
        end.signal = Some(libc::SIGINT);
        end.record(0, ExitStatus::from_raw(SIGKILL));
        assert_eq!(end.failed.as_ref().unwrap().0, 2);
        assert_eq!(end.report(), ExitCode::from(1));
        let mut interrupted = End::new();
        interrupted.signal = Some(libc::SIGINT);
        assert_eq!(interrupted.report(), ExitCode::from(130));
    }
}
