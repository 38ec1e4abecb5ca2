//! The environment: the `FERROCOLL_*` settings of
//! [`ferrocoll_core::settings`] (the one configuration layer, which every
//! config's `Default` and `from_env` apply) and the `env://` bootstrap.
//!
//! | variable | effect |
//! |---|---|
//! | `FERROCOLL_ALGO` | force an algorithm: `ring`, `tree`, `direct`, `halving-doubling` (or `auto`) |
//! | `FERROCOLL_TIMEOUT_MS` | the longest any wait lasts, in milliseconds |
//! | `FERROCOLL_LOG` | what `ferrocoll::log::init` (feature `log`) and the CLI log: a level (`error`, `warn`, `info`, `debug` — one line per call: the algorithm and why —, `trace`) or `EnvFilter` directives (`info,ferrocoll_process=debug`); `RUST_LOG` when unset |
//! | `FERROCOLL_LOG_FILE` | log to a file instead of stderr: `%h` host, `%r` rank, `%p` pid ([`crate::log`]) |
//! | `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT` | the `env://` bootstrap of a multi-process group ([`bootstrap_from_env`]); `ferrocoll launch` sets them |
//! | `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`; `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK` | the same under Slurm's `srun` or OpenMPI's `mpirun` when `RANK` is unset (`MASTER_ADDR` and `MASTER_PORT` are still needed) |
//! | `FERROCOLL_JOB_SECRET` | the token the store and every TCP connection of a group authenticate with; `ferrocoll launch` sets a random one |
//! | `FERROCOLL_JOB_ID` | names the job's shared-memory segments, so `ferrocoll launch` can remove any a killed rank left behind |
//! | `FERROCOLL_TRACE_BUFFER`, `FERROCOLL_TRACE_DIR` | the flight recorder: calls each communicator keeps (default 2000), and where every rank dumps them on a failure, when dropped, and on `SIGUSR1` (`ferrocoll trace DIR`; docs/diagnostics.md) |
//! | `FERROCOLL_NET_GBPS` | each host's network port in Gbit/s: a group across hosts selects per call on a model of its cluster (hosts like rank 0's, one switch) instead of the fixed rule; feature `topo` ([`crate::network::Network`]) |
//! | `FERROCOLL_CLUSTER` | instead of a rate, the cluster's topology file (`ferrocoll topo --json` format; its devices, in order, are the ranks) |
//! | `FERROCOLL_KERNEL_CACHE` | where the CUDA executor keeps its compiled kernel between processes ([`kernel_cache`]; `off` for none); default `$XDG_CACHE_HOME/ferrocoll/kernels` or `~/.cache/ferrocoll/kernels` |

#[cfg(feature = "gpu-api")]
mod nccl;

#[cfg(feature = "gpu-api")]
pub use nccl::{NcclJoinError, exchange_unique_id, nccl_communicator_from_env};

#[cfg(feature = "gpu-api")]
mod cuda;

#[cfg(feature = "gpu-api")]
pub use cuda::{CudaJoinError, cuda_communicator_from_env};

use std::time::Duration;

use ferrocoll_core::cpu::CpuConfig;
use ferrocoll_core::settings::SettingsError;
use thiserror::Error;

