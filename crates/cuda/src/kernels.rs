//! The device kernels: CUDA C in `cuda/reduce.cu`, compiled by NVRTC at
//! first use for the device's compute capability and cached per process.
//!
//! NVRTC needs `cuda_fp16.h` and `cuda_bf16.h`. They are found, in order,
//! in `FERROCOLL_CUDA_INCLUDE`, `$CUDA_HOME/include`, `$CUDA_PATH/include`,
//! `/usr/local/cuda/include`, and the `nvidia/cu13/include` folder of the
//! NVIDIA runtime Python wheels under the usual site-packages roots. They
//! are not vendored: NVIDIA's licence for them allows redistribution only
//! with an application built on CUDA, and every machine that runs kernels
//! has a CUDA install or the wheels anyway.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};
use ferrocoll_core::{DataType, ReduceOp};

use crate::error::CudaError;
use crate::probe;

/// The kernel source, embedded at build time.
pub const SOURCE: &str = include_str!("../../../cuda/reduce.cu");

/// The device interpreter (executor v2), compiled together with
/// [`SOURCE`], whose element operations it uses.
pub const INTERPRETER: &str = include_str!("../../../cuda/interpret.cu");

/// Inputs and outputs one kernel launch takes at most (`MAX_INPUTS`,
/// `MAX_OUTPUTS` in the source).
pub const MAX_POINTERS: usize = 8;

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

/// The reduce-copy kernel for `op` on `t` (avg reduces as a sum).
pub fn reduce_kernel(t: DataType, op: ReduceOp) -> String {
    format!("ferrocoll_{}_{}", op_name(op), type_suffix(t))
}

/// The interpreter's entry point for a type and op (`avg` runs the sum).
pub fn interpreter_kernel(t: DataType, op: ReduceOp) -> String {
    format!("ferrocoll_run_{}_{}", op_name(op), type_suffix(t))
}

fn op_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => "sum",
        ReduceOp::Prod => "prod",
        ReduceOp::Min => "min",
        ReduceOp::Max => "max",
    }
}

/// The kernel dividing by the rank count, avg's last pass.
pub fn divide_kernel(t: DataType) -> String {
    format!("ferrocoll_div_{}", type_suffix(t))
}

/// Every kernel name in the source.
pub fn all_kernels() -> Vec<String> {
    let mut names = Vec::new();
    for t in DataType::ALL {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            names.push(reduce_kernel(t, op));
        }
        names.push(divide_kernel(t));
    }
    names
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

/// The kernels compiled to PTX for `arch` (`compute_80`, `compute_90`),
/// once per process.
pub fn ptx(arch: &'static str) -> Result<Ptx, CudaError> {
    cached(arch, "reduce", compile)
}

/// The device interpreter (with the kernels it builds on) compiled to PTX
/// for `arch`, once per process.
pub fn interpreter_ptx(arch: &'static str) -> Result<Ptx, CudaError> {
    cached(arch, "interpret", compile_interpreter)
}

fn cached(
    arch: &'static str,
    which: &'static str,
    compile: fn(&'static str) -> Result<Ptx, CudaError>,
) -> Result<Ptx, CudaError> {
    type Cache = Mutex<HashMap<(&'static str, &'static str), String>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (arch, which);
    if let Some(src) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(Ptx::from_src(src.clone()));
    }
    let compiled = compile(arch)?.to_src();
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, compiled.clone());
    Ok(Ptx::from_src(compiled))
}

/// Compile the kernels for `arch` now (no cache).
pub fn compile(arch: &'static str) -> Result<Ptx, CudaError> {
    compile_source(arch, SOURCE.to_owned(), "reduce.cu")
}

/// Compile the device interpreter for `arch` (with the kernels it builds
/// on).
pub fn compile_interpreter(arch: &'static str) -> Result<Ptx, CudaError> {
    compile_source(arch, format!("{SOURCE}\n{INTERPRETER}"), "interpret.cu")
}

/// The interpreter's entry points: one per (op, type); `avg` runs the sum.
pub fn interpreter_kernels() -> Vec<String> {
    let mut out = Vec::new();
    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
        for t in DataType::ALL {
            out.push(interpreter_kernel(t, op));
        }
    }
    out
}

