//! `ferrocoll rendezvous`: check the `env://` bootstrap. Every process
//! joins rank 0's store, publishes its host and pid, waits for all, and
//! prints the group it sees. Run it under `ferrocoll launch`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct RendezvousArgs {
    /// Seconds to wait for the other ranks.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
}

pub(crate) fn run(args: &RendezvousArgs) -> Result<ExitCode, String> {
    let mut b = ferrocoll::env::bootstrap_from_env(Duration::from_secs(args.timeout))
        .map_err(|e| e.to_string())?;
    let me = format!("pid {}", std::process::id());
    b.store
        .set(&format!("who/{}", b.rank), me.as_bytes())
        .map_err(|e| e.to_string())?;
    b.store
        .barrier("rendezvous", b.world_size)
        .map_err(|e| e.to_string())?;
    let keys: Vec<String> = (0..b.world_size).map(|r| format!("who/{r}")).collect();
    let seen: Vec<String> = b
        .store
        .wait_all(&keys)
        .map_err(|e| e.to_string())?
        .iter()
        .enumerate()
        .map(|(r, v)| format!("{r}={}", String::from_utf8_lossy(v)))
        .collect();
    println!(
        "rank {} of {} (local rank {}): all {} ranks met: {}",
        b.rank,
        b.world_size,
        b.local_rank,
        b.world_size,
        seen.join(", ")
    );
    // Rank 0 hosts the store: it leaves only after every other rank has
    // said it is done with it.
    if b.rank == 0 {
        let left: Vec<String> = (1..b.world_size).map(|r| format!("left/{r}")).collect();
        b.store.wait_all(&left).map_err(|e| e.to_string())?;
    } else {
        b.store
            .set(&format!("left/{}", b.rank), b"")
            .map_err(|e| e.to_string())?;
    }
    Ok(ExitCode::SUCCESS)
}
