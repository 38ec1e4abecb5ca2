//! Why the rendezvous failed: shared by the store's client and its server.

use std::net::SocketAddr;
use std::time::Duration;

use thiserror::Error;

/// Why the rendezvous failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    /// Rank 0 could not listen: another process holds the port.
    #[error(
        "rendezvous: {addr} is already in use (another job on this MASTER_PORT? pick a free one)"
    )]
    AddressInUse {
        /// The address.
        addr: SocketAddr,
    },
    /// No server answered at the address within the timeout.
    #[error(
        "rendezvous: no store at {addr} within {timeout:?} (is rank 0 running, and MASTER_ADDR/MASTER_PORT the same everywhere?)"
    )]
    Unreachable {
        /// Where we looked.
        addr: String,
        /// How long.
        timeout: Duration,
    },
    /// A key did not appear within the timeout.
    #[error("rendezvous: key `{key}` did not appear within {timeout:?} (a rank missing or dead?)")]
    Timeout {
        /// The key.
        key: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// The address does not parse or resolve.
    #[error("rendezvous: bad address `{0}`")]
    BadAddress(String),
    /// The connection broke (the server went away).
    #[error("rendezvous: connection lost: {0}")]
    Io(String),
}
