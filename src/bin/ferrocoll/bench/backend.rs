//! Which executor a bench run drives: threads, processes of a group
//! started by `ferrocoll launch`, the CUDA executor, or NCCL — checked and
//! opened once, then asked to run each section.

use std::sync::{Arc, Mutex};

use ferrocoll::Verified;
use ferrocoll::comm::{Communicator, Planning};
use ferrocoll::cpu::CpuConfig;
use ferrocoll::cuda::CudaCommunicator;
use ferrocoll::device::DeviceCommunicator;
use ferrocoll::nccl::{NcclCommunicator, NcclConfig};
use ferrocoll::process::{ProcessCommunicator, ProcessConfig};
use ferrocoll::topo::probe::membw::{self, MemoryBandwidth};

use super::report::Row;
use super::run::{self, Cpu};
use super::setup::{Section, custom_schedule};
use super::{Backend, BenchArgs, cuda, nccl, process};
use crate::spec::AlgoSpec;

/// The executor of a run.
pub(crate) enum Target {
    /// Ranks are threads of this process.
    Threads { custom: Option<Arc<Verified>> },
    /// This process is one rank of a process group.
    Processes {
        comm: Box<Mutex<ProcessCommunicator>>,
        config: ProcessConfig,
    },
    /// The CUDA executor on these devices, with NCCL beside it if asked.
    Cuda {
        devices: Vec<usize>,
        custom: Option<Arc<Verified>>,
        compare: bool,
    },
    /// NCCL on these devices.
    Nccl { devices: Vec<usize> },
    /// This process is one rank of an NCCL communicator over the processes
    /// `launch` started, one GPU each.
    NcclProcess { comm: Box<Mutex<NcclCommunicator>> },
    /// This process is one rank of a CUDA executor group over the
    /// processes `launch` started, one GPU each.
    CudaProcess { comm: Box<Mutex<CudaCommunicator>> },
}

impl Target {
    /// Check the backend's flags and open it; returns the arguments with
    /// `--ranks` replaced by the group's size under `launch`.
    pub(crate) fn open(args: &BenchArgs) -> Result<(Target, BenchArgs), String> {
        let mut args = args.clone();
        if let Some(transport) = args.transport {
            if args.backend != Backend::Cpu || args.predict || args.compare.is_some() {
                return Err(
                    "--transport runs the CPU executor across processes: use it with --backend cpu, without --predict or --compare".to_owned(),
                );
            }
            let target = Target::join(&mut args, transport)?;
            return Ok((target, args));
        }
        if args.from_env && !matches!(args.backend, Backend::Nccl | Backend::Cuda) {
            return Err(
                "--from-env joins a GPU group across processes: use it with --backend nccl or cuda (the CPU executor's processes take --transport)".to_owned(),
            );
        }
        if args.from_env && args.devices.is_some() {
            return Err(
                "--from-env takes each rank's GPU from LOCAL_RANK: drop --devices".to_owned(),
            );
        }
        if args.ll_max_bytes.is_some() && args.backend != Backend::Cuda {
            return Err(
                "--ll-max-bytes sets the CUDA executor's protocol: use it with --backend cuda"
                    .to_owned(),
            );
        }
        if args.compare.is_some() && args.backend != Backend::Cuda {
            return Err("--compare nccl runs beside --backend cuda only".to_owned());
        }
        let custom = custom_schedule(&args.algo, args.ranks)?;
        let target = match args.backend {
            Backend::Cpu => Target::Threads { custom },
            Backend::Cuda if args.from_env => {
                // The group's settings are fixed when it forms: one run,
                // one setting (as `--backend nccl --from-env`).
                if args.compare.is_some() || custom.is_some() || args.algo != AlgoSpec::Auto {
                    return Err(
                        "--backend cuda --from-env runs the group's own choice: drop --compare and --algo"
                            .to_owned(),
                    );
                }
                let cpu = CpuConfig {
                    planning: Planning {
                        timeout: ProcessConfig::builtin()
                            .with_env()
                            .map_err(|e| e.to_string())?
                            .planning
                            .timeout,
                        ..CpuConfig::builtin().planning
                    },
                    ..CpuConfig::builtin()
                };
                let config = cuda::cuda_config(&cpu, &args);
                let comm = ferrocoll::env::cuda_communicator_from_env(&config)
                    .map_err(|e| e.to_string())?;
                args.ranks = DeviceCommunicator::size(&comm);
                Target::CudaProcess {
                    comm: Box::new(Mutex::new(comm)),
                }
            }
            Backend::Cuda => {
                if args.compare.is_some() {
                    ferrocoll::nccl::version().map_err(|e| e.to_string())?;
                }
                Target::Cuda {
                    devices: cuda::devices(args.ranks, args.devices.as_deref())?,
                    custom,
                    compare: args.compare.is_some(),
                }
            }
            Backend::Nccl if args.from_env => {
                let config = NcclConfig {
                    timeout: ProcessConfig::builtin()
                        .with_env()
                        .map_err(|e| e.to_string())?
                        .planning
                        .timeout,
                    ..NcclConfig::default()
                }
                .with_channels(args.channels);
                let comm = ferrocoll::env::nccl_communicator_from_env(&config)
                    .map_err(|e| e.to_string())?;
                args.ranks = comm.world_size();
                Target::NcclProcess {
                    comm: Box::new(Mutex::new(comm)),
                }
            }
            Backend::Nccl => {
                ferrocoll::nccl::version().map_err(|e| e.to_string())?;
                Target::Nccl {
                    devices: cuda::devices(args.ranks, args.devices.as_deref())?,
                }
            }
        };
        Ok((target, args))
    }

