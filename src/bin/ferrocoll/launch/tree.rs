//! The launcher's view of everything its ranks started, not only their
//! process groups: a rank's whole tree of descendants (by parent links in
//! `/proc`), and the strays that left their group (`setsid`, a shell's
//! `set -m`) and were orphaned.
//!
//! On Linux the launcher is a child subreaper (`PR_SET_CHILD_SUBREAPER`),
//! so an orphan from anywhere in the job becomes the launcher's child
//! instead of init's: at the end, every process under the launcher but
//! the watchdog is the job's, and is killed. What remains possible: a
//! process that escapes while the launcher itself is SIGKILLed is beyond
//! both the launcher and the watchdog (which kills groups), and a process
//! started through another service (`systemd-run`, `at`) was never a
//! descendant.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One process: its parent and its state letter from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy)]
struct Entry {
    parent: u32,
    state: char,
}

/// A snapshot of the process table (Linux; empty elsewhere).
pub(super) struct Table(HashMap<u32, Entry>);

impl Table {
    pub fn read() -> Table {
        let mut table = HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                    continue;
                };
                if let Some(e) = stat(pid) {
                    table.insert(pid, e);
                }
            }
        }
        Table(table)
    }

    fn children(&self, pid: u32) -> impl Iterator<Item = u32> + '_ {
        self.0
            .iter()
            .filter(move |(_, e)| e.parent == pid)
            .map(|(&p, _)| p)
    }

    /// `root` and everything below it.
    pub fn tree(&self, root: u32) -> Vec<u32> {
        let mut out = vec![root];
        let mut at = 0;
        while at < out.len() {
            let next: Vec<u32> = self.children(out[at]).collect();
            out.extend(next);
            at += 1;
        }
        out
    }

    /// Whether the tree under `root` waits on a stop nothing in the job
    /// will end: some process is stopped (SIGSTOP, state `T`), and every
    /// process that is not has only such waiting processes below it (a
    /// shell waiting on its stopped child). A sleeping leaf (a read, a
    /// sleep) may still move, so it is not stuck.
    pub fn stuck_stopped(&self, root: u32) -> bool {
        self.0.contains_key(&root) && self.waits_on_stop(root)
    }

    fn waits_on_stop(&self, pid: u32) -> bool {
        match self.0.get(&pid) {
            None => true,
            Some(e) if e.state == 'T' => true,
            Some(_) => {
                let mut children = self.children(pid).peekable();
                children.peek().is_some() && children.all(|c| self.waits_on_stop(c))
            }
        }
    }
}

/// Parent and state of `pid`, from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<Entry> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself hold spaces or
    // parentheses: the fields start after the last ')'.
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some(Entry { parent, state })
}

/// Make this process the reaper of every orphan below it (Linux).
pub(super) fn become_subreaper() {
    #[cfg(target_os = "linux")]
    // SAFETY: a prctl with integer arguments that changes only this
    // process's reaping; a failure leaves the old behaviour.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// Kill every process below this one but `spare`'s tree, and reap the
/// ones that are (or become) its children, for up to `within`. Returns
/// how many were killed.
pub(super) fn kill_strays(spare: Option<u32>, within: Duration) -> usize {
    let me = std::process::id();
    let until = Instant::now() + within;
    let mut killed = std::collections::HashSet::new();
    loop {
        let table = Table::read();
        let spared = spare.map(|s| table.tree(s)).unwrap_or_default();
        let strays: Vec<u32> = table
            .tree(me)
            .into_iter()
            .filter(|&p| p != me && !spared.contains(&p))
            .collect();
        if strays.is_empty() || Instant::now() >= until {
            return killed.len();
        }
        for &pid in &strays {
            #[cfg(unix)]
            // SAFETY: signalling a process found below this one; the
            // table was read just now, and a reaped child's pid cannot be
            // reused while it is still our unreaped child.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            if table.0.get(&pid).is_some_and(|e| e.state != 'Z') {
                killed.insert(pid);
            }
        }
        reap_children(&table, me, &spared);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reap this process's dead children other than the spared ones.
fn reap_children(table: &Table, me: u32, spared: &[u32]) {
    for pid in table.children(me).filter(|p| !spared.contains(p)) {
        #[cfg(unix)]
        // SAFETY: waitpid on a specific child, without blocking.
        unsafe {
            libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG);
        }
        #[cfg(not(unix))]
        let _ = pid;
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_shell_waiting_on_its_stopped_child_is_stuck_and_a_sleeper_is_not() {
        let mut shell = Command::new("sh")
            .args(["-c", "sh -c 'kill -STOP $$'; true"])
            .spawn()
            .unwrap();
        let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Table::read().stuck_stopped(shell.id()) {
            assert!(Instant::now() < deadline, "never seen stuck");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!Table::read().stuck_stopped(sleeper.id()));
        for child in Table::read().tree(shell.id()) {
            // SAFETY: killing our own test's processes.
            unsafe { libc::kill(child as libc::pid_t, libc::SIGKILL) };
        }
        shell.wait().unwrap();
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
    }
}
