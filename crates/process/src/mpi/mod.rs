//! MPI as an engine under a process group (feature `mpi`): ranks started
//! by `mpirun` (or any MPI launcher) form a group inside `MPI_Init`, and
//! messages between hosts — or between every pair, with
//! [`TransportKind::Mpi`](crate::TransportKind::Mpi) — go as MPI
//! non-blocking sends and receives on a communicator the group owns (a
//! duplicate of `MPI_COMM_WORLD`, so nothing of the program's own MPI
//! traffic can match ours).
//!
//! ```no_run
//! use ferrocoll_core::comm::CommunicatorExt;
//! use ferrocoll_core::ReduceOp;
//! use ferrocoll_process::mpi::Mpi;
//! use ferrocoll_process::{ProcessCommunicator, ProcessConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // mpirun -n 4 ./train
//! let mpi = Mpi::init()?;
//! let mut comm = ProcessCommunicator::connect_mpi(&mpi, &ProcessConfig::default())?;
//! let mut grads = vec![1.0f32; 1 << 20];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! # Ok(()) }
//! ```
//!
//! ## Invariants
//! - MPI is initialized once per process and finalized once, after the
//!   last group that uses it is gone (each holds an [`Mpi`]); a program
//!   that initialized MPI itself keeps that duty.
//! - The group's setup (settings agreed, hosts found, shared memory
//!   inside a host) meets in the same rendezvous store as every process
//!   group; rank 0 serves it and tells the others where by an MPI
//!   broadcast, with a fresh job secret, so no `MASTER_ADDR` is needed.
//! - Every call into MPI is in `raw.rs`; the group's communicators
//!   return errors instead of aborting, so a failed call on them is a
//!   typed error (calls on `MPI_COMM_WORLD` before the duplicate exists
//!   keep the program's handler).
//! - `MPI_THREAD_MULTIPLE` or nothing: an abort, and a split's parent and
//!   child, may call MPI from different threads.

mod bootstrap;
pub(crate) mod raw;

use std::sync::{Arc, Mutex, Weak};

use thiserror::Error;

pub use raw::Threading;

/// Why MPI could not be used.
#[derive(Debug, Error)]
pub enum MpiError {
    /// MPI was finalized in this process: it cannot start again.
    #[error("MPI was already finalized in this process; it cannot be initialized again")]
    Finalized,
    /// An MPI call failed.
    #[error("{call} failed: {reason}")]
    Call {
        /// The MPI function.
        call: &'static str,
        /// The library's words.
        reason: String,
    },
    /// A collective step of forming the group did not complete in time
    /// (a rank never joined it).
    #[error("{what} did not complete within the group's timeout (did every rank start?)")]
    Timeout {
        /// The step.
        what: &'static str,
    },
    /// MPI was initialized without `MPI_THREAD_MULTIPLE`, which ferrocoll
    /// needs (an abort, a split's parent and its child may call MPI from
    /// different threads).
    #[error(
        "MPI grants {granted:?} threading; ferrocoll's MPI links need MPI_THREAD_MULTIPLE (initialize MPI with it, or let ferrocoll do it)"
    )]
    Threading {
        /// The level granted.
        granted: Threading,
    },
    /// Rank 0 could not serve the group's rendezvous store, or a rank
    /// could not reach it.
    #[error("forming the group over MPI: {reason}")]
    Bootstrap {
        /// Why.
        reason: String,
    },
}

/// MPI initialized for this process (see the module docs): cheap to clone;
/// the last clone dropped finalizes MPI when this crate initialized it.
#[derive(Clone)]
pub struct Mpi {
    inner: Arc<Inner>,
}

struct Inner {
    /// Whether this crate initialized MPI (and so finalizes it).
    owned: bool,
    threading: Threading,
    library: String,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.owned {
            // Under the lock, so no `init` meanwhile joins an MPI that is
            // being finalized.
            let _live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            raw::finalize();
        }
    }
}

/// The live handle, so a second `init` shares it.
static LIVE: Mutex<Weak<Inner>> = Mutex::new(Weak::new());

