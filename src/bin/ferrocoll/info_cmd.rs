//! `ferrocoll info`: what a bug report needs — ferrocoll's build, the CPU
//! and its measured memory bandwidth, and, where they exist, the CUDA
//! driver, NVRTC and NCCL (version and the file loaded), the visible GPUs,
//! their peer-to-peer matrix and link graph. What is missing is said, and
//! the command still exits 0: a machine without a GPU is a fine answer.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::host_facts;
use ferrocoll::cuda::info::{self, DriverFacts};
use ferrocoll::topo::probe::host;
use ferrocoll::topo::render;

#[derive(Args, Debug)]
pub(crate) struct InfoArgs {
    /// Skip the memory-bandwidth measurement (about a tenth of a second).
    #[arg(long)]
    no_measure: bool,
    /// Report every entry point of the CUDA executor's kernel (each
    /// compiled on first use, a second or two apiece; then cached).
    #[arg(long)]
    kernels: bool,
    /// Compile every entry point of the CUDA executor's kernel for this
    /// architecture (`sm_90`) into the kernel cache and report what ptxas
    /// says of each: no GPU needed (NVRTC only); a GPU of that
    /// architecture then loads them without compiling.
    #[arg(long, value_name = "ARCH")]
    compile_kernels: Option<String>,
}

