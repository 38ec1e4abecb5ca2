//! Where `libnccl.so.2` may be: the places a user or a tool names, the
//! dynamic loader's own search, CUDA and conda installs, and the NCCL
//! Python wheel (`nvidia-nccl-cu*`, which ships only the shared library
//! under `nvidia/nccl/lib`) in whatever Python environment is on `PATH` —
//! activated or not, so each `python3` found is asked where its
//! `nvidia.nccl` and its site-packages are.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A Python asked where NCCL lives gets this long to answer.
const PYTHON_PATIENCE: Duration = Duration::from_secs(5);

/// All the Pythons on `PATH` together get this long: a `PATH` of many
/// slow interpreters (twelve once took a minute) costs no more.
const SEARCH_PATIENCE: Duration = Duration::from_secs(8);

/// The most of a Python's answer read: a few folder names. One that
/// floods its output is cut off here (one once took `info` to 2.8 GB).
const MAX_ANSWER_BYTES: u64 = 64 << 10;

/// What each Python prints: the `lib` folder of its `nvidia.nccl`
/// (importing the package, wherever it is installed), then that folder
/// under each of its site-packages, one per line.
const ASK_PYTHON: &str = "\
import site
dirs = []
try:
    import nvidia.nccl as m
    dirs += [p + '/lib' for p in m.__path__]
except Exception:
    pass
try:
    dirs += [p + '/nvidia/nccl/lib' for p in site.getsitepackages() + [site.getusersitepackages()]]
except Exception:
    pass
print('\\n'.join(dirs))
";

/// Every candidate, in order (duplicates dropped): [`fixed_candidates`],
/// then the answers of every Python on `PATH` ([`from_pythons`]).
pub fn candidates() -> Vec<PathBuf> {
    let mut out = fixed_candidates();
    if let Some(path) = std::env::var_os("PATH") {
        out.extend(from_pythons(&path));
    }
    dedup(out)
}

/// The candidates that need no Python: `FERROCOLL_NCCL_LIB` and
/// `NCCL_LIBRARY` (files), the bare names (so `LD_LIBRARY_PATH` and the
/// loader's cache apply), `CUDA_HOME` / `CUDA_PATH`, `CONDA_PREFIX`, the
/// usual system folders, and the wheel under the usual site-packages
/// roots.
pub fn fixed_candidates() -> Vec<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let mut out: Vec<PathBuf> = Vec::new();
    for k in ["FERROCOLL_NCCL_LIB", "NCCL_LIBRARY"] {
        out.extend(var(k).map(PathBuf::from));
    }
    out.push(PathBuf::from("libnccl.so.2"));
    out.push(PathBuf::from("libnccl.so"));
    for k in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = var(k) {
            for lib in ["lib64", "lib"] {
                out.push(Path::new(&root).join(lib).join("libnccl.so.2"));
            }
        }
    }
    if let Some(conda) = var("CONDA_PREFIX") {
        out.push(Path::new(&conda).join("lib/libnccl.so.2"));
    }
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/local/cuda/lib64",
        "/usr/local/lib",
        "/usr/lib",
    ] {
        out.push(Path::new(dir).join("libnccl.so.2"));
    }
    out.extend(from_site_roots());
    dedup(out)
}

fn dedup(mut out: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| seen.insert(p.clone()));
    out
}

/// What every `python3` and `python` in the absolute folders of `path`
/// (a `PATH` value) says, each interpreter asked once however many names
/// and folders lead to it: `…/nvidia/nccl/lib/libnccl.so.2` for each
/// folder it names.
pub fn from_pythons(path: &OsStr) -> Vec<PathBuf> {
    let mut asked = std::collections::HashSet::new();
    let mut out = Vec::new();
    let until = Instant::now() + SEARCH_PATIENCE;
    for dir in std::env::split_paths(path).filter(|d| d.is_absolute()) {
        for name in ["python3", "python"] {
            let exe = dir.join(name);
            let real = std::fs::canonicalize(&exe).unwrap_or_else(|_| exe.clone());
            let left = until.saturating_duration_since(Instant::now());
            if exe.is_file() && !left.is_zero() && asked.insert(real) {
                let patience = left.min(PYTHON_PATIENCE);
                out.extend(
                    ask(&exe, patience)
                        .into_iter()
                        .map(|d| d.join("libnccl.so.2")),
                );
            }
        }
    }
    // Two interpreters of one installation name the same site folders.
    dedup(out)
}

