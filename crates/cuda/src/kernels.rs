//! The device interpreter's source and its compilation: the generated
//! records header (`cuda/records.h`), `cuda/elements.cuh` and
//! `cuda/interpret.cu`, with one entry point per (op, type) appended.
//! On a GPU each entry point is its own module, compiled by NVRTC on its
//! first use for the device's own architecture to a cubin (no JIT when it
//! loads) — a second or two, where all forty take a minute — kept per
//! process and, given a folder, on disk, keyed by the source (with the
//! entry), the options, the architecture and the driver's CUDA major
//! version (a cubin loads on any driver of its major), so the processes of
//! a job compile each once — and a cache filled where there is no GPU
//! ([`precompile`], `ferrocoll info --compile-kernels sm_90`) serves a GPU
//! machine that has the same source.
//!
//! NVRTC needs `cuda_fp16.h` and `cuda_bf16.h`. They are found, in order,
//! in `FERROCOLL_CUDA_INCLUDE`, `$CUDA_HOME/include`, `$CUDA_PATH/include`,
//! `/usr/local/cuda/include`, and the `nvidia/cu13/include` folder of the
//! NVIDIA runtime Python wheels under the usual site-packages roots. They
//! are not vendored: NVIDIA's licence for them allows redistribution only
//! with an application built on CUDA, and every machine that runs kernels
//! has a CUDA install or the wheels anyway.

use std::collections::HashMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use ferrocoll_core::{DataType, ReduceOp};

use crate::error::CudaError;
use crate::probe;
use crate::program::abi;

/// How the interpreter combines elements.
pub const ELEMENTS: &str = include_str!("../../../cuda/elements.cuh");

/// The interpreter itself.
pub const INTERPRETER: &str = include_str!("../../../cuda/interpret.cu");

/// The source NVRTC compiles for `entries`: the records header, the
/// elements, the interpreter, and one `FC_ENTRY` line per entry point.
pub fn source_for(entries: &[(DataType, ReduceOp)]) -> String {
    let mut text = format!("{}\n{ELEMENTS}\n{INTERPRETER}\n", abi::header());
    for &(t, op) in entries {
        let (name, functor) = op_names(op);
        text.push_str(&format!(
            "FC_ENTRY({name}, {functor}, {}, {})\n",
            type_suffix(t),
            c_type(t)
        ));
    }
    text
}

/// The source with every entry point (the tests' host build, and the
/// compile test).
pub fn source() -> String {
    source_for(&entries())
}

/// Every (type, op) with an entry point of its own (avg shares the sum's).
pub fn entries() -> Vec<(DataType, ReduceOp)> {
    let mut out = Vec::new();
    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
        for t in DataType::ALL {
            out.push((t, op));
        }
    }
    out
}

/// A type's name in CUDA C.
fn c_type(t: DataType) -> &'static str {
    match t {
        DataType::I8 => "signed char",
        DataType::U8 => "unsigned char",
        DataType::I32 => "int",
        DataType::U32 => "unsigned int",
        DataType::I64 => "long long",
        DataType::U64 => "unsigned long long",
        DataType::F16 => "__half",
        DataType::Bf16 => "__nv_bfloat16",
        DataType::F32 => "float",
        DataType::F64 => "double",
    }
}

/// An op's entry-point name and its functor in `cuda/elements.cuh`.
fn op_names(op: ReduceOp) -> (&'static str, &'static str) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => ("sum", "Sum"),
        ReduceOp::Prod => ("prod", "Prod"),
        ReduceOp::Min => ("min", "Min"),
        ReduceOp::Max => ("max", "Max"),
    }
}

/// The kernel name suffix of a type.
pub fn type_suffix(t: DataType) -> &'static str {
    match t {
        DataType::I8 => "i8",
        DataType::U8 => "u8",
        DataType::I32 => "i32",
        DataType::U32 => "u32",
        DataType::I64 => "i64",
        DataType::U64 => "u64",
        DataType::F16 => "f16",
        DataType::Bf16 => "bf16",
        DataType::F32 => "f32",
        DataType::F64 => "f64",
    }
}

/// The interpreter's entry point for a type and op (`avg` runs the sum
/// and divides at the end).
pub fn interpreter_kernel(t: DataType, op: ReduceOp) -> String {
    format!("ferrocoll_run_{}_{}", op_names(op).0, type_suffix(t))
}

/// The interpreter's entry points: one per (op, type).
pub fn interpreter_kernels() -> Vec<String> {
    entries()
        .into_iter()
        .map(|(t, op)| interpreter_kernel(t, op))
        .collect()
}