pub(crate) fn run(args: &InfoArgs) -> Result<ExitCode, String> {
    if let Some(arch) = &args.compile_kernels {
        return compile_kernels(arch);
    }
    println!(
        "ferrocoll     {} ({} build for {})",
        env!("CARGO_PKG_VERSION"),
        env!("FERROCOLL_BUILD_PROFILE"),
        env!("FERROCOLL_BUILD_TARGET")
    );
    println!("os            {}", host_facts::os());
    println!("cpu           {}", host_facts::cpu());
    if !args.no_measure {
        let m = host::measured();
        println!(
            "memory        {}; measured {:.1} GB/s on {} cores ({:.1} GB/s one core)",
            host_facts::memory_total(),
            m.memory_gbps,
            m.cores,
            m.core_gbps
        );
        println!("host kernels  {}", ferrocoll::kernels::calibration());
    }
    let driver = info::driver();
    match &driver {
        Ok(d) => println!(
            "cuda driver   CUDA {}.{}{}",
            d.version.0,
            d.version.1,
            at(loaded("libcuda.so"))
        ),
        Err(e) => println!("cuda driver   none: {e}"),
    }
    println!(
        "cuda env      CUDA_DEVICE_MAX_CONNECTIONS={}, kernel cache {}",
        std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").unwrap_or_else(|_| "unset (8)".into()),
        ferrocoll::env::kernel_cache().map_or("off".into(), |p| p.display().to_string()),
    );
    match info::nvrtc_version() {
        Ok((major, minor)) => println!("nvrtc         {major}.{minor}{}", at(loaded("libnvrtc"))),
        Err(e) => println!("nvrtc         none: {e}"),
    }
    match ferrocoll::nccl::version() {
        Ok((a, b, c)) => println!("nccl          {a}.{b}.{c}{}", at(loaded("libnccl"))),
        Err(e) => println!("nccl          none: {e}"),
    }
    match &driver {
        Ok(d) => {
            gpus(d);
            for g in &d.devices {
                kernels(g.ordinal as usize, args.kernels);
            }
        }
        Err(_) => println!("gpus          none visible (no GPU on this machine, or no driver)"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `--compile-kernels ARCH`: every entry point into the kernel cache.
fn compile_kernels(arch: &str) -> Result<ExitCode, String> {
    let valid = arch
        .strip_prefix("sm_")
        .is_some_and(|n| n.len() >= 2 && n.chars().all(|c| c.is_ascii_alphanumeric()));
    if !valid {
        return Err(format!(
            "--compile-kernels {arch}: an architecture such as sm_90"
        ));
    }
    let cache = ferrocoll::env::kernel_cache()
        .ok_or("--compile-kernels: the kernel cache is off (FERROCOLL_KERNEL_CACHE)")?;
    println!(
        "kernels       {arch} into {}: registers, stack B, spill B (ptxas)",
        cache.display()
    );
    let mut failed = 0;
    for (name, r) in ferrocoll::cuda::kernels::precompile(arch, &cache) {
        match r {
            Ok(r) => println!(
                "  {name:<24} {:>4} {:>6} {:>6}",
                r.registers, r.stack_bytes, r.spill_bytes
            ),
            Err(e) => {
                failed += 1;
                println!("  {name:<24} {e}");
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The interpreter's entry points on a device: registers, local memory,
/// static shared memory and blocks per SM. Each is compiled on its first
/// use (or taken from the kernel cache): the f32 and bf16 sums by
/// default, all forty with `--kernels`.
fn kernels(device: usize, all: bool) {
    use ferrocoll::cuda::interpreter::{Engine, THREADS};
    use ferrocoll::{DataType, ReduceOp};
    let engine = match Engine::shared(device, ferrocoll::env::kernel_cache().as_deref()) {
        Ok(e) => e,
        Err(e) => return println!("kernels       GPU {device}: {e}"),
    };
    println!(
        "kernels       GPU {device}: {} SMs; per entry point at {THREADS} threads a block: registers, local B, static shared B, blocks/SM",
        engine.sms
    );
    let entries = if all {
        ferrocoll::cuda::kernels::entries()
    } else {
        vec![
            (DataType::F32, ReduceOp::Sum),
            (DataType::Bf16, ReduceOp::Sum),
        ]
    };
    for (t, op) in entries {
        let name = ferrocoll::cuda::kernels::interpreter_kernel(t, op);
        match engine.kernel(t, op) {
            Ok(k) => println!(
                "  {name:<24} {:>4} {:>6} {:>7} {:>3}",
                k.registers, k.local_bytes, k.static_shared_bytes, k.blocks_per_sm
            ),
            Err(e) => println!("  {name:<24} {e}"),
        }
    }
    if !all {
        println!("  (--kernels: every entry point)");
    }
}

/// The GPUs, their peer-to-peer matrix and, through NVML, their links.
fn gpus(d: &DriverFacts) {
    println!("gpus          {}", d.devices.len());
    for g in &d.devices {
        println!(
            "  {}: {}, {:.1} GiB, sm_{}{}, {} SMs, PCI {}",
            g.ordinal,
            g.name,
            g.memory_bytes as f64 / f64::from(1u32 << 30),
            g.compute.0,
            g.compute.1,
            g.multiprocessors,
            g.pci
        );
    }
    println!("peer-to-peer  (row reads/writes column's memory directly)");
    print!("     ");
    for b in 0..d.p2p.len() {
        print!("{b:>4}");
    }
    println!();
    for (a, row) in d.p2p.iter().enumerate() {
        print!("  {a:>3}");
        for &ok in row {
            print!("{:>4}", if ok { "yes" } else { "no" });
        }
        println!();
    }
    match ferrocoll::topo::sources::nvml::discover() {
        Ok(t) => match render::smi_matrix(&t) {
            Ok(m) => print!("links (NVML)\n{m}"),
            Err(e) => println!("links         not drawn: {e}"),
        },
        Err(e) => println!("links         NVML: {e}"),
    }
}

/// ` at PATH`, or nothing where the file is not known.
fn at(path: Option<PathBuf>) -> String {
    path.map_or(String::new(), |p| format!(" at {}", p.display()))
}

/// The file of a loaded shared library whose name starts with `stem`, from
/// the process's own memory map (libraries are opened at run time, so this
/// is the one in use, wherever the search found it).
fn loaded(stem: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            std::path::Path::new(p)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(stem))
        })
        .map(PathBuf::from)
}
