//! Seeing what ferrocoll decides, in a program of your own.
//!
//! ferrocoll logs through `tracing`; with no subscriber installed nothing
//! prints. One line at the top of `main` installs one:
//!
//! ```
//! ferrocoll::log::init();
//! // FERROCOLL_LOG=debug: one line per call, with the algorithm and why.
//! ```
//!
//! | variable | effect |
//! |---|---|
//! | `FERROCOLL_LOG` | `tracing-subscriber` `EnvFilter` directives: a level (`error`, `warn` — the default —, `info`, `debug`, `trace`) or per-module ones, `info,ferrocoll_process=debug` |
//! | `RUST_LOG` | the same, when `FERROCOLL_LOG` is unset |
//! | `FERROCOLL_LOG_FILE` | write there instead of stderr (appending); `%h` is the host's name, `%r` the rank (`RANK`, else `x`; `launcher` for `ferrocoll launch` itself), `%p` the process id: `/tmp/fc.%h.%r.log` gives a file per rank |
//! | `FERROCOLL_TIMELINE` | also write a Chrome trace (Perfetto, `chrome://tracing`) of every collective call and gradient bucket to this file (`%h`, `%r`, `%p` as above); [`finish`] completes it, and so does the process's normal exit. `ferrocoll trace --timeline OUT FILE…` merges one file per rank into one trace with a track per rank (`ferrocoll launch` itself writes none) |
//!
//! A program that already installs its own subscriber keeps it (`init`
//! then does nothing); ferrocoll's debug lines come from the targets
//! `ferrocoll_core`, `ferrocoll_process` and so on.

use std::path::PathBuf;
use std::sync::Mutex;

use tracing_chrome::{ChromeLayer, ChromeLayerBuilder, FlushGuard};
use tracing_subscriber::Registry;
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::prelude::*;

/// Install a subscriber filtered by `FERROCOLL_LOG` (or `RUST_LOG`),
/// writing to stderr or to `FERROCOLL_LOG_FILE`. Returns `false` (and
/// changes nothing) when the program has already installed one.
/// Directives that do not parse, or a file that cannot be opened, are
/// reported on stderr and replaced by the defaults (`warn`, stderr):
/// logging never stops a program.
pub fn init() -> bool {
    init_as(std::env::var("RANK").ok(), true)
}

/// [`init`] for `ferrocoll launch`: `%r` in `FERROCOLL_LOG_FILE` becomes
/// `launcher` (it has no `RANK`, and its ranks' files are theirs), and
/// no timeline is written (a launcher runs no collective; its ranks write
/// theirs).
pub fn init_launcher() -> bool {
    init_as(Some("launcher".to_owned()), false)
}

/// [`init`] naming `%r` by `rank`, with the timeline if `timeline`.
fn init_as(rank: Option<String>, timeline_wanted: bool) -> bool {
    let get = |k: &str| std::env::var(k).ok();
    let filter = filter(&directives(get)).unwrap_or_else(|e| {
        eprintln!("ferrocoll: {e}; logging at `warn`");
        EnvFilter::new("warn")
    });
    let file = get("FERROCOLL_LOG_FILE").filter(|p| !p.trim().is_empty());
    let opened = file.map(|pattern| {
        let path = file_path(&pattern, rank.as_deref());
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("FERROCOLL_LOG_FILE: cannot open {}: {e}", path.display()))
    });
    let writer = match opened {
        Some(Ok(file)) => tracing_subscriber::fmt::writer::BoxMakeWriter::new(Mutex::new(file)),
        Some(Err(e)) => {
            eprintln!("ferrocoll: {e}; logging to stderr");
            tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr)
        }
        None => tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr),
    };
    // Plain text: the lines go to pipes and files as often as to a
    // terminal (tracing-chrome turns the `ansi` feature on).
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(writer)
        .with_filter(filter)
        .boxed();
    let mut layers = vec![lines];
    let mut guard = None;
    let wanted = get("FERROCOLL_TIMELINE").filter(|_| timeline_wanted);
    if let Some((layer, g)) = timeline(wanted, rank.as_deref()) {
        layers.push(layer.with_filter(LevelFilter::INFO).boxed());
        guard = Some(g);
    }
    let installed = tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .is_ok();
    if installed && let Some(guard) = guard {
        *TIMELINE.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
        finish_at_exit();
        // Each file counts time from its own start: this mark lets
        // `ferrocoll trace --timeline` line the ranks' files up.
        let unix_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        tracing::info!(target: "ferrocoll::timeline", unix_us, "timeline start");
    }
    installed
}

