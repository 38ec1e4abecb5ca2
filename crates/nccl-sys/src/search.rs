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

/// Every candidate, in order (duplicates dropped): `FERROCOLL_NCCL_LIB`
/// and `NCCL_LIBRARY` (files), the bare names (so `LD_LIBRARY_PATH` and
/// the loader's cache apply), `CUDA_HOME` / `CUDA_PATH`, `CONDA_PREFIX`,
/// the answers of every `python3` and `python` on `PATH`, the usual system
/// folders, and the wheel under the usual site-packages roots.
pub fn candidates() -> Vec<PathBuf> {
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
    if let Some(path) = var("PATH") {
        out.extend(from_pythons(&path));
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
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| seen.insert(p.clone()));
    out
}

/// What every `python3` and `python` on `path` (a `PATH` value) says:
/// `…/nvidia/nccl/lib/libnccl.so.2` for each folder it names.
pub fn from_pythons(path: &OsStr) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in std::env::split_paths(path) {
        for name in ["python3", "python"] {
            let exe = dir.join(name);
            if exe.is_file() {
                out.extend(ask(&exe).into_iter().map(|d| d.join("libnccl.so.2")));
            }
        }
    }
    out
}

/// The folders one Python names, or none when it fails or hangs.
fn ask(python: &Path) -> Vec<PathBuf> {
    let Ok(mut child) = Command::new(python)
        .args(["-c", ASK_PYTHON])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        return Vec::new();
    };
    let until = Instant::now() + PYTHON_PATIENCE;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Vec::new();
            }
        }
    }
    let mut text = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
    }
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('/'))
        .map(PathBuf::from)
        .collect()
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
        let failing = fake_python("fails", "echo /x; exit 3");
        assert!(from_pythons(failing.as_os_str()).is_empty());
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
