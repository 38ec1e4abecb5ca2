//! Seeing what ferrocoll decides, in a program of your own.
//!
//! ferrocoll logs through `tracing`; with no subscriber installed nothing
//! prints. One line at the top of `main` installs one at the level
//! `FERROCOLL_LOG` names (default `warn`):
//!
//! ```
//! ferrocoll::log::init();
//! // FERROCOLL_LOG=debug: one line per call, with the algorithm and why.
//! ```
//!
//! A program that already installs its own subscriber keeps it (`init`
//! then does nothing); ferrocoll's debug lines come from the targets
//! `ferrocoll_core`, `ferrocoll_process` and so on.

/// Install a subscriber printing to stderr at the level `FERROCOLL_LOG`
/// asks for. Returns `false` (and changes nothing) when the program has
/// already installed one.
pub fn init() -> bool {
    tracing_subscriber::fmt()
        .with_max_level(crate::env::log_level())
        .with_writer(std::io::stderr)
        .try_init()
        .is_ok()
}