/// Folders holding `cuda_fp16.h`, in search order.
pub fn include_dirs() -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(dirs) = std::env::var("FERROCOLL_CUDA_INCLUDE") {
        candidates.extend(std::env::split_paths(&dirs));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(root) = std::env::var(var) {
            candidates.push(Path::new(&root).join("include"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(venv) = std::env::var("VIRTUAL_ENV") {
        roots.push(Path::new(&venv).join("lib"));
    }
    if let Ok(home) = std::env::var("HOME") {
        roots.push(Path::new(&home).join(".local/lib"));
    }
    roots.extend(["/usr/local/lib", "/usr/lib"].map(PathBuf::from));
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
                candidates.push(py.join(site).join("nvidia/cu13/include"));
            }
        }
    }
    // CUDA 13 keeps the headers `cuda_fp16.h` includes (`nv/target`) in
    // `include/cccl`.
    let mut found = Vec::new();
    for d in candidates
        .into_iter()
        .filter(|d| d.join("cuda_fp16.h").is_file())
    {
        let cccl = d.join("cccl");
        found.push(d);
        if cccl.is_dir() {
            found.push(cccl);
        }
    }
    found
}

/// The real architecture of a compute capability (`sm_90`), for a cubin.
pub fn arch_name(major: i32, minor: i32) -> Result<String, CudaError> {
    if major * 10 + minor < 75 {
        return Err(CudaError::BackendUnavailable {
            reason: format!(
                "compute capability {major}.{minor}: CUDA 13 supports 7.5 (Turing) and newer"
            ),
        });
    }
    Ok(format!("sm_{major}{minor}"))
}

/// What ptxas reports of one entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resources {
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of stack frame (local memory) per thread.
    pub stack_bytes: u32,
    /// Bytes spilled to local memory (stores).
    pub spill_bytes: u32,
}

/// A compiled module: the cubin, and what ptxas reported per entry point.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The cubin (an ELF image the driver loads without a JIT).
    pub image: Vec<u8>,
    /// By entry point.
    pub resources: HashMap<String, Resources>,
}

/// The interpreter's entry point for `(t, op)` compiled for `arch`
/// (`sm_90`), once per process; with a cache folder, once per machine
/// and version (a corrupt or unreadable entry is compiled again; a cache
/// that cannot be written is skipped).
pub fn entry(
    arch: &str,
    (t, op): (DataType, ReduceOp),
    driver_major: i32,
    cache: Option<&Path>,
) -> Result<Compiled, CudaError> {
    static COMPILED: OnceLock<Mutex<HashMap<(String, String), Compiled>>> = OnceLock::new();
    let map = COMPILED.get_or_init(|| Mutex::new(HashMap::new()));
    let name = interpreter_kernel(t, op);
    let key = (arch.to_owned(), name.clone());
    if let Some(c) = map.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    let source = source_for(&[(t, op)]);
    let hash = cache_key(&source, arch, driver_major);
    let file = cache.map(|dir| dir.join(format!("{name}-{arch}-{hash:016x}.cubin")));
    let compiled = match file.as_deref().and_then(read_cached) {
        Some(c) => c,
        None => {
            let c = compile_source(arch, source)?;
            if let Some(f) = &file {
                write_cached(f, &c);
            }
            c
        }
    };
    map.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, compiled.clone());
    Ok(compiled)
}

/// What a cached cubin depends on: the source (its entry point
/// included), the options, the architecture and the driver's CUDA major
/// version.
fn cache_key(source: &str, arch: &str, driver_major: i32) -> u64 {
    let text = format!("{source}\n{arch}\n{OPTIONS:?}\ndriver {driver_major}");
    // FNV-1a: stable across runs and builds (the std hasher is not).
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The CUDA major version this build's bindings are for (`cuda-13000`):
/// what a cache filled without a GPU is keyed by.
pub const BUILT_FOR_CUDA_MAJOR: i32 = 13;

/// Compile every entry point for `arch` into `cache` (no GPU needed:
/// NVRTC only), several at once; each entry's report, or why it failed.
pub fn precompile(arch: &str, cache: &Path) -> Vec<(String, Result<Resources, CudaError>)> {
    let entries = entries();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..workers.min(entries.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(t, op)) = entries.get(i) else {
                        break;
                    };
                    let name = interpreter_kernel(t, op);
                    let r = entry(arch, (t, op), BUILT_FOR_CUDA_MAJOR, Some(cache))
                        .map(|c| c.resources.get(&name).copied().unwrap_or_default());
                    results
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((i, name, r));
                }
            });
        }
    });
    let mut out = results.into_inner().unwrap_or_else(|e| e.into_inner());
    out.sort_by_key(|r| r.0);
    out.into_iter().map(|(_, n, r)| (n, r)).collect()
}

