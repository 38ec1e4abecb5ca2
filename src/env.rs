//! The environment: the `FERROCOLL_*` settings of
//! [`ferrocoll_core::settings`] (the one configuration layer, which every
//! config's `Default` and `from_env` apply) and the `env://` bootstrap.
//!
//! | variable | effect |
//! |---|---|
//! | `FERROCOLL_ALGO` | force an algorithm: `ring`, `tree`, `direct`, `halving-doubling` (or `auto`) |
//! | `FERROCOLL_TIMEOUT_MS` | the longest any wait lasts, in milliseconds |
//! | `FERROCOLL_LOG` | log level for [`crate::log::init`] and the CLI: `error`, `warn`, `info`, `debug` (one line per call: the algorithm and why), `trace` |
//! | `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT` | the `env://` bootstrap of a multi-process group ([`bootstrap_from_env`]); `ferrocoll launch` sets them |
//! | `FERROCOLL_JOB_SECRET` | the token the store and every TCP connection of a group authenticate with; `ferrocoll launch` sets a random one |
//! | `FERROCOLL_JOB_ID` | names the job's shared-memory segments, so `ferrocoll launch` can remove any a killed rank left behind |

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
        "{name} is not set (start the processes with `ferrocoll launch`, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"
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
/// the `FERROCOLL_*` overrides applied on top of `config`.
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
    let config = config.clone().with_env().map_err(EnvError::from)?;
    let b = bootstrap_from_env(config.timeout)?;
    Ok(ferrocoll_process::ProcessCommunicator::connect(
        b.store,
        b.rank,
        b.world_size,
        &config,
    )?)
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
    let rank = number("RANK", var("RANK")?)?;
    let world_size = number("WORLD_SIZE", var("WORLD_SIZE")?)?;
    if world_size == 0 || rank >= world_size {
        return Err(EnvError::RankOutOfRange { rank, world_size });
    }
    let local_rank = match get("LOCAL_RANK") {
        Some(v) => number("LOCAL_RANK", v)?,
        None => rank,
    };
    let addr = format!(
        "{}:{}",
        var("MASTER_ADDR")?,
        number("MASTER_PORT", var("MASTER_PORT")?)?
    );
    let store = ferrocoll_rendezvous::Store::join(&addr, rank, timeout)?;
    Ok(Bootstrap {
        rank,
        world_size,
        local_rank,
        store,
    })
}

/// The log level `FERROCOLL_LOG` asks for (default: `warn`).
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
}
