//! The one configuration layer: the `FERROCOLL_*` environment variables,
//! read here and nowhere else, applied the same way by every entry point —
//! [`CpuConfig::default`](crate::cpu::CpuConfig), `ProcessConfig::default`,
//! the facade's `from_env` functions and the `ferrocoll` CLI.
//!
//! | variable | effect |
//! |---|---|
//! | `FERROCOLL_ALGO` | force an algorithm: `ring`, `tree`, `direct`, `halving-doubling`, or `auto` (the default: the selector decides); or NCCL_ALGO's forms ([`crate::select::AlgoFilter`]): a list the selector picks among (`ring,tree`), exclusions (`^direct`), per collective (`allreduce:tree;broadcast:ring,direct`) |
//! | `FERROCOLL_PROTO` | the CUDA executor's protocols, in NCCL_PROTO's forms ([`crate::select::ProtoFilter`]): `LL` or `Simple` forces one, `^LL` excludes, `allreduce:LL;broadcast:simple` per collective; names in any case; `LL128` (NCCL's) is refused by name. Unset, the topology selector picks per size (calls up to `CudaConfig::ll_max_bytes` take LL without one). Host executors have one protocol and ignore it |
//! | `FERROCOLL_TIMEOUT_MS` | the longest any wait lasts, in milliseconds (default 600000, 10 minutes, as torch.distributed with NCCL: a rank may checkpoint between calls; a lost peer is noticed without it) |
//! | `FERROCOLL_JOB_ID` | names a process group's shared-memory segments, so the launcher that set it can remove what killed ranks left (letters and digits; anything else is ignored) |
//! | `FERROCOLL_KERNELS` | force the host kernels instead of timing them ([`crate::kernels::calibration`]): a width for every call (`baseline`, `avx2`, `avx512`; output stores then by the call's regime: cached within half the last-level cache, non-temporal past it; hand-offs by their size), or the width and the stores too (`nt`, `cached`) for outputs, then optionally for hand-offs, e.g. `avx2,cached` or `avx512,nt,cached`; or per regime, `in:avx512,cached;past:avx2,nt` (a regime not named is timed; `;handoff:nt` forces hand-offs). One this CPU cannot run is ignored with a warning. `ferrocoll launch` times both regimes once and passes its choice to every rank it starts (unless it is set already), each regime with the rate it was timed at (`in:avx512,cached@34.2;past:avx2,nt@21.0`), so all ranks of a job run the same kernels and each rank's kernel watch ([`crate::kernels::KernelWatch`]) knows what to expect; a regime forced without a rate is never switched at run time |
//! | `FERROCOLL_ONE_SHOT_BYTES` | threads and processes over shared memory: calls whose world size × input bytes is at most this take the one-shot small-message protocol (default 65536; 0 turns it off) |
//! | `FERROCOLL_PEER_READS` | no longer read (set to anything but 0, a warning says so, once): cross-memory attach between processes was removed (docs/benchmarks.md); buffers in the shared heap are the zero-copy path |
//! | `FERROCOLL_TRACE_BUFFER` | calls each communicator's flight recorder keeps ([`crate::trace`]; default 2000, 0 for none) |
//! | `FERROCOLL_TRACE_DIR` | where every rank writes its flight recorder's dump on a failed call, when its communicator is dropped, and on `SIGUSR1` (`ferrocoll trace DIR` merges them) |
//! | `FERROCOLL_SUMMARY` | `1`: when a communicator goes away, rank 0 prints per collective and size the calls its flight recorder holds: count, latency percentiles, bus bandwidth |
//! | `FERROCOLL_LOG` | what the facade's `log::init` and the CLI log: a level (`error`, `warn` (default), `info`, `debug` (one line per call: the algorithm and why), `trace`) or `tracing-subscriber` `EnvFilter` directives such as `info,ferrocoll_process=debug` (`RUST_LOG` when unset); `FERROCOLL_LOG_FILE` writes a file per rank (`%h` host, `%r` rank, `%p` pid) |
//!
//! A forced algorithm that cannot express a collective (tree for an
//! all-to-all, say) does not fail that call: the selector picks one that
//! can, with a warning in the log.

use std::time::Duration;

use thiserror::Error;