/// The timeline's writer, until [`finish`].
static TIMELINE: Mutex<Option<FlushGuard>> = Mutex::new(None);

/// Complete the timeline file (`FERROCOLL_TIMELINE`): everything recorded
/// so far is written and the trace closed; later spans are not recorded.
/// A normal exit does it too; call it before `std::process::exit` or when
/// the program may be killed.
pub fn finish() {
    let guard = TIMELINE.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(guard);
}

#[cfg(unix)]
fn finish_at_exit() {
    extern "C" fn at_exit() {
        finish();
    }
    // SAFETY: registers a function without arguments that only takes and
    // drops the guard (joining its writer thread), to run at exit.
    unsafe { libc::atexit(at_exit) };
}

#[cfg(not(unix))]
fn finish_at_exit() {}

/// The Chrome-trace layer `FERROCOLL_TIMELINE` asks for, if the file opens.
fn timeline(
    pattern: Option<String>,
    rank: Option<&str>,
) -> Option<(ChromeLayer<Registry>, FlushGuard)> {
    let pattern = pattern.filter(|p| !p.trim().is_empty())?;
    let path = file_path(&pattern, rank);
    match std::fs::File::create(&path) {
        Ok(file) => Some(
            ChromeLayerBuilder::new()
                .writer(file)
                .include_args(true)
                .include_locations(false)
                .build(),
        ),
        Err(e) => {
            eprintln!(
                "ferrocoll: FERROCOLL_TIMELINE: cannot create {}: {e}; no timeline",
                path.display()
            );
            None
        }
    }
}

/// The directives in force: `FERROCOLL_LOG`, else `RUST_LOG`, else `warn`
/// (`1`, an older spelling of `debug`, still means it).
fn directives(get: impl Fn(&str) -> Option<String>) -> String {
    let set = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    match set("FERROCOLL_LOG").or_else(|| set("RUST_LOG")) {
        Some(v) if v.trim() == "1" => "debug".to_owned(),
        Some(v) => v.trim().to_owned(),
        None => "warn".to_owned(),
    }
}

fn filter(directives: &str) -> Result<EnvFilter, String> {
    EnvFilter::builder()
        .parse(directives)
        .map_err(|e| format!("log directives `{directives}` do not parse ({e})"))
}

/// `pattern` with `%h`, `%r` and `%p` filled in.
fn file_path(pattern: &str, rank: Option<&str>) -> PathBuf {
    let rank = rank.map(str::trim).filter(|r| !r.is_empty()).unwrap_or("x");
    PathBuf::from(
        pattern
            .replace("%h", &ferrocoll_core::host::name())
            .replace("%r", rank)
            .replace("%p", &std::process::id().to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn directives_come_from_ferrocoll_log_then_rust_log_then_warn() {
        assert_eq!(directives(env(&[])), "warn");
        assert_eq!(directives(env(&[("RUST_LOG", "info")])), "info");
        let both = [
            ("FERROCOLL_LOG", "info,ferrocoll_process=debug"),
            ("RUST_LOG", "trace"),
        ];
        assert_eq!(directives(env(&both)), "info,ferrocoll_process=debug");
        assert_eq!(directives(env(&[("FERROCOLL_LOG", "1")])), "debug");
        assert!(filter("info,ferrocoll_process=debug").is_ok());
        let e = filter("ferrocoll_core=loud").unwrap_err();
        assert!(e.contains("ferrocoll_core=loud"), "{e}");
    }

    #[test]
    fn a_log_file_per_rank_names_its_host_rank_and_process() {
        let p = file_path("/tmp/fc.%h.%r.%p.log", Some("3"));
        let name = p.to_string_lossy();
        assert!(
            name.starts_with("/tmp/fc.") && name.contains(".3."),
            "{name}"
        );
        assert!(
            name.ends_with(&format!(".{}.log", std::process::id())),
            "{name}"
        );
        assert!(!name.contains('%'), "{name}");
        assert!(file_path("/l.%r", None).ends_with("l.x"));
    }
}
