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
    /// The connection failed in a way other than the store closing it
    /// (a timeout, a reset mid-request).
    #[error("rendezvous: connection lost: {0}")]
    Io(String),
    /// The store closed the connection: rank 0, which hosts it, exited or
    /// crashed (or closed this connection for breaking the protocol).
    #[error(
        "rendezvous: the store at {addr} closed the connection (rank 0, which hosts it, exited or crashed?)"
    )]
    Closed {
        /// The store's address.
        addr: String,
    },
    /// The store accepted a request and did not answer it within the
    /// timeout: rank 0, which hosts it, is frozen (stopped, swapping) or
    /// overloaded. The connection is not used again.
    #[error(
        "rendezvous: the store at {addr} did not answer within {timeout:?} (rank 0, which hosts it, stopped or overloaded?)"
    )]
    Unresponsive {
        /// The store's address.
        addr: String,
        /// How long the request waited.
        timeout: Duration,
    },
    /// The store asks for the job secret and this process has none.
    #[error(
        "rendezvous: the store at {addr} requires the job secret, and FERROCOLL_JOB_SECRET is not set in this process"
    )]
    SecretRequired {
        /// The store's address.
        addr: String,
    },
    /// The store refused this process's job secret.
    #[error(
        "rendezvous: the store at {addr} refused this process's job secret (FERROCOLL_JOB_SECRET differs from rank 0's: another job's store?)"
    )]
    BadSecret {
        /// The store's address.
        addr: String,
    },
    /// This process has a job secret but the store does not ask for one: it
    /// is not this job's store, or rank 0 was started without the secret.
    #[error(
        "rendezvous: the store at {addr} does not ask for a job secret, but FERROCOLL_JOB_SECRET is set here (another job's store, or rank 0 started without it?)"
    )]
    Unauthenticated {
        /// The store's address.
        addr: String,
    },
    /// The server admitted this process without proving that it knows
    /// the job secret: not this job's store (a process that took the port
    /// first?). Nothing was sent to it.
    #[error(
        "rendezvous: the server at {addr} admitted this process but did not prove it knows the job secret: not this job's store (did another process take MASTER_PORT first?); nothing was sent to it"
    )]
    Impostor {
        /// The server's address.
        addr: String,
    },
    /// The store holds its maximum of connections.
    #[error(
        "rendezvous: the store at {addr} holds its maximum of connections (more than {max} processes joined?)"
    )]
    Busy {
        /// The store's address.
        addr: String,
        /// The server's default bound (it may be configured lower).
        max: usize,
    },
    /// A key or value longer than the store takes.
    #[error("rendezvous: {what} of {len} bytes is too large (the store takes at most {max})")]
    TooLarge {
        /// `"key"` or `"value"`.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The store is at its cap of keys or bytes.
    #[error("rendezvous: the store is full: {0}")]
    Full(String),
    /// The other side does not speak this protocol (not a ferrocoll store,
    /// another version, or a request the store could not parse).
    #[error("rendezvous: protocol error: {0}")]
    Protocol(String),
}
