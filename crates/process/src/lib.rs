//! # ferrocoll-process
//!
//! ferrocoll's collectives with ranks as **processes**: the same verified
//! schedules the in-process executor runs, moved over a link per peer —
//!
//! - **shared memory** (`shm`): ranks of one host; each rank's incoming
//!   links are bounded rings of slots in a tmpfs segment every rank maps,
//!   so a message costs one copy;
//! - **TCP** (`tcp`): any hosts; one connection per pair of ranks, with
//!   credits keeping each link to the verifier's bounded buffering;
//! - **MPI** (`mpi`, feature `mpi`): MPI point-to-point on a communicator
//!   the group owns, for ranks `mpirun` started (the `mpi` module);
//!
//! by default shared memory inside each host and TCP (or, in a group
//! formed over MPI, MPI) across hosts.
//!
//! Processes meet through the rendezvous store
//! ([`ferrocoll_rendezvous::Store`]; the facade's `env://` bootstrap and
//! `ferrocoll launch` set it up):
//!
//! ```no_run
//! use ferrocoll_core::comm::{Communicator, CommunicatorExt};
//! use ferrocoll_core::ReduceOp;
//! use ferrocoll_process::{ProcessCommunicator, ProcessConfig};
//! use ferrocoll_rendezvous::Store;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (rank, world) = (0, 4); // from RANK and WORLD_SIZE
//! let store = Store::join("127.0.0.1:29500", rank, std::time::Duration::from_secs(30))?;
//! let mut comm = ProcessCommunicator::connect(store, rank, world, &ProcessConfig::default())?;
//! let mut grads = vec![1.0f32; 1 << 20];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! # Ok(()) }
//! ```
//!
//! ## Invariants
//! - Every link holds at most `slots_per_link` unconsumed messages, in
//!   order — the buffering model the verifier proved each schedule
//!   deadlock-free under.
//! - Every message carries its call's number and description; a peer that
//!   called something else is a [`CommError::Mismatch`](ferrocoll_core::comm::CommError::Mismatch)
//!   on the first message, not a hang.
//! - No wait outlasts the timeout; a rank that fails tells its peers, and
//!   a peer that dies (killed, crashed, connection closed) is an error on
//!   every survivor, well within the timeout.
//! - Every rank must pass the same [`ProcessConfig`] (checked when the
//!   group forms) and make the same calls in the same order.

mod across_hosts;
mod agree;
mod cluster;
mod communicator;
mod config;
mod heap_plan;
pub mod launch_note;
mod layout;
#[cfg(feature = "mpi")]
pub mod mpi;
mod one_shot;
mod panic_note;
mod point_to_point;
mod setup;
mod transport;

#[cfg(feature = "mpi")]
pub(crate) use mpi::MpiGroup;
#[cfg(not(feature = "mpi"))]
pub(crate) use no_mpi::MpiGroup;

/// Without the `mpi` feature no group forms over MPI: its handle is a
/// type without values, so every path that would use one is dead code.
#[cfg(not(feature = "mpi"))]
mod no_mpi {
    /// No MPI in this build.
    #[derive(Clone)]
    pub(crate) enum MpiGroup {}

    impl MpiGroup {
        pub(crate) fn size(&self) -> u32 {
            match *self {}
        }
    }
}

pub use cluster::{ClusterModel, SharedClusterModel};
pub use communicator::{AbortHandle, ProcessCommunicator};
pub use config::{NetKind, ProcessConfig, TransportKind};
pub use layout::HostLayout;
pub use setup::SetupError;
pub use transport::shm::heap::SharedBuffer;

/// Entry points for the fuzz targets (`fuzz/`): the TCP transport's frame
/// reader and its connection handshake. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::setup::fuzz_hello;
    pub use crate::transport::tcp::fuzz_frames;
}