/// The folders one Python names, or none when it fails, hangs past
/// `patience` or floods its output. It runs isolated (`-I`: no current
/// folder or `PYTHON*` variables on its path, so nothing where the program
/// happens to run is imported) from `/`, leading a process group of its
/// own that is killed when it ends: whatever it forked goes with it. Its
/// answer is read on a helper thread, at most [`MAX_ANSWER_BYTES`], so a
/// child that leaves the pipe open cannot block the caller past the limit.
fn ask(python: &Path, patience: Duration) -> Vec<PathBuf> {
    let mut command = Command::new(python);
    command
        .args(["-I", "-c", ASK_PYTHON])
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let Ok(mut child) = command.spawn() else {
        return Vec::new();
    };
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let read = std::io::Read::read_to_end(
                &mut std::io::Read::take(stdout, MAX_ANSWER_BYTES + 1),
                &mut bytes,
            );
            // Past the cap: no answer (and the pipe closes on it).
            let whole = read.is_ok() && bytes.len() as u64 <= MAX_ANSWER_BYTES;
            let _ = tx.send(whole.then_some(bytes));
        });
    }
    let until = Instant::now() + patience;
    let ok = loop {
        if exited(&child) || Instant::now() >= until {
            // Its group first, while it is unreaped (its id not reusable).
            kill_group(&child);
            break child.wait().is_ok_and(|s| s.success());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let left = until.saturating_duration_since(Instant::now());
    match rx.recv_timeout(left.max(Duration::from_millis(100))) {
        Ok(Some(bytes)) if ok => bytes
            .split(|&b| b == b'\n')
            .map(path_of)
            .filter(|p| p.is_absolute())
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether `child` has exited, without reaping it.
#[cfg(unix)]
fn exited(child: &std::process::Child) -> bool {
    // SAFETY: a zeroed siginfo for the kernel to fill; WNOWAIT leaves the
    // child to be reaped by `Child::wait`.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            child.id() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        rc != 0 || info.si_pid() != 0
    }
}

#[cfg(not(unix))]
fn exited(child: &std::process::Child) -> bool {
    let _ = child;
    true
}

/// Kill `child`'s process group (it leads one), itself included.
fn kill_group(child: &std::process::Child) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: signalling the group this search created for the child.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
}

/// A line of the answer as a path, whatever its bytes.
fn path_of(line: &[u8]) -> PathBuf {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        PathBuf::from(OsStr::from_bytes(line))
    }
    #[cfg(not(unix))]
    PathBuf::from(String::from_utf8_lossy(line).trim())
}

/// The wheel under `VIRTUAL_ENV`, `~/.local`, `/usr/local` and `/usr`
/// (`lib/python3*/{site,dist}-packages`), for Pythons not on `PATH`.
fn from_site_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        roots.push(Path::new(&venv).join("lib"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(Path::new(&home).join(".local/lib"));
    }
    roots.extend(["/usr/local/lib", "/usr/lib"].map(PathBuf::from));
    let mut out = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for py in pythons {
            for site in ["site-packages", "dist-packages"] {
                out.push(py.join(site).join("nvidia/nccl/lib/libnccl.so.2"));
            }
        }
    }
    out
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The tests write scripts and run them: while one test's script is
    /// still open for writing, a process another test forks inherits the
    /// descriptor, and running the script fails with "text file busy" (a
    /// flake under load). One test at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fake `python3` in a fresh folder, running `body` as a shell script.
    fn fake_python(tag: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nccl-search-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("python3");
        std::fs::write(&exe, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    #[test]
    fn a_python_on_path_is_asked_where_its_wheel_is() {
        let _serial = serial();
        let dir = fake_python(
            "answers",
            "echo /opt/env/lib/python3.11/site-packages/nvidia/nccl/lib; echo not-a-path",
        );
        let path = std::env::join_paths([Path::new("/nonexistent"), &dir]).unwrap();
        let found = from_pythons(&path);
        assert_eq!(
            found,
            [PathBuf::from(
                "/opt/env/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"
            )]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_failing_or_hanging_python_names_nothing() {
        let _serial = serial();
        let failing = fake_python("fails", "echo /x; exit 3");
        assert!(from_pythons(failing.as_os_str()).is_empty());
        // A relative folder on PATH is never searched.
        assert!(from_pythons(OsStr::new("relative/bin:.")).is_empty());
        let hanging = fake_python("hangs", "exec sleep 60");
        let started = Instant::now();
        assert!(from_pythons(hanging.as_os_str()).is_empty());
        assert!(started.elapsed() < PYTHON_PATIENCE + Duration::from_secs(5));
        for d in [failing, hanging] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn a_python_that_floods_its_output_is_cut_off() {
        let _serial = serial();
        // Before: read to the end, gigabytes of it.
        let flooding = fake_python("floods", "exec yes /opt/env/nvidia/nccl/lib");
        let started = Instant::now();
        assert!(from_pythons(flooding.as_os_str()).is_empty());
        assert!(started.elapsed() < PYTHON_PATIENCE + Duration::from_secs(5));
        std::fs::remove_dir_all(flooding).unwrap();
    }

    #[test]
    fn many_slow_pythons_cost_the_search_its_patience_once() {
        let _serial = serial();
        // Before: twelve of them took a minute.
        let dirs: Vec<PathBuf> = (0..12)
            .map(|i| fake_python(&format!("slow{i}"), "exec sleep 60"))
            .collect();
        let path = std::env::join_paths(&dirs).unwrap();
        let started = Instant::now();
        assert!(from_pythons(&path).is_empty());
        assert!(
            started.elapsed() < SEARCH_PATIENCE + Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        for d in dirs {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn what_a_python_forks_does_not_outlive_the_question() {
        let _serial = serial();
        // Before: the background child stayed behind.
        let dir = std::env::temp_dir().join(format!("nccl-search-{}-forks", std::process::id()));
        let marker = dir.join("child.pid");
        let forking = fake_python(
            "forks",
            &format!("sleep 300 & echo $! > {}; echo /opt/x", marker.display()),
        );
        let _ = from_pythons(forking.as_os_str());
        let pid: u32 = std::fs::read_to_string(&marker)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while running(pid) {
            assert!(
                Instant::now() < deadline,
                "the forked child {pid} still runs"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::remove_dir_all(forking).unwrap();
    }

    /// Whether `pid` runs (a zombie does not).
    fn running(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    /// The real Python of this machine, if any, answers without error (the
    /// wheel need not be installed: site-packages are named either way).
    #[test]
    fn the_query_runs_in_a_real_python() {
        let _serial = serial();
        let Some(path) = std::env::var_os("PATH") else {
            return;
        };
        for p in from_pythons(&path) {
            assert!(
                p.ends_with("nvidia/nccl/lib/libnccl.so.2"),
                "{}",
                p.display()
            );
        }
    }
}