    /// Join the process group `launch` started (env:// variables).
    fn join(
        args: &mut BenchArgs,
        transport: ferrocoll::process::TransportKind,
    ) -> Result<Target, String> {
        // The FERROCOLL_* settings (algorithm, timeout, job id) on the
        // built-in ones: a bad value is one error, not a warning from
        // `Default` and then the error.
        let env = ProcessConfig::builtin()
            .with_env()
            .map_err(|e| e.to_string())?;
        let boot =
            ferrocoll::env::bootstrap_from_env(env.planning.timeout).map_err(|e| e.to_string())?;
        args.ranks = boot.world_size;
        let config = ProcessConfig {
            transport,
            max_message_bytes: args.max_chunk_bytes.unwrap_or(env.max_message_bytes),
            shared_heap_bytes: shared_heap_bytes(args, transport),
            planning: Planning {
                schedule: custom_schedule(&args.algo, args.ranks)?,
                ..env.planning
            },
            ..env
        };
        let comm = ProcessCommunicator::connect(boot.store, boot.rank, boot.world_size, &config)
            .map_err(|e| e.to_string())?;
        Ok(Target::Processes {
            comm: Box::new(Mutex::new(comm)),
            config,
        })
    }

    /// The schedule file the run executes, if any.
    pub(crate) fn custom(&self) -> Option<Arc<Verified>> {
        match self {
            Target::Threads { custom } | Target::Cuda { custom, .. } => custom.clone(),
            Target::Processes { config, .. } => config.planning.schedule.clone(),
            Target::Nccl { .. } | Target::NcclProcess { .. } | Target::CudaProcess { .. } => None,
        }
    }

    /// Whether this process prints the table (rank 0 of a process group).
    pub(crate) fn prints(&self) -> bool {
        match self {
            Target::Processes { comm, .. } => comm.lock().map_or(true, |c| c.rank() == 0),
            Target::NcclProcess { comm } => {
                comm.lock().map_or(true, |c| Communicator::rank(&*c) == 0)
            }
            Target::CudaProcess { comm } => comm
                .lock()
                .map_or(true, |c| DeviceCommunicator::rank(&*c) == 0),
            _ => true,
        }
    }

    /// The process group's settings, when ranks are processes.
    pub(crate) fn process_config(&self) -> Option<&ProcessConfig> {
        match self {
            Target::Processes { config, .. } => Some(config),
            _ => None,
        }
    }

