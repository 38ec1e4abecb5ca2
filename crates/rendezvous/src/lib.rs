//! # ferrocoll-rendezvous
//!
//! Where the processes of a group meet before they can talk: a small
//! key/value store served over TCP by rank 0, with `set`, `get`, `add`
//! (an atomic counter) and `wait` (a `get` that waits for the key), every
//! network wait bounded by a timeout. torch.distributed's `env://`
//! bootstrap works the same way; the facade reads `RANK`, `WORLD_SIZE`,
//! `MASTER_ADDR` and `MASTER_PORT` and calls [`Store::join`].
//!
//! Wire format (one request, one reply, on a persistent connection):
//! request = op (1 byte: 1 set, 2 get, 3 add), key length (u32 LE), key,
//! value length (u32 LE), value; reply = status (1 byte: 0 found, 1
//! missing), value length (u32 LE), value. `add`'s value and reply are an
//! i64 LE.
//!
//! Invariant: no call blocks longer than the store's timeout; a server or
//! client that goes away is an error on the other side, never a hang.

mod error;
mod server;
mod store;

pub use error::StoreError;
pub use server::Server;
pub use store::Store;

/// Largest key or value accepted, so a garbled stream cannot ask for an
/// absurd allocation.
pub const MAX_LEN: u32 = 64 << 20;
