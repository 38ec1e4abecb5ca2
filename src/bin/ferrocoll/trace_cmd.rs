//! `ferrocoll trace DIR`: the flight recorder's dumps of every rank
//! (written under `FERROCOLL_TRACE_DIR`), read together: per group, the
//! first call the ranks do not all finish and where each rank is with it,
//! calls the ranks describe differently, each rank's last finished call.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use ferrocoll::trace::merge::{RankAt, read_dir};

#[derive(Args)]
pub(crate) struct TraceArgs {
    /// The directory the ranks dumped into (their `FERROCOLL_TRACE_DIR`;
    /// copy every host's dumps into one directory first).
    dir: PathBuf,
}

/// Print the report; exit 1 when some group has a call not every rank
/// finished (a hang or a failure to look at), 0 when none has.
pub(crate) fn run(args: &TraceArgs) -> Result<ExitCode, String> {
    let report = read_dir(&args.dir).map_err(|e| e.to_string())?;
    print!("{report}");
    let troubled = report.groups.iter().any(|g| {
        g.stuck
            .as_ref()
            .is_some_and(|s| s.ranks.iter().any(|(_, at)| *at != RankAt::Done))
    });
    Ok(if troubled {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