    /// The memory bandwidth that bounds the backend's busbw.
    pub(crate) fn memory_bandwidth(&self) -> Result<MemoryBandwidth, String> {
        match self {
            Target::Cuda { devices, .. } | Target::Nccl { devices } => {
                cuda::device_bandwidth(devices[0])
            }
            Target::NcclProcess { comm } => {
                let device = comm
                    .lock()
                    .map_err(|_| "the communicator is poisoned")?
                    .context()
                    .ordinal();
                cuda::device_bandwidth(device)
            }
            Target::CudaProcess { comm } => {
                let device = DeviceCommunicator::context(
                    &*comm.lock().map_err(|_| "the communicator is poisoned")?,
                )
                .ordinal();
                cuda::device_bandwidth(device)
            }
            _ => Ok(membw::measure(
                membw::ARRAY_BYTES,
                std::thread::available_parallelism().map_or(1, |n| n.get()),
                5,
            )),
        }
    }

    /// Time and check one section on the backend.
    pub(crate) fn run_section(
        &self,
        args: &BenchArgs,
        config: &CpuConfig,
        section: &Section,
        sizes: &[usize],
        progress: Option<&indicatif::ProgressBar>,
    ) -> Result<Vec<Row>, String> {
        match self {
            Target::Threads { .. } => {
                let backend = Cpu {
                    n: args.ranks,
                    config,
                };
                run::section(args, &backend, section, sizes, progress)
            }
            Target::Processes {
                comm,
                config: process,
            } => {
                comm.lock()
                    .map_err(|_| "the communicator is poisoned")?
                    .set_algorithm(config.planning.algorithm);
                let backend = process::Process {
                    comm,
                    schedule: process.planning.schedule.as_deref(),
                };
                run::section(args, &backend, section, sizes, progress)
            }
            Target::Cuda { devices, .. } => {
                let backend = cuda::Cuda::new(devices.clone(), config, args);
                run::section(args, &backend, section, sizes, progress)
            }
            Target::Nccl { devices } => {
                let backend = nccl::Nccl::new(devices.clone(), config, args.channels);
                run::section(args, &backend, section, sizes, progress)
            }
            Target::NcclProcess { comm } => {
                let backend = process::Process {
                    comm: &**comm,
                    schedule: None,
                };
                run::section(args, &backend, section, sizes, progress)
            }
            Target::CudaProcess { comm } => {
                let backend = process::Process {
                    comm: &**comm,
                    schedule: None,
                };
                run::section(args, &backend, section, sizes, progress)
            }
        }
    }

    /// With `--compare nccl`: the same section on NCCL, its rows labelled.
    pub(crate) fn compare(
        &self,
        args: &BenchArgs,
        config: &CpuConfig,
        section: &Section,
        sizes: &[usize],
        progress: Option<&indicatif::ProgressBar>,
    ) -> Result<Option<Vec<Row>>, String> {
        let Target::Cuda {
            devices,
            compare: true,
            ..
        } = self
        else {
            return Ok(None);
        };
        let backend = nccl::Nccl::new(devices.clone(), config, args.channels);
        let mut theirs = run::section(args, &backend, section, sizes, progress)?;
        for row in &mut theirs {
            row.algorithm = "nccl".to_owned();
        }
        Ok(Some(theirs))
    }
}

/// The largest shared heap the bench asks for, per rank.
const MAX_BENCH_HEAP: usize = 1 << 30;

/// Room for one size's input and output (the bench holds one size's
/// buffers at a time), when the transport has a shared heap and the run
/// wants one.
fn shared_heap_bytes(args: &BenchArgs, transport: ferrocoll::process::TransportKind) -> usize {
    if args.no_shared_heap || transport != ferrocoll::process::TransportKind::Shm {
        return 0;
    }
    let want = args
        .max_bytes
        .saturating_mul(2)
        .saturating_add(1 << 20)
        .next_multiple_of(4096);
    if want > MAX_BENCH_HEAP { 0 } else { want }
}