/// An environment variable with a value ferrocoll cannot use.
#[derive(Debug, Error)]
pub enum EnvError {
    /// A `FERROCOLL_*` setting (see [`ferrocoll_core::settings`]).
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// A variable the `env://` bootstrap needs is not set.
    #[error(
        "{name} is not set (start the processes with `ferrocoll launch`, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; under srun or mpirun set MASTER_ADDR and MASTER_PORT)"
    )]
    Missing {
        /// The variable.
        name: &'static str,
    },
    /// RANK is not below WORLD_SIZE.
    #[error("RANK {rank} is out of range for WORLD_SIZE {world_size}")]
    RankOutOfRange {
        /// The rank.
        rank: u32,
        /// The world size.
        world_size: u32,
    },
    /// The rendezvous failed.
    #[error(transparent)]
    Rendezvous(#[from] ferrocoll_rendezvous::StoreError),
    /// Under torchrun, whose agent holds `MASTER_PORT` for its own store
    /// (`TORCHELASTIC_USE_AGENT_STORE=True`), the rendezvous failed: that
    /// port is torch's c10d store, not one ferrocoll's ranks can share.
    #[error(
        "{source} — under torchrun MASTER_PORT ({addr}) is its agent's own store (TORCHELASTIC_USE_AGENT_STORE=True), which ferrocoll cannot use: set MASTER_PORT to a free port of rank 0's host for ferrocoll before creating the communicator, or start the job with `ferrocoll launch`"
    )]
    AgentStore {
        /// MASTER_ADDR:MASTER_PORT.
        addr: String,
        /// What the rendezvous said.
        source: ferrocoll_rendezvous::StoreError,
    },
    /// The network between hosts (`FERROCOLL_NET_GBPS`,
    /// `FERROCOLL_CLUSTER`) is set badly.
    #[error("{name}: {why}")]
    Network {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// A number that does not parse.
    #[error("{name}: `{value}` is not a whole number")]
    Number {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
}

/// `base` with the `FERROCOLL_*` overrides applied.
pub fn cpu_config_from_env(base: CpuConfig) -> Result<CpuConfig, EnvError> {
    Ok(base.with_env()?)
}

/// This process's place in a multi-process group, and the store its ranks
/// meet at.
#[derive(Debug)]
pub struct Bootstrap {
    /// `RANK`.
    pub rank: u32,
    /// `WORLD_SIZE`.
    pub world_size: u32,
    /// `LOCAL_RANK` (defaults to `RANK`).
    pub local_rank: u32,
    /// The rendezvous store, served by rank 0 at `MASTER_ADDR:MASTER_PORT`.
    pub store: ferrocoll_rendezvous::Store,
}

/// Join the group the `env://` variables describe, waiting up to `timeout`
/// for rank 0's store.
pub fn bootstrap_from_env(timeout: Duration) -> Result<Bootstrap, EnvError> {
    bootstrap(|k| std::env::var(k).ok(), timeout)
}

/// Why joining a process group from the environment failed.
#[derive(Debug, Error)]
pub enum JoinError {
    /// The `env://` variables or the rendezvous.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// Forming the group over its transport.
    #[error(transparent)]
    Setup(#[from] ferrocoll_process::SetupError),
}

/// This process's rank of the group the `env://` variables describe (as
/// `ferrocoll launch` sets them), connected over `config.transport`, with
/// the `FERROCOLL_*` overrides applied on top of `config`. Under an MPI
/// launcher, in a build with the `mpi` feature, a `config` that names MPI
/// links (`TransportKind::Mpi`, or `NetKind::Mpi` under `Auto`) forms the
/// group over MPI instead (`mpi_communicator`, no `MASTER_ADDR` needed).
///
/// ```no_run
/// use ferrocoll::comm::{Communicator, CommunicatorExt};
/// use ferrocoll::process::ProcessConfig;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut comm = ferrocoll::env::process_communicator_from_env(&ProcessConfig::default())?;
/// let mut grads = vec![1.0f32; 1024];
/// comm.all_reduce_in_place(&mut grads, ferrocoll::ReduceOp::Avg)?;
/// # Ok(()) }
/// ```
pub fn process_communicator_from_env(
    config: &ferrocoll_process::ProcessConfig,
) -> Result<ferrocoll_process::ProcessCommunicator, JoinError> {
    // MPI links asked for under an MPI launcher: the group forms over MPI.
    #[cfg(feature = "mpi")]
    if ferrocoll_process::mpi::Mpi::launched() && wants_mpi(config) {
        return mpi_communicator(config);
    }
    let config = process_config_from_env(config)?;
    let b = bootstrap_from_env(config.planning.timeout)?;
    let comm =
        ferrocoll_process::ProcessCommunicator::connect(b.store, b.rank, b.world_size, &config)?;
    // The group found its hosts itself; a launcher's LOCAL_RANK that says
    // otherwise is wrong, and the layout is what the group uses.
    if comm.local_rank() != b.local_rank {
        tracing::warn!(
            rank = b.rank,
            said = b.local_rank,
            found = comm.local_rank(),
            "the launcher's local rank differs from the group's layout ({}); the layout wins",
            comm.layout().describe_host(comm.layout().host(b.rank))
        );
    }
    Ok(comm)
}

/// This process's rank of a group of every process of `MPI_COMM_WORLD`
/// (feature `mpi`; under `mpirun` or any MPI launcher): MPI is
/// initialized here unless the program did it, and finalized once the
/// communicator (and every group split from it) is dropped. Hosts link by
/// MPI point-to-point, ranks of one host by shared memory
/// (`config.transport = TransportKind::Mpi`: MPI between every pair).
/// No `MASTER_ADDR` is needed: rank 0 serves the setup's store and tells
/// the others by an MPI broadcast. `config` with the `FERROCOLL_*`
/// overrides on top, as for [`process_communicator_from_env`].
///
/// ```no_run
/// use ferrocoll::comm::CommunicatorExt;
/// use ferrocoll::process::ProcessConfig;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // mpirun -n 8 ./train
/// let mut comm = ferrocoll::env::mpi_communicator(&ProcessConfig::default())?;
/// let mut grads = vec![1.0f32; 1024];
/// comm.all_reduce_in_place(&mut grads, ferrocoll::ReduceOp::Avg)?;
/// # Ok(()) }
/// ```
#[cfg(feature = "mpi")]
pub fn mpi_communicator(
    config: &ferrocoll_process::ProcessConfig,
) -> Result<ferrocoll_process::ProcessCommunicator, JoinError> {
    let config = process_config_from_env(config)?;
    let mpi = ferrocoll_process::mpi::Mpi::init().map_err(ferrocoll_process::SetupError::from)?;
    Ok(ferrocoll_process::ProcessCommunicator::connect_mpi(
        &mpi, &config,
    )?)
}

/// Whether `config` asks for MPI links by name.
#[cfg(feature = "mpi")]
fn wants_mpi(config: &ferrocoll_process::ProcessConfig) -> bool {
    use ferrocoll_process::{NetKind, TransportKind};
    config.transport == TransportKind::Mpi
        || (config.transport == TransportKind::Auto && config.net == NetKind::Mpi)
}

/// `config` with the `FERROCOLL_*` overrides, and the network between
/// hosts the environment names where `config` has none.
fn process_config_from_env(
    config: &ferrocoll_process::ProcessConfig,
) -> Result<ferrocoll_process::ProcessConfig, EnvError> {
    let config = config.clone().with_env()?;
    #[cfg(feature = "topo")]
    let config = match (&config.cluster, network_from_env()?) {
        (None, Some(network)) => ferrocoll_process::ProcessConfig {
            cluster: Some(crate::network::cluster_model(network)),
            ..config
        },
        _ => config,
    };
    Ok(config)
}

/// The network the environment names: `FERROCOLL_NET_GBPS` (each host's
/// port, Gbit/s) or `FERROCOLL_CLUSTER` (a topology file); neither is
/// `None`, both an error.
#[cfg(feature = "topo")]
pub fn network_from_env() -> Result<Option<crate::network::Network>, EnvError> {
    network_with(|k| std::env::var(k).ok())
}

#[cfg(feature = "topo")]
fn network_with(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<crate::network::Network>, EnvError> {
    use crate::network::{Network, parse_rate};
    let rate = get("FERROCOLL_NET_GBPS").filter(|v| !v.trim().is_empty());
    let file = get("FERROCOLL_CLUSTER").filter(|v| !v.trim().is_empty());
    match (rate, file) {
        (Some(_), Some(_)) => Err(EnvError::Network {
            name: "FERROCOLL_NET_GBPS",
            value: "with FERROCOLL_CLUSTER".into(),
            why: "set one: a rate for hosts like this one, or a whole cluster's file".into(),
        }),
        (Some(v), None) => parse_rate(&v)
            .map(|r| Some(Network::Rate(r)))
            .map_err(|why| EnvError::Network {
                name: "FERROCOLL_NET_GBPS",
                value: v,
                why,
            }),
        (None, Some(path)) => Ok(Some(Network::File(path.into()))),
        (None, None) => Ok(None),
    }
}

/// The rank, world-size and local-rank variables of the launchers whose
/// processes can bootstrap without more: torchrun's (which `ferrocoll
/// launch` sets), Slurm's `srun` and OpenMPI's `mpirun`. The store's
/// address still comes from `MASTER_ADDR` and `MASTER_PORT`.
const LAUNCHERS: [(&str, &str, &str); 3] = [
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
    ),
];

/// Whether the environment describes a process group this process can
/// join: a launcher's rank variable and the store's `MASTER_ADDR` are set
/// (what `ferrocoll launch`, torchrun, or `srun`/`mpirun` with
/// `MASTER_ADDR` exported give each process).
pub fn launched() -> bool {
    launched_with(|k| std::env::var_os(k).is_some())
}

fn launched_with(set: impl Fn(&str) -> bool) -> bool {
    set("MASTER_ADDR") && LAUNCHERS.iter().any(|(rank, _, _)| set(rank))
}

fn bootstrap(
    get: impl Fn(&str) -> Option<String>,
    timeout: Duration,
) -> Result<Bootstrap, EnvError> {
    let var = |name: &'static str| get(name).ok_or(EnvError::Missing { name });
    let number = |name: &'static str, v: String| {
        v.trim()
            .parse::<u32>()
            .map_err(|_| EnvError::Number { name, value: v })
    };
    // The first launcher convention whose rank variable is set.
    let (rank_var, size_var, local_var) = LAUNCHERS
        .into_iter()
        .find(|(rank, _, _)| get(rank).is_some())
        .unwrap_or(LAUNCHERS[0]);
    let rank = number(rank_var, var(rank_var)?)?;
    let world_size = number(size_var, var(size_var)?)?;
    if world_size == 0 || rank >= world_size {
        return Err(EnvError::RankOutOfRange { rank, world_size });
    }
    let local_rank = match get(local_var) {
        Some(v) => number(local_var, v)?,
        None => rank,
    };
    let addr = format!(
        "{}:{}",
        var("MASTER_ADDR")?,
        number("MASTER_PORT", var("MASTER_PORT")?)?
    );
    let agent_store =
        get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let store = ferrocoll_rendezvous::Store::join(&addr, rank, timeout).map_err(|source| {
        if agent_store {
            EnvError::AgentStore {
                addr: addr.clone(),
                source,
            }
        } else {
            source.into()
        }
    })?;
    Ok(Bootstrap {
        rank,
        world_size,
        local_rank,
        store,
    })
}

/// Hardware queues per GPU the CUDA driver gives a process's streams
/// when [`prepare_gpu_environment`] sets them: the most it allows.
pub const CUDA_DEVICE_MAX_CONNECTIONS: &str = "32";

/// Settings the CUDA driver reads once, when it creates a context, so
/// they must be in place before any: `CUDA_DEVICE_MAX_CONNECTIONS`
/// ([`CUDA_DEVICE_MAX_CONNECTIONS`] unless already set), so that every
/// rank's stream has a hardware queue of its own — with the driver's
/// default of 8, the streams of more than 8 ranks on one GPU share queues
/// and a launch can wait behind another rank's, which spins waiting for
/// it. The CLI calls it first thing.
///
/// # Safety
/// Call before any other thread exists and before CUDA is used: it sets
/// an environment variable, which another thread reading the environment
/// at the same time could see torn.
pub unsafe fn prepare_gpu_environment() {
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        // SAFETY: the caller's promise: no other thread exists.
        unsafe { std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", CUDA_DEVICE_MAX_CONNECTIONS) };
    }
}

/// Where the CUDA executor keeps its compiled kernel between processes
/// (`CudaConfig::kernel_cache`): `FERROCOLL_KERNEL_CACHE` (`off`, `0` or
/// empty: nowhere), else the user's cache folder.
pub fn kernel_cache() -> Option<std::path::PathBuf> {
    kernel_cache_with(|k| std::env::var_os(k))
}

fn kernel_cache_with(
    get: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    if let Some(v) = get("FERROCOLL_KERNEL_CACHE") {
        return match v.to_str() {
            Some("") | Some("0") | Some("off") => None,
            _ => Some(PathBuf::from(v)),
        };
    }
    let base = get("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| get("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("ferrocoll").join("kernels"))
}

/// The log level `FERROCOLL_LOG` asks for when it is one level (default:
/// `warn`). [`crate::log::init`] takes per-module directives as well.
pub fn log_level() -> tracing::Level {
    match std::env::var("FERROCOLL_LOG").as_deref().map(str::trim) {
        Ok("error") => tracing::Level::ERROR,
        Ok("info") => tracing::Level::INFO,
        Ok("debug") | Ok("1") => tracing::Level::DEBUG,
        Ok("trace") => tracing::Level::TRACE,
        _ => tracing::Level::WARN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "topo")]
    fn the_network_is_a_rate_or_a_file_and_bad_values_are_errors() {
        use crate::network::Network;
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(network_with(env(&[])).unwrap(), None);
        assert_eq!(
            network_with(env(&[("FERROCOLL_NET_GBPS", " 10 ")])).unwrap(),
            Some(Network::Rate(10.0))
        );
        assert_eq!(
            network_with(env(&[("FERROCOLL_CLUSTER", "/c.json")])).unwrap(),
            Some(Network::File("/c.json".into()))
        );
        for bad in ["0", "fast", "inf"] {
            let e =
                network_with(|k| (k == "FERROCOLL_NET_GBPS").then(|| bad.to_owned())).unwrap_err();
            assert!(e.to_string().contains("FERROCOLL_NET_GBPS: `"), "{e}");
        }
        let both = &[("FERROCOLL_NET_GBPS", "1"), ("FERROCOLL_CLUSTER", "/c")];
        assert!(network_with(env(both)).is_err());
    }

    #[test]
    fn the_kernel_cache_follows_the_variable_then_the_users_cache() {
        use std::ffi::OsString;
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let p = |s: &str| Some(std::path::PathBuf::from(s));
        assert_eq!(
            kernel_cache_with(env(&[("FERROCOLL_KERNEL_CACHE", "/k"), ("HOME", "/h")])),
            p("/k")
        );
        assert_eq!(
            kernel_cache_with(env(&[("FERROCOLL_KERNEL_CACHE", "off"), ("HOME", "/h")])),
            None
        );
        assert_eq!(
            kernel_cache_with(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
            p("/x/ferrocoll/kernels")
        );
        assert_eq!(
            kernel_cache_with(env(&[("HOME", "/h")])),
            p("/h/.cache/ferrocoll/kernels")
        );
        assert_eq!(kernel_cache_with(env(&[])), None);
    }

    /// torchrun's agent holds MASTER_PORT: rank 0 finds it taken, and is
    /// told why and what to do instead of a bare "address in use".
    #[test]
    fn under_torchruns_agent_store_the_taken_port_is_explained() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port().to_string();
        let env = move |k: &str| match k {
            "RANK" => Some("0".to_owned()),
            "WORLD_SIZE" => Some("2".to_owned()),
            "MASTER_ADDR" => Some("127.0.0.1".to_owned()),
            "MASTER_PORT" => Some(port.clone()),
            "TORCHELASTIC_USE_AGENT_STORE" => Some("True".to_owned()),
            _ => None,
        };
        let err = bootstrap(env, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, EnvError::AgentStore { .. }), "{err}");
        assert!(err.to_string().contains("ferrocoll launch"), "{err}");
    }

    #[test]
    fn the_env_bootstrap_checks_its_variables() {
        let t = Duration::from_millis(200);
        let env = |pairs: Vec<(&'static str, String)>| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        let err = bootstrap(env(vec![]), t).unwrap_err();
        assert!(matches!(err, EnvError::Missing { name: "RANK" }), "{err}");
        let err = bootstrap(
            env(vec![("RANK", "3".into()), ("WORLD_SIZE", "2".into())]),
            t,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                EnvError::RankOutOfRange {
                    rank: 3,
                    world_size: 2
                }
            ),
            "{err}"
        );
        let err = bootstrap(
            env(vec![("RANK", "x".into()), ("WORLD_SIZE", "2".into())]),
            t,
        )
        .unwrap_err();
        assert!(
            matches!(err, EnvError::Number { name: "RANK", .. }),
            "{err}"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let vars = vec![
            ("RANK", "1".to_owned()),
            ("WORLD_SIZE", "2".to_owned()),
            ("MASTER_ADDR", "127.0.0.1".to_owned()),
            ("MASTER_PORT", port.to_string()),
        ];
        let err = bootstrap(env(vars), t).unwrap_err();
        assert!(matches!(err, EnvError::Rendezvous(_)), "{err}");
    }

    #[test]
    fn a_launched_process_needs_a_rank_and_the_store_address() {
        let with = |vars: &[&str]| launched_with(|k| vars.contains(&k));
        assert!(with(&["MASTER_ADDR", "RANK"]));
        assert!(with(&["MASTER_ADDR", "SLURM_PROCID"]));
        assert!(with(&["MASTER_ADDR", "OMPI_COMM_WORLD_RANK"]));
        assert!(!with(&["RANK", "WORLD_SIZE"]), "no store to meet at");
        assert!(!with(&["MASTER_ADDR"]), "no rank");
        assert!(!with(&[]));
    }

    #[test]
    fn slurm_and_openmpi_launches_are_understood() {
        let t = Duration::from_millis(200);
        let env = |pairs: Vec<(&'static str, &'static str)>| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        // Out of range is checked before the store is reached, with the
        // launcher's own numbers.
        for (rank, size) in [
            ("SLURM_PROCID", "SLURM_NTASKS"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ] {
            let err = bootstrap(env(vec![(rank, "5"), (size, "4")]), t).unwrap_err();
            assert!(
                matches!(
                    err,
                    EnvError::RankOutOfRange {
                        rank: 5,
                        world_size: 4
                    }
                ),
                "{err}"
            );
            let err = bootstrap(env(vec![(rank, "1"), (size, "x")]), t).unwrap_err();
            assert!(
                matches!(err, EnvError::Number { name, .. } if name == size),
                "{err}"
            );
            // Past the numbers, the store's address is what is missing.
            let err = bootstrap(env(vec![(rank, "1"), (size, "4")]), t).unwrap_err();
            assert!(
                matches!(
                    err,
                    EnvError::Missing {
                        name: "MASTER_ADDR"
                    }
                ),
                "{err}"
            );
        }
        // torchrun's variables win when both are set.
        let err = bootstrap(
            env(vec![
                ("RANK", "9"),
                ("WORLD_SIZE", "2"),
                ("SLURM_PROCID", "0"),
            ]),
            t,
        )
        .unwrap_err();
        assert!(
            matches!(err, EnvError::RankOutOfRange { rank: 9, .. }),
            "{err}"
        );
    }
}