use crate::algorithms::Algorithm;
use crate::error::ParseNameError;
use crate::select::{AlgoFilter, ProtoFilter};

/// A `FERROCOLL_*` variable with a value ferrocoll cannot use.
#[derive(Debug, Clone, Error)]
pub enum SettingsError {
    /// `FERROCOLL_ALGO` names no algorithm.
    #[error("FERROCOLL_ALGO: {0}")]
    Algorithm(#[from] ParseNameError),
    /// `FERROCOLL_ALGO`'s NCCL form has a token that names nothing.
    #[error("FERROCOLL_ALGO: {0}")]
    AlgorithmRules(String),
    /// `FERROCOLL_PROTO` has a token that names nothing, or allows no
    /// protocol.
    #[error("FERROCOLL_PROTO: {0}")]
    Protocols(String),
    /// A number that does not parse, or is 0 where a wait needs a length.
    #[error("{name}: `{value}` is not a whole number of at least 1")]
    Number {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// A number that does not parse or lies past the largest allowed.
    #[error("{name}: `{value}` is not a whole number from 0 to {max}")]
    Range {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// The largest allowed.
        max: usize,
    },
}

/// The largest `FERROCOLL_ONE_SHOT_BYTES` accepted: each rank stages
/// twice this much.
pub const MAX_ONE_SHOT_BYTES: usize = 16 << 20;

/// What the environment overrides; `None` leaves a setting alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvOverrides {
    /// `FERROCOLL_ALGO` naming one algorithm for every collective:
    /// `Some(None)` is `auto` (and the NCCL forms, which go to
    /// `algorithms`).
    pub algorithm: Option<Option<Algorithm>>,
    /// `FERROCOLL_ALGO` in NCCL_ALGO's forms: lists, `^` exclusions,
    /// per-collective rules (`Some(None)`: none, the variable set
    /// otherwise).
    pub algorithms: Option<Option<AlgoFilter>>,
    /// `FERROCOLL_PROTO` (`Some(None)`: set to nothing).
    pub protocols: Option<Option<ProtoFilter>>,
    /// `FERROCOLL_TIMEOUT_MS`.
    pub timeout: Option<Duration>,
    /// `FERROCOLL_JOB_ID`, when it is a non-empty run of ASCII letters and
    /// digits (it becomes part of file names).
    pub job_id: Option<String>,
    /// `FERROCOLL_ONE_SHOT_BYTES`.
    pub one_shot_bytes: Option<usize>,
    /// `FERROCOLL_HOST_ID`: which host this process is on, when the
    /// system's own answer (hostname, boot id, namespaces) is not wanted;
    /// trimmed, non-empty, at most 255 printable ASCII characters.
    pub host_id: Option<String>,
}

/// Calls a flight recorder keeps unless `FERROCOLL_TRACE_BUFFER` says
/// otherwise: 2000 calls of a training step's gradient buckets cover
/// minutes of a run.
pub const DEFAULT_TRACE_CAPACITY: usize = 2000;

/// The flight recorder's settings (see [`crate::trace`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSettings {
    /// `FERROCOLL_TRACE_BUFFER`: calls each communicator keeps (default
    /// [`DEFAULT_TRACE_CAPACITY`]; 0 records nothing).
    pub capacity: usize,
    /// `FERROCOLL_TRACE_DIR`: where ranks write their dumps; `None`:
    /// nowhere (the ring is still kept, for `FlightRecorder::calls`).
    pub dir: Option<std::path::PathBuf>,
    /// `FERROCOLL_SUMMARY` (`1`): rank 0 prints a per-collective summary
    /// of the calls its ring holds when its communicator goes away.
    pub summary: bool,
}

/// The flight recorder's settings from the environment; a malformed
/// buffer size is warned about once and the default kept.
pub fn trace_settings() -> TraceSettings {
    trace_settings_from(|k| std::env::var(k).ok())
}

