//! The CUDA executor across processes: each process one rank on its
//! own GPU (as `ferrocoll launch` starts them), joined through the
//! `env://` store.

use std::time::{Duration, Instant};

use ferrocoll_cuda::CudaCommunicator;
use ferrocoll_cuda::ipc::{self, Exchange};
use ferrocoll_cuda::{CudaConfig, CudaError};
use ferrocoll_rendezvous::Store;
use thiserror::Error;

use super::{EnvError, bootstrap_from_env};

/// Why a process could not join a CUDA executor group.
#[derive(Debug, Error)]
pub enum CudaJoinError {
    /// The `env://` variables or the rendezvous.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// Setting up the rank: CUDA, the GPU, or a peer that failed to.
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// The ranks' bytes through the store: each under `prefix/key/rank`,
/// where the prefix numbers the groups these processes joined (a rank's
/// n-th join meets the others' n-th), so no group reads another's keys.
struct StoreExchange {
    store: Store,
    rank: u32,
    world: u32,
    prefix: String,
}

impl StoreExchange {
    fn new(mut store: Store, rank: u32, world: u32) -> Result<Self, CudaJoinError> {
        let joins = store
            .add(&format!("ferrocoll-interpreter/joins/{rank}"), 1)
            .map_err(EnvError::Rendezvous)?;
        Ok(StoreExchange {
            store,
            rank,
            world,
            prefix: format!("ferrocoll-interpreter/{joins}"),
        })
    }

    fn left(&self) -> String {
        format!("{}/left", self.prefix)
    }
}

impl Exchange for StoreExchange {
    fn all_gather(&mut self, key: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        let key = format!("{}/{key}", self.prefix);
        let err = |e: ferrocoll_rendezvous::StoreError| format!("{key}: {e}");
        self.store
            .set(&format!("{key}/{}", self.rank), mine)
            .map_err(err)?;
        let keys: Vec<String> = (0..self.world).map(|r| format!("{key}/{r}")).collect();
        self.store.wait_all(&keys).map_err(err)
    }
}

impl Drop for StoreExchange {
    fn drop(&mut self) {
        // Rank 0 serves the store: it stays up (a few seconds at most)
        // until every other rank is done with it, so a peer reads why a
        // join failed, or meets the others to close, rather than finding
        // the store gone.
        let left = self.left();
        if self.rank != 0 {
            let _ = self.store.add(&left, 1);
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let others = i64::from(self.world.saturating_sub(1));
        while Instant::now() < deadline {
            match self.store.add(&left, 0) {
                Ok(n) if n < others => std::thread::sleep(Duration::from_millis(10)),
                _ => return,
            }
        }
    }
}

/// This process's rank of a CUDA executor group over the processes
/// the `env://` variables describe, on GPU `LOCAL_RANK` (or the only one
/// it sees). Each process holds one rank on its own GPU; ranks sharing a
/// GPU belong in one process (`ferrocoll::cuda::group`).
pub fn cuda_communicator_from_env(config: &CudaConfig) -> Result<CudaCommunicator, CudaJoinError> {
    let b = bootstrap_from_env(config.planning.timeout.max(Duration::from_secs(1)))?;
    let job = ferrocoll_core::settings::EnvOverrides::read()
        .map_err(EnvError::from)?
        .job_id;
    let device = super::nccl::device_for(
        b.local_rank,
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
    );
    let exchange = Box::new(StoreExchange::new(b.store, b.rank, b.world_size)?);
    Ok(ipc::join(
        b.rank,
        b.world_size,
        device,
        config,
        exchange,
        job.as_deref(),
    )?)
}