/// A cubin cached with its ptxas report: the report's length (8 bytes),
/// the report, the image.
fn read_cached(path: &Path) -> Option<Compiled> {
    let bytes = std::fs::read(path).ok()?;
    let (len, rest) = bytes.split_at_checked(8)?;
    let len = usize::try_from(u64::from_le_bytes(len.try_into().ok()?)).ok()?;
    let (log, image) = rest.split_at_checked(len)?;
    let resources = parse_resources(std::str::from_utf8(log).ok()?);
    if image.len() < 4 || &image[..4] != b"\x7fELF" || resources.is_empty() {
        return None;
    }
    tracing::debug!("interpreter module from {}", path.display());
    Some(Compiled {
        image: image.to_vec(),
        resources,
    })
}

fn write_cached(path: &Path, c: &Compiled) {
    let written = (|| -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut create = std::fs::DirBuilder::new();
        create.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut create, 0o700);
        create.create(dir)?;
        let log = report_text(&c.resources);
        let mut bytes = (log.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(log.as_bytes());
        bytes.extend_from_slice(&c.image);
        // Written whole under a name of this process's, then renamed: a
        // reader never sees half a file.
        let tmp = dir.join(format!(
            ".{}.{}",
            path.file_name()
                .map_or("cubin".into(), |n| n.to_string_lossy()),
            std::process::id()
        ));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        std::io::Write::write_all(&mut options.open(&tmp)?, &bytes)?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        tracing::debug!("not caching the interpreter at {}: {e}", path.display());
    }
}

/// The compile options (part of the cache key).
const OPTIONS: [&str; 2] = ["--std=c++17", "--ptxas-options=-v"];

/// Compile every entry point for `arch` now, in one module (no cache):
/// what the tests call for `sm_80` and `sm_90` without a GPU.
pub fn compile(arch: &str) -> Result<Compiled, CudaError> {
    compile_source(arch, source())
}

fn compile_source(arch: &str, source: String) -> Result<Compiled, CudaError> {
    if !probe::nvrtc_present() {
        return Err(CudaError::BackendUnavailable {
            reason: "libnvrtc is not installed or not on LD_LIBRARY_PATH".into(),
        });
    }
    probe::nvrtc_symbols()?;
    let includes = include_dirs();
    if includes.is_empty() {
        return Err(CudaError::BackendUnavailable {
            reason: "cuda_fp16.h not found: set FERROCOLL_CUDA_INCLUDE to a CUDA include folder \
                     (a CUDA toolkit's include/, or the nvidia/cu13/include of the NVIDIA runtime \
                     and crt Python wheels)"
                .into(),
        });
    }
    let mut options: Vec<String> = OPTIONS.iter().map(|o| o.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    options.extend(
        includes
            .iter()
            .map(|d| format!("--include-path={}", d.display())),
    );
    let failed = |log: String| CudaError::Compile {
        arch: arch.to_owned(),
        log,
    };
    let src = CString::new(source).map_err(|e| failed(e.to_string()))?;
    let name = CString::new("interpret.cu").expect("no NUL");
    let prog = nvrtc::create_program(&src, Some(&name)).map_err(|e| failed(e.to_string()))?;
    // SAFETY: `prog` was created above and is destroyed once, below; the
    // source and name it refers to outlive it.
    let result = unsafe {
        let compiled = nvrtc::compile_program(prog, &options);
        let log = nvrtc::get_program_log(prog)
            .map(|l| {
                let bytes: Vec<u8> = l
                    .iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        let image = compiled.and_then(|()| cubin(prog));
        let _ = nvrtc::destroy_program(prog);
        match image {
            Ok(image) => Ok((image, log)),
            Err(e) => Err((e, log)),
        }
    };
    match result {
        Ok((image, log)) => Ok(Compiled {
            image,
            resources: parse_resources(&log),
        }),
        Err((e, log)) => Err(failed(format!("{e}\n{log}"))),
    }
}

/// The cubin of a compiled program.
///
/// # Safety
/// `prog` is a live, compiled program.
unsafe fn cubin(prog: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>, nvrtc::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: forwarded; the out-pointer is a live local; the symbols were
    // checked (`probe::nvrtc_symbols`).
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size).result()? };
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds the `size` bytes NVRTC reported.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()).result()? };
    Ok(image)
}

/// ptxas's verbose report, by entry point.
pub fn parse_resources(log: &str) -> HashMap<String, Resources> {
    let mut out = HashMap::new();
    let mut current: Option<String> = None;
    let number = |text: &str, before: &str| -> Option<u32> {
        let at = text.find(before)?;
        text[..at].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            current = Some(rest.trim().to_owned());
            out.entry(rest.trim().to_owned())
                .or_insert_with(Resources::default);
            continue;
        }
        let Some(name) = &current else { continue };
        let r = out.get_mut(name).expect("inserted above");
        if let Some(n) = number(line, "bytes stack frame") {
            r.stack_bytes = n;
        }
        if let Some(n) = number(line, "bytes spill stores") {
            r.spill_bytes = n;
        }
        if let Some(n) = number(line, "registers") {
            r.registers = n;
        }
    }
    out
}