fn trace_settings_from(get: impl Fn(&str) -> Option<String>) -> TraceSettings {
    let capacity = match get("FERROCOLL_TRACE_BUFFER") {
        None => DEFAULT_TRACE_CAPACITY,
        Some(v) => v.trim().parse::<usize>().unwrap_or_else(|_| {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "FERROCOLL_TRACE_BUFFER=`{v}` is not a whole number; keeping {} calls",
                    DEFAULT_TRACE_CAPACITY
                )
            });
            DEFAULT_TRACE_CAPACITY
        }),
    };
    // Past a million calls a ring is a memory leak, not a record.
    let capacity = capacity.min(1 << 20);
    let dir = get("FERROCOLL_TRACE_DIR")
        .filter(|d| !d.trim().is_empty())
        .map(std::path::PathBuf::from);
    let summary = get("FERROCOLL_SUMMARY").is_some_and(|v| !matches!(v.trim(), "" | "0"));
    TraceSettings {
        capacity,
        dir,
        summary,
    }
}

/// `FERROCOLL_KERNELS`, unparsed (the kernels module parses it and
/// checks it against the CPU).
pub fn kernels_override() -> Option<String> {
    std::env::var("FERROCOLL_KERNELS").ok()
}

impl EnvOverrides {
    /// The overrides this process's environment sets.
    pub fn read() -> Result<EnvOverrides, SettingsError> {
        EnvOverrides::from_lookup(|k| std::env::var(k).ok())
    }