fn compile_source(arch: &'static str, source: String, name: &str) -> Result<Ptx, CudaError> {
    if !probe::nvrtc_present() {
        return Err(CudaError::BackendUnavailable {
            reason: "libnvrtc is not installed or not on LD_LIBRARY_PATH".into(),
        });
    }
    let includes = include_dirs();
    if includes.is_empty() {
        return Err(CudaError::BackendUnavailable {
            reason: "cuda_fp16.h not found: set FERROCOLL_CUDA_INCLUDE to a CUDA include folder \
                     (a CUDA toolkit's include/, or the nvidia/cu13/include of the NVIDIA runtime \
                     and crt Python wheels)"
                .into(),
        });
    }
    let options = CompileOptions {
        arch: Some(arch),
        include_paths: includes
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect(),
        options: vec!["--std=c++17".into()],
        name: Some(name.into()),
        ..CompileOptions::default()
    };
    compile_ptx_with_opts(source, options).map_err(|e| CudaError::Compile {
        arch: arch.to_string(),
        log: e.to_string(),
    })
}

/// The `compute_XY` name for a compute capability, for NVRTC's
/// `--gpu-architecture`.
pub fn arch_name(major: i32, minor: i32) -> Result<&'static str, CudaError> {
    // The newest virtual architecture NVRTC 13 compiles that is not newer
    // than the device (PTX runs on later devices of the same major).
    Ok(match major * 10 + minor {
        120.. => "compute_120",
        100.. => "compute_100",
        90.. => "compute_90",
        89 => "compute_89",
        87..=88 => "compute_87",
        86 => "compute_86",
        80..=85 => "compute_80",
        75..=79 => "compute_75",
        _ => {
            return Err(CudaError::BackendUnavailable {
                reason: format!(
                    "compute capability {major}.{minor}: CUDA 13 supports 7.5 (Turing) and newer"
                ),
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CI installs NVRTC and the headers and sets `FERROCOLL_REQUIRE_NVRTC=1`,
    /// so a kernel that does not compile fails the build there; elsewhere a
    /// missing NVRTC is a printed skip.
    #[test]
    fn every_kernel_compiles_to_ptx_for_sm80_and_sm90() {
        let required = std::env::var("FERROCOLL_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        for arch in ["compute_80", "compute_90"] {
            match compile(arch) {
                Ok(ptx) => {
                    let text = ptx.to_src();
                    for name in all_kernels() {
                        assert!(
                            text.contains(&format!(".entry {name}(")),
                            "{arch}: {name} missing from the PTX"
                        );
                    }
                }
                Err(CudaError::BackendUnavailable { reason }) if !required => {
                    println!("SKIPPED: {reason}");
                    return;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// As above, for the device interpreter.
    #[test]
    fn the_interpreter_compiles_to_ptx_for_sm80_and_sm90() {
        let required = std::env::var("FERROCOLL_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        for arch in ["compute_80", "compute_90"] {
            match compile_interpreter(arch) {
                Ok(ptx) => {
                    let text = ptx.to_src();
                    for name in interpreter_kernels() {
                        assert!(
                            text.contains(&format!(".entry {name}(")),
                            "{arch}: {name} missing from the PTX"
                        );
                    }
                }
                Err(CudaError::BackendUnavailable { reason }) if !required => {
                    println!("SKIPPED: {reason}");
                    return;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn kernel_names_cover_every_type_and_op() {
        assert_eq!(all_kernels().len(), 10 * 5);
        assert_eq!(
            reduce_kernel(DataType::Bf16, ReduceOp::Avg),
            "ferrocoll_sum_bf16"
        );
        for name in all_kernels() {
            assert!(
                SOURCE.contains(
                    &name["ferrocoll_".len()..]
                        .split('_')
                        .next()
                        .unwrap()
                        .to_string()
                )
            );
        }
        assert_eq!(arch_name(9, 0).unwrap(), "compute_90");
        assert_eq!(arch_name(8, 7).unwrap(), "compute_87");
        assert_eq!(arch_name(10, 3).unwrap(), "compute_100");
        assert!(arch_name(7, 0).is_err());
        assert!(arch_name(6, 1).is_err());
    }
}