/// The report as ptxas would word it, for the cache file.
fn report_text(resources: &HashMap<String, Resources>) -> String {
    let mut names: Vec<&String> = resources.keys().collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let r = resources[n];
            format!(
                "ptxas info    : Function properties for {n}\n\
                 ptxas         .     {} bytes stack frame, {} bytes spill stores, 0 bytes spill loads\n\
                 ptxas info    : Used {} registers\n",
                r.stack_bytes, r.spill_bytes, r.registers
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CI installs NVRTC and the headers and sets `FERROCOLL_REQUIRE_NVRTC=1`,
    /// so a kernel that does not compile fails the build there; elsewhere a
    /// missing NVRTC is a printed skip. Every entry point must fit its
    /// launch bounds (two blocks of 512 threads an SM: 64 registers) with
    /// no spills and no stack: what `ferrocoll info` reports on a GPU.
    #[test]
    fn the_interpreter_compiles_for_sm80_and_sm90_within_its_launch_bounds() {
        let required = std::env::var("FERROCOLL_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        let budget = 65536 / (abi::THREADS * abi::MIN_BLOCKS_PER_SM);
        for arch in ["sm_80", "sm_90"] {
            match compile(arch) {
                Ok(c) => {
                    assert!(c.image.starts_with(b"\x7fELF"), "{arch}: not a cubin");
                    for name in interpreter_kernels() {
                        let r = c
                            .resources
                            .get(&name)
                            .unwrap_or_else(|| panic!("{arch}: {name} missing"));
                        assert!(
                            r.registers <= budget && r.spill_bytes == 0 && r.stack_bytes == 0,
                            "{arch} {name}: {r:?} (budget {budget} registers, no spills)"
                        );
                    }
                    let most = c.resources.values().map(|r| r.registers).max();
                    println!("{arch}: at most {most:?} registers, no spills, no stack");
                }
                Err(CudaError::BackendUnavailable { reason }) if !required => {
                    println!("SKIPPED: {reason}");
                    return;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// One entry point compiles alone (what a GPU does on a call's first
    /// use) and lands in the cache folder under its own name.
    #[test]
    fn one_entry_point_compiles_alone_into_the_cache() {
        let required = std::env::var("FERROCOLL_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        let dir = std::env::temp_dir().join(format!("ferrocoll-kentry-{}", std::process::id()));
        let started = std::time::Instant::now();
        match entry("sm_90", (DataType::Bf16, ReduceOp::Max), 13, Some(&dir)) {
            Ok(c) => {
                let name = interpreter_kernel(DataType::Bf16, ReduceOp::Max);
                assert_eq!(c.resources.len(), 1, "{:?}", c.resources.keys());
                assert!(c.resources.contains_key(&name));
                let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
                assert_eq!(files.len(), 1);
                let cached = read_cached(&files[0].path()).expect("a readable cache entry");
                assert_eq!(cached.image, c.image);
                println!("one entry point: {:?}", started.elapsed());
            }
            Err(CudaError::BackendUnavailable { reason }) if !required => {
                println!("SKIPPED: {reason}")
            }
            Err(e) => panic!("{e}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ptxas_reports_are_read_per_entry_point_and_survive_the_cache() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
                   ptxas info    : Function properties for k\n\
                   ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
                   ptxas info    : Used 40 registers, used 1 barriers, 736 bytes cmem[0]\n\
                   ptxas info    : Function properties for other\n\
                   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 12 registers\n";
        let r = parse_resources(log);
        assert_eq!(
            r["k"],
            Resources {
                registers: 40,
                stack_bytes: 8,
                spill_bytes: 4
            }
        );
        assert_eq!(r["other"].registers, 12);
        assert_eq!(parse_resources(&report_text(&r)), r);
        let dir = std::env::temp_dir().join(format!("ferrocoll-kcache-{}", std::process::id()));
        let file = dir.join("interpret-sm_90-test.cubin");
        let c = Compiled {
            image: b"\x7fELF and the rest".to_vec(),
            resources: r.clone(),
        };
        write_cached(&file, &c);
        let back = read_cached(&file).expect("read back");
        assert_eq!((back.image, back.resources), (c.image, r));
        // A truncated or foreign file is compiled again, not loaded.
        std::fs::write(&file, b"junk").unwrap();
        assert!(read_cached(&file).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn kernel_names_cover_every_type_and_op() {
        assert_eq!(interpreter_kernels().len(), 10 * 4);
        assert_eq!(
            interpreter_kernel(DataType::Bf16, ReduceOp::Avg),
            "ferrocoll_run_sum_bf16"
        );
        assert_eq!(arch_name(9, 0).unwrap(), "sm_90");
        assert_eq!(arch_name(10, 3).unwrap(), "sm_103");
        assert!(arch_name(7, 0).is_err());
    }
}
