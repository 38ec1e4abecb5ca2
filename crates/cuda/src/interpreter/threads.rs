//! Ranks of one process as threads: what both executors' `run` do.

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

/// Run `f` on every communicator, one thread each; a rank that errors or
/// panics is handed to `failed` (which fails its group, so its peers do
/// not wait for it), and a panic becomes that rank's error.
pub(crate) fn run_ranks<C, R, F>(
    comms: Vec<C>,
    rank_of: impl Fn(&C) -> Rank + Sync,
    f: &F,
    failed: impl Fn(&mut C, &CommError) + Sync,
) -> Vec<Result<R, CommError>>
where
    C: Send,
    R: Send,
    F: Fn(&mut C) -> Result<R, CommError> + Sync,
{
    let (rank_of, failed) = (&rank_of, &failed);
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                scope.spawn(move || {
                    let rank = rank_of(&comm);
                    let out =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut comm)));
                    let out = out.unwrap_or_else(|_| {
                        Err(CommError::PeerFailed {
                            rank,
                            reason: "panicked".into(),
                        })
                    });
                    if let Err(e) = &out {
                        failed(&mut comm, e);
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(CommError::PeerFailed {
                        rank: 0,
                        reason: "a rank's thread died".into(),
                    })
                })
            })
            .collect()
    })
}
