//! The one place ferrocoll reads environment variables.
//!
//! | variable | effect |
//! |---|---|
//! | `FERROCOLL_ALGO` | force an algorithm: `ring`, `tree`, `direct`, `halving-doubling` (or `auto`) |
//! | `FERROCOLL_TIMEOUT_MS` | the CPU executor's wait timeout, in milliseconds |
//! | `FERROCOLL_LOG` | log level of the CLI: `error`, `warn`, `info`, `debug` (one line per collective), `trace` |

use std::time::Duration;

use ferrocoll_core::cpu::CpuConfig;
use ferrocoll_core::{Algorithm, ParseNameError};
use thiserror::Error;

/// An environment variable with a value ferrocoll cannot use.
#[derive(Debug, Error)]
pub enum EnvError {
    /// `FERROCOLL_ALGO` names no algorithm.
    #[error("FERROCOLL_ALGO: {0}")]
    Algorithm(#[from] ParseNameError),
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
    apply(base, |k| std::env::var(k).ok())
}

fn apply(
    mut config: CpuConfig,
    get: impl Fn(&str) -> Option<String>,
) -> Result<CpuConfig, EnvError> {
    if let Some(v) = get("FERROCOLL_ALGO") {
        config.algorithm = match v.trim() {
            "" | "auto" => None,
            name => Some(name.parse::<Algorithm>()?),
        };
    }
    if let Some(v) = get("FERROCOLL_TIMEOUT_MS") {
        let ms = v.trim().parse::<u64>().map_err(|_| EnvError::Number {
            name: "FERROCOLL_TIMEOUT_MS",
            value: v.clone(),
        })?;
        config.timeout = Duration::from_millis(ms);
    }
    Ok(config)
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
    fn overrides_apply_and_bad_values_are_errors() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = apply(
            CpuConfig::default(),
            env(&[("FERROCOLL_ALGO", "ring"), ("FERROCOLL_TIMEOUT_MS", "250")]),
        )
        .unwrap();
        assert_eq!(c.algorithm, Some(Algorithm::Ring));
        assert_eq!(c.timeout, Duration::from_millis(250));
        let c = apply(CpuConfig::default(), env(&[("FERROCOLL_ALGO", "auto")])).unwrap();
        assert_eq!(c.algorithm, None);
        let e = apply(CpuConfig::default(), env(&[("FERROCOLL_ALGO", "rung")])).unwrap_err();
        assert!(e.to_string().contains("FERROCOLL_ALGO"), "{e}");
        assert!(
            apply(
                CpuConfig::default(),
                env(&[("FERROCOLL_TIMEOUT_MS", "soon")])
            )
            .is_err()
        );
    }
}
