//! Which backend a run opens: the flags checked against each other, then
//! one table from (`--backend`, launched or not) to the backend's opener.
//! A backend is one file (`threads.rs`, `process.rs`, `cuda.rs`,
//! `nccl.rs`) implementing [`Target`]; this file knows them only here.

use super::target::Target;
use super::{Backend, BenchArgs, cuda, nccl, process, threads};
use crate::spec::AlgoSpec;

/// Opens a backend; may set `args.ranks` (a launched group's size).
type Opener = fn(&mut BenchArgs) -> Result<Box<dyn Target>, String>;

/// Every backend: what `--backend` names, whether this process is one rank
/// of a group `ferrocoll launch` started (`--transport` for the CPU
/// executor, `--from-env` for the GPU ones), and how it opens.
const BACKENDS: [(Backend, bool, Opener); 6] = [
    (Backend::Cpu, false, threads::open),
    (Backend::Cpu, true, process::open),
    (Backend::Cuda, false, cuda::open),
    (Backend::Cuda, true, cuda::open_launched),
    (Backend::Nccl, false, nccl::open),
    (Backend::Nccl, true, nccl::open_launched),
];

/// Check the backend's flags and open it; returns the arguments with
/// `--ranks` replaced by the group's size under `launch`.
pub(crate) fn open(args: &BenchArgs) -> Result<(Box<dyn Target>, BenchArgs), String> {
    let mut args = args.clone();
    check_flags(&args)?;
    let launched = args.transport.is_some() || args.from_env;
    let (_, _, opener) = BACKENDS
        .iter()
        .find(|(backend, l, _)| *backend == args.backend && *l == launched)
        .expect("the table has every backend, launched or not");
    let target = opener(&mut args)?;
    Ok((target, args))
}

/// Flags that only some backends take.
fn check_flags(args: &BenchArgs) -> Result<(), String> {
    if args.transport.is_some()
        && (args.backend != Backend::Cpu || args.predict || args.compare.is_some())
    {
        return Err(
            "--transport runs the CPU executor across processes: use it with --backend cpu, without --predict or --compare".to_owned(),
        );
    }
    if args.from_env && !matches!(args.backend, Backend::Nccl | Backend::Cuda) {
        return Err(
            "--from-env joins a GPU group across processes: use it with --backend nccl or cuda (the CPU executor's processes take --transport)".to_owned(),
        );
    }
    if args.from_env && args.devices.is_some() {
        return Err("--from-env takes each rank's GPU from LOCAL_RANK: drop --devices".to_owned());
    }
    if args.ll_max_bytes.is_some() && args.backend != Backend::Cuda {
        return Err(
            "--ll-max-bytes sizes the CUDA executor's LL protocol: use it with --backend cuda"
                .to_owned(),
        );
    }
    if args.compare.is_some() && args.backend != Backend::Cuda {
        return Err("--compare nccl runs beside --backend cuda only".to_owned());
    }
    if args.backend == Backend::Nccl && matches!(args.algo, AlgoSpec::File(_)) {
        return Err(
            "--algo FILE runs ferrocoll's executors; NCCL brings its own algorithms: use --backend cpu or cuda"
                .to_owned(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_opener_for_each_backend_launched_or_not() {
        for backend in [Backend::Cpu, Backend::Cuda, Backend::Nccl] {
            for launched in [false, true] {
                let n = BACKENDS
                    .iter()
                    .filter(|(b, l, _)| *b == backend && *l == launched)
                    .count();
                assert_eq!(n, 1, "{backend:?} launched={launched}");
            }
        }
    }
}
