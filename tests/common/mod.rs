//! Helpers the CLI's tests share: finding a job's processes by its
//! secret, telling live processes from zombies, and scratch folders.

// Each test binary uses a part of these.
#![allow(dead_code)]

/// Whether `pid` is alive (a zombie is not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// A secret no other test's processes carry.
pub fn unique_secret() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("cli-launch-{}-{nanos}", std::process::id())
}

/// Live processes whose environment holds the job secret `secret` (the
/// launcher passes the caller's on to every rank and ranks' children).
pub fn processes_with(secret: &str) -> Vec<u32> {
    let needle = format!("FERROCOLL_JOB_SECRET={secret}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| alive(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == needle.as_bytes()))
        })
        .collect()
}

/// A TCP port free on the loopback interface right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Wait up to `within` for `child` to end; `None` (after killing it)
/// if it did not.
pub fn wait_within(
    child: &mut std::process::Child,
    within: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The pids and job id `launch` prints on its first line.
pub fn launch_banner(line: &str) -> (Vec<u32>, String) {
    let pids = line
        .split("pids ")
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|p| p.split('=').nth(1)?.parse().ok())
        .collect();
    let job = line
        .split("job ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or("")
        .to_owned();
    (pids, job)
}

/// `ferrocoll launch ARGS` with the job secret `secret`, its output to
/// nowhere but the launcher's first line (the banner), which is read.
pub fn launch_with_banner(args: &[&str], secret: &str) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .arg("launch")
        .args(args)
        .env("FERROCOLL_JOB_SECRET", secret)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    std::io::BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    (child, banner)
}

/// A launcher that a failed assertion must not leave running: dropped
/// while it still runs, it gets SIGTERM (which ends its ranks) and is
/// reaped.
pub struct Stopped(pub std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &self.0.id().to_string()])
                .status();
            let _ = self.0.wait();
        }
    }
}

/// A fresh folder for one test's files, removed when the test ends
/// (passing or not).
pub struct Scratch(pub std::path::PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ferrocoll-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn file(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}