    /// The overrides `get` reports (tests pass a map instead of the environment).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let (mut algorithm, mut algorithms) = (None, None);
        if let Some(v) = get("FERROCOLL_ALGO") {
            algorithms = Some(None);
            match v.trim() {
                "" | "auto" => algorithm = Some(None),
                // NCCL_ALGO's forms: lists, `^` exclusions, `coll:algos;…`.
                rules if rules.contains([',', ';', ':', '^']) => {
                    algorithm = Some(None);
                    algorithms =
                        Some(AlgoFilter::parse(rules).map_err(SettingsError::AlgorithmRules)?);
                }
                name => algorithm = Some(Some(name.parse::<Algorithm>()?)),
            }
        }
        let protocols = get("FERROCOLL_PROTO")
            .map(|v| ProtoFilter::parse(&v).map_err(SettingsError::Protocols))
            .transpose()?;
        let timeout = match get("FERROCOLL_TIMEOUT_MS") {
            None => None,
            // A zero timeout would fail every wait at once (and sockets
            // refuse it outright): refused like any other bad value.
            Some(v) => match v.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Some(Duration::from_millis(ms)),
                _ => {
                    return Err(SettingsError::Number {
                        name: "FERROCOLL_TIMEOUT_MS",
                        value: v.clone(),
                    });
                }
            },
        };
        let job_id = get("FERROCOLL_JOB_ID")
            .filter(|j| !j.is_empty() && j.chars().all(|c| c.is_ascii_alphanumeric()));
        let one_shot_bytes = match get("FERROCOLL_ONE_SHOT_BYTES") {
            None => None,
            // Staging is allocated at this size per rank: bounded.
            Some(v) => match v.trim().parse::<usize>() {
                Ok(b) if b <= MAX_ONE_SHOT_BYTES => Some(b),
                _ => {
                    return Err(SettingsError::Range {
                        name: "FERROCOLL_ONE_SHOT_BYTES",
                        value: v.clone(),
                        max: MAX_ONE_SHOT_BYTES,
                    });
                }
            },
        };
        let host_id = get("FERROCOLL_HOST_ID")
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty() && h.len() <= 255 && h.chars().all(|c| c.is_ascii_graphic()));
        let asks_peer_reads = get("FERROCOLL_PEER_READS")
            .is_some_and(|v| !matches!(v.trim(), "" | "0" | "false" | "off"));
        if asks_peer_reads {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "FERROCOLL_PEER_READS is ignored: cross-memory attach was removed (slower \
                     than the shared-memory slots where measured); buffers in the shared heap \
                     are the zero-copy path"
                );
            });
        }
        Ok(EnvOverrides {
            algorithm,
            algorithms,
            protocols,
            timeout,
            job_id,
            one_shot_bytes,
            host_id,
        })
    }

    /// The overrides of this process's environment for a `Default` impl,
    /// which cannot fail: a malformed variable is logged and ignored
    /// (the `from_env` constructors return it as an error instead).
    pub fn read_or_warn() -> EnvOverrides {
        EnvOverrides::read().unwrap_or_else(|e| {
            tracing::warn!("ignoring the environment: {e}");
            EnvOverrides::default()
        })
    }

    /// Apply to the two settings every backend has.
    /// The NCCL-form `FERROCOLL_ALGO` rules, where the variable is set.
    pub fn apply_algorithms(&self, algorithms: &mut Option<AlgoFilter>) {
        if let Some(a) = &self.algorithms {
            *algorithms = a.clone();
        }
    }

    /// The `FERROCOLL_PROTO` rules, where the variable is set.
    pub fn apply_protocols(&self, protocols: &mut Option<ProtoFilter>) {
        if let Some(p) = &self.protocols {
            *protocols = p.clone();
        }
    }

    /// `FERROCOLL_ALGO` (one algorithm) and `FERROCOLL_TIMEOUT_MS`, where set.
    pub fn apply(&self, algorithm: &mut Option<Algorithm>, timeout: &mut Duration) {
        if let Some(a) = self.algorithm {
            *algorithm = a;
        }
        if let Some(t) = self.timeout {
            *timeout = t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn overrides_parse_and_bad_values_are_errors() {
        let o = EnvOverrides::from_lookup(env(&[
            ("FERROCOLL_ALGO", "ring"),
            ("FERROCOLL_TIMEOUT_MS", "250"),
            ("FERROCOLL_JOB_ID", "ab12"),
        ]))
        .unwrap();
        assert_eq!(o.algorithm, Some(Some(Algorithm::Ring)));
        assert_eq!(o.job_id.as_deref(), Some("ab12"));
        // A job id becomes part of a file name: anything but letters and
        // digits is ignored, never a path.
        let bad_id = EnvOverrides::from_lookup(env(&[("FERROCOLL_JOB_ID", "../x")])).unwrap();
        assert_eq!(bad_id.job_id, None);
        assert_eq!(o.timeout, Some(Duration::from_millis(250)));
        let (mut a, mut t) = (None, Duration::from_secs(60));
        o.apply(&mut a, &mut t);
        assert_eq!((a, t), (Some(Algorithm::Ring), Duration::from_millis(250)));
        let auto = EnvOverrides::from_lookup(env(&[("FERROCOLL_ALGO", "auto")])).unwrap();
        assert_eq!(auto.algorithm, Some(None));
        let e = EnvOverrides::from_lookup(env(&[("FERROCOLL_ALGO", "rung")])).unwrap_err();
        assert!(e.to_string().contains("FERROCOLL_ALGO"), "{e}");
        let e = EnvOverrides::from_lookup(env(&[("FERROCOLL_PROTO", "LL128")])).unwrap_err();
        assert!(
            matches!(&e, SettingsError::Protocols(m) if m.contains("LL128")),
            "{e}"
        );
        let ll = EnvOverrides::from_lookup(env(&[("FERROCOLL_PROTO", "allreduce:LL")])).unwrap();
        assert_eq!(ll.protocols.unwrap().unwrap().to_string(), "allreduce:LL");
        for bad in [
            &[("FERROCOLL_TIMEOUT_MS", "soon")],
            &[("FERROCOLL_TIMEOUT_MS", "0")],
            &[("FERROCOLL_TIMEOUT_MS", "-1")],
        ] {
            let e = EnvOverrides::from_lookup(env(bad)).unwrap_err();
            assert!(e.to_string().contains("FERROCOLL_TIMEOUT_MS"), "{e}");
        }
        assert_eq!(
            EnvOverrides::from_lookup(env(&[])).unwrap(),
            EnvOverrides::default()
        );
        // A variable of a removed feature is not an error.
        let gone = EnvOverrides::from_lookup(env(&[("FERROCOLL_PEER_READS", "1")])).unwrap();
        assert_eq!(gone, EnvOverrides::default());
        let off = EnvOverrides::from_lookup(env(&[("FERROCOLL_ONE_SHOT_BYTES", "0")])).unwrap();
        assert_eq!(off.one_shot_bytes, Some(0));
        for bad in [
            &[("FERROCOLL_ONE_SHOT_BYTES", "lots")],
            &[("FERROCOLL_ONE_SHOT_BYTES", "-5")],
            &[("FERROCOLL_ONE_SHOT_BYTES", "1000000000000")],
        ] {
            let e = EnvOverrides::from_lookup(env(bad)).unwrap_err();
            assert!(matches!(e, SettingsError::Range { .. }), "{bad:?}: {e}");
        }
    }
}
