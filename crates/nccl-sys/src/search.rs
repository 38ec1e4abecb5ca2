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
    for dir in std::env::split_paths(path).filter(|d| d.is_absolute()) {
        for name in ["python3", "python"] {
            let exe = dir.join(name);
            let real = std::fs::canonicalize(&exe).unwrap_or_else(|_| exe.clone());
            if exe.is_file() && asked.insert(real) {
                out.extend(ask(&exe).into_iter().map(|d| d.join("libnccl.so.2")));
            }
        }
    }
    // Two interpreters of one installation name the same site folders.
    dedup(out)
}

/// The folders one Python names, or none when it fails or hangs. It runs
/// isolated (`-I`: no current folder or `PYTHON*` variables on its path,
/// so nothing where the program happens to run is imported) from `/`;
/// its answer is read on a helper thread, so a child that leaves the pipe
/// open behind it cannot block the caller past the limit.
fn ask(python: &Path) -> Vec<PathBuf> {
    let Ok(mut child) = Command::new(python)
        .args(["-I", "-c", ASK_PYTHON])
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        return Vec::new();
    };
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(mut stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = std::io::Read::read_to_end(&mut stdout, &mut bytes);
            let _ = tx.send(bytes);
        });
    }
    let until = Instant::now() + PYTHON_PATIENCE;
    let ok = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status.success(),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
        }
    };
    let left = until.saturating_duration_since(Instant::now());
    match rx.recv_timeout(left.max(Duration::from_millis(100))) {
        Ok(bytes) if ok => bytes
            .split(|&b| b == b'\n')
            .map(path_of)
            .filter(|p| p.is_absolute())
            .collect(),
        _ => Vec::new(),
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
