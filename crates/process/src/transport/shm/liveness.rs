//! Whether another process on this host is still running.

/// `false` once process `pid` has exited (zombies count as exited: a
/// killed rank whose parent has not reaped it yet is just as gone).
pub(crate) fn alive(pid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // The state letter follows the command name's closing paren.
            Ok(stat) => !matches!(
                stat.rfind(')')
                    .and_then(|i| stat[i + 1..].trim_start().chars().next()),
                Some('Z' | 'X' | 'x')
            ),
            Err(_) => false,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        // SAFETY: signal 0 only checks that the process exists.
        let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
        rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        assert!(super::alive(std::process::id()));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait");
        assert!(!super::alive(pid));
    }

    #[test]
    fn an_unreaped_dead_child_is_not_alive() {
        let child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while super::alive(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!super::alive(pid), "a zombie must count as gone");
        drop(child);
    }
}