impl Mpi {
    /// Initialize MPI (asking for `MPI_THREAD_MULTIPLE`, so an abort from
    /// another thread reaches peers at once), or join the MPI the program
    /// already initialized.
    pub fn init() -> Result<Mpi, MpiError> {
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(inner) = live.upgrade() {
            return Ok(Mpi { inner });
        }
        let (initialized, finalized) = raw::state();
        if finalized {
            return Err(MpiError::Finalized);
        }
        let (owned, threading) = if initialized {
            (false, raw::threading())
        } else {
            (true, raw::init(Threading::Multiple)?)
        };
        let inner = Arc::new(Inner {
            owned,
            threading,
            library: raw::library_version(),
        });
        *live = Arc::downgrade(&inner);
        Ok(Mpi { inner })
    }

    /// Which threads may call MPI, as granted.
    pub fn threading(&self) -> Threading {
        self.inner.threading
    }

    /// Ranks in `MPI_COMM_WORLD`.
    pub fn world_size(&self) -> Result<u32, MpiError> {
        raw::world_size()
    }

    /// The MPI library's name and version, as it reports them.
    pub fn library(&self) -> &str {
        &self.inner.library
    }

    /// Whether this process runs under an MPI launcher (`mpirun`,
    /// `srun --mpi`): the variables OpenMPI, MPICH and PMIx set.
    pub fn launched() -> bool {
        [
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
            "PMIX_RANK",
            "MPI_LOCALNRANKS",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    }
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi")
            .field("library", &self.inner.library)
            .field("threading", &self.inner.threading)
            .finish()
    }
}

/// What a group formed over MPI keeps: MPI itself (so it outlives the
/// group's communicators) and the group's communicator.
#[derive(Clone)]
pub(crate) struct MpiGroup {
    /// The messages' communicator. Declared first: dropped (and, the last
    /// clone, freed) before `mpi`, which may finalize MPI.
    pub comm: Arc<raw::Comm>,
    /// The same ranks, only for making the communicators of a split: the
    /// transport matches any tag on `comm`, which would take the messages
    /// `MPI_Comm_create_group` exchanges there.
    ctl: Arc<raw::Comm>,
    pub mpi: Mpi,
}

impl MpiGroup {
    /// Its ranks.
    pub fn size(&self) -> u32 {
        self.comm.size()
    }

    /// A duplicate of `MPI_COMM_WORLD` for a new group, and the store its
    /// setup meets in; every collective step given up after `timeout`.
    pub fn world(
        mpi: &Mpi,
        timeout: std::time::Duration,
    ) -> Result<(MpiGroup, ferrocoll_rendezvous::Store), MpiError> {
        if mpi.threading() != Threading::Multiple {
            return Err(MpiError::Threading {
                granted: mpi.threading(),
            });
        }
        let deadline = std::time::Instant::now() + timeout;
        let comm = raw::Comm::dup_world(deadline)?;
        let ctl = raw::Comm::dup_world(deadline)?;
        let store = bootstrap::store(&comm, timeout, deadline)?;
        Ok((
            MpiGroup {
                comm: Arc::new(comm),
                ctl: Arc::new(ctl),
                mpi: mpi.clone(),
            },
            store,
        ))
    }

    /// The group of `members` (ranks of this group, in the new group's
    /// rank order), formed by the members alone once they agreed on it;
    /// this rank must be one of them, at position `rank`.
    pub fn part(&self, members: &[u32], rank: u32) -> Result<MpiGroup, MpiError> {
        let comm = self.ctl.subset(members)?;
        let ctl = self.ctl.subset(members)?;
        if comm.rank() != rank || comm.size() as usize != members.len() {
            return Err(MpiError::Call {
                call: "MPI_Comm_create_group",
                reason: format!(
                    "made rank {} of {}, where the split agreed on rank {rank} of {}",
                    comm.rank(),
                    comm.size(),
                    members.len()
                ),
            });
        }
        Ok(MpiGroup {
            comm: Arc::new(comm),
            ctl: Arc::new(ctl),
            mpi: self.mpi.clone(),
        })
    }
}
