//! NCCL across processes through the `env://` store: one process per GPU
//! (the device is `LOCAL_RANK`), rank 0 makes the communicator's unique id
//! and publishes it in the store, every other rank reads it there. A rank
//! 0 that cannot make one (no NCCL, no GPU) publishes why, so the others
//! fail with the same reason at once instead of waiting out the timeout.

use std::time::Duration;

use ferrocoll_nccl::{NcclCommunicator, NcclConfig, NcclError, UniqueId};
use ferrocoll_rendezvous::{Store, StoreError};
use thiserror::Error;

use super::{EnvError, bootstrap_from_env};

/// The store key of a communicator's id; `name` tells communicators
/// sharing one store apart.
fn key(name: &str) -> String {
    format!("nccl/unique-id/{name}")
}

/// A published id starts with this byte; a failure with `FAILED`.
const ID: u8 = 1;
const FAILED: u8 = 2;

/// Why joining an NCCL communicator from the environment failed.
#[derive(Debug, Error)]
pub enum NcclJoinError {
    /// The `env://` variables or the rendezvous.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The store, while exchanging the unique id.
    #[error("exchanging the NCCL unique id: {0}")]
    Store(#[from] StoreError),
    /// Rank 0 could not make the unique id (this rank learned why from
    /// the store).
    #[error("rank 0 could not make the NCCL unique id: {0}")]
    Root(String),
    /// NCCL itself, on this rank.
    #[error(transparent)]
    Nccl(#[from] NcclError),
}

/// The unique id of communicator `name`: made by `make` on rank 0 and
/// published, read from the store elsewhere. Rank 0's failure is
/// published too, and returned on every rank. A name is used once per
/// store: a second exchange under it would hand the ranks other than 0
/// the first id.
pub fn exchange_unique_id(
    store: &mut Store,
    rank: u32,
    world_size: u32,
    name: &str,
    make: impl FnOnce() -> Result<Vec<u8>, String>,
) -> Result<Vec<u8>, NcclJoinError> {
    let key = key(name);
    if rank == 0 {
        return match make() {
            Ok(id) => {
                store.set(&key, &[&[ID][..], &id].concat())?;
                Ok(id)
            }
            Err(why) => {
                store.set(&key, &[&[FAILED][..], why.as_bytes()].concat())?;
                wait_until_read(store, &key, world_size);
                Err(NcclJoinError::Root(why))
            }
        };
    }
    let value = store.wait(&key)?;
    match value.split_first() {
        Some((&ID, id)) => Ok(id.to_vec()),
        Some((&FAILED, why)) => {
            // Best effort: the reason is known, and rank 0 may be gone.
            let _ = store.add(&read_key(&key), 1);
            Err(NcclJoinError::Root(String::from_utf8_lossy(why).into()))
        }
        _ => Err(NcclJoinError::Store(StoreError::Protocol(format!(
            "`{key}` holds {} bytes that are not an NCCL unique id",
            value.len()
        )))),
    }
}

/// The counter of ranks that read a published failure.
fn read_key(key: &str) -> String {
    format!("{key}/failure-read")
}

/// The longest rank 0 keeps its store up for the others to read its
/// failure: rank 0 hosts the store, and exiting at once would leave them
/// a closed connection instead of the reason.
const FAILURE_GRACE: Duration = Duration::from_secs(5);

/// Wait (at most [`FAILURE_GRACE`]) until every other rank read the
/// failure published under `key`. Best effort: the failure itself is
/// already this rank's error.
fn wait_until_read(store: &mut Store, key: &str, world_size: u32) {
    let deadline = std::time::Instant::now() + FAILURE_GRACE;
    let others = i64::from(world_size.saturating_sub(1));
    while std::time::Instant::now() < deadline {
        match store.add(&read_key(key), 0) {
            Ok(read) if read < others => std::thread::sleep(Duration::from_millis(5)),
            _ => return,
        }
    }
}

/// This process's rank of an NCCL communicator over every process of the
/// `env://` group, on the GPU numbered `LOCAL_RANK` — what `ferrocoll
/// launch -n N -- …` gives one process per GPU.
///
/// ```no_run
/// use ferrocoll::nccl::NcclConfig;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let comm = ferrocoll::env::nccl_communicator_from_env(&NcclConfig::default())?;
/// # let _ = comm;
/// # Ok(()) }
/// ```
pub fn nccl_communicator_from_env(config: &NcclConfig) -> Result<NcclCommunicator, NcclJoinError> {
    let mut b = bootstrap_from_env(config.timeout.max(Duration::from_secs(1)))?;
    let id = exchange_unique_id(&mut b.store, b.rank, b.world_size, "world", || {
        ferrocoll_nccl::unique_id()
            .map(|id| id.to_bytes())
            .map_err(|e| e.to_string())
    })?;
    let id = UniqueId::from_bytes(&id)?;
    let device = device_for(
        b.local_rank,
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
    );
    Ok(NcclCommunicator::init(
        &id,
        b.rank,
        b.world_size,
        device,
        config,
    )?)
}

/// The GPU a rank takes: `LOCAL_RANK` among those it sees — or the only
/// one, when a scheduler shows each process a single GPU
/// (`CUDA_VISIBLE_DEVICES=3`).
pub(crate) fn device_for(local_rank: u32, visible: Option<&str>) -> usize {
    match visible {
        Some(v) if v.split(',').filter(|d| !d.trim().is_empty()).count() == 1 => 0,
        _ => local_rank as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` ranks' stores; rank 0's serves (on a free port), as in a job.
    fn group(n: u32) -> Vec<Store> {
        let t = Duration::from_secs(10);
        let root = Store::join_with("127.0.0.1:0", 0, t, None).unwrap();
        let addr = root.server_addr().unwrap().to_string();
        std::iter::once(root)
            .chain((1..n).map(|r| Store::join_with(&addr, r, t, None).unwrap()))
            .collect()
    }

    /// `f` on every rank's store at once, each on its own thread.
    fn on_every_rank<T: Send>(
        stores: Vec<Store>,
        f: impl Fn(u32, &mut Store) -> T + Sync,
    ) -> Vec<T> {
        std::thread::scope(|s| {
            let f = &f;
            let handles: Vec<_> = stores
                .into_iter()
                .enumerate()
                .map(|(r, mut store)| s.spawn(move || f(r as u32, &mut store)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn every_rank_gets_rank_zeros_id() {
        let ids = on_every_rank(group(4), |r, store| {
            exchange_unique_id(store, r, 4, "world", || Ok(vec![7u8; 128])).unwrap()
        });
        assert!(ids.iter().all(|id| id == &vec![7u8; 128]));
    }

    #[test]
    fn rank_zeros_failure_reaches_every_rank_at_once() {
        let started = std::time::Instant::now();
        let errors = on_every_rank(group(3), |r, store| {
            exchange_unique_id(store, r, 3, "world", || {
                Err("NCCL not found: no candidate".into())
            })
            .unwrap_err()
            .to_string()
        });
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "nobody waited out the timeout"
        );
        for e in errors {
            assert!(
                e.contains("rank 0 could not make") && e.contains("NCCL not found"),
                "{e}"
            );
        }
    }

    /// Rank 0 hosts the store: returning at once after its failure would
    /// leave late ranks a closed connection instead of the reason.
    #[test]
    fn rank_zero_keeps_its_store_up_until_late_ranks_read_its_failure() {
        let errors = on_every_rank(group(3), |r, store| {
            if r != 0 {
                std::thread::sleep(Duration::from_millis(300));
            }
            let e = exchange_unique_id(store, r, 3, "late", || Err("no GPU".into()));
            e.unwrap_err().to_string()
        });
        for e in errors {
            assert!(
                e.contains("rank 0 could not make") && e.contains("no GPU"),
                "{e}"
            );
        }
    }

    #[test]
    fn each_rank_takes_its_local_gpu_or_the_only_one_it_sees() {
        assert_eq!(device_for(3, None), 3);
        assert_eq!(device_for(3, Some("0,1,2,3")), 3);
        assert_eq!(device_for(3, Some("5")), 0);
        assert_eq!(device_for(2, Some("")), 2);
    }

    #[test]
    fn a_garbled_id_in_the_store_is_an_error_not_a_panic() {
        let mut stores = group(2);
        stores[0].set(&key("odd"), b"").unwrap();
        let e = exchange_unique_id(&mut stores[1], 1, 2, "odd", || unreachable!()).unwrap_err();
        assert!(e.to_string().contains("not an NCCL unique id"), "{e}");
    }

    /// Without NCCL (a machine without the wheel), joining is a typed error
    /// naming what is missing, on every rank, never a panic or a hang.
    #[test]
    fn without_nccl_joining_fails_clearly_on_every_rank() {
        if ferrocoll_nccl::unique_id().is_ok() {
            return; // NCCL is here: the other tests cover the exchange.
        }
        let errors = on_every_rank(group(2), |r, store| {
            exchange_unique_id(store, r, 2, "world", || {
                ferrocoll_nccl::unique_id()
                    .map(|id| id.to_bytes())
                    .map_err(|e| e.to_string())
            })
            .unwrap_err()
            .to_string()
        });
        assert!(
            errors.iter().all(|e| e.contains("rank 0 could not make")),
            "{errors:?}"
        );
    }
}
