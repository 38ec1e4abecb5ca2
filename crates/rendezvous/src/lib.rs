//! # ferrocoll-rendezvous
//!
//! Where the processes of a group meet before they can talk: a small
//! key/value store served over TCP by rank 0, with `set`, `get`, `add`
//! (an atomic counter) and `wait` (a `get` that waits for the key), every
//! network wait bounded by a timeout. torch.distributed's `env://`
//! bootstrap works the same way; the facade reads `RANK`, `WORLD_SIZE`,
//! `MASTER_ADDR` and `MASTER_PORT` and calls [`Store::join`].
//!
//! | What | Where |
//! |---|---|
//! | client: join, set, get, add, wait, barrier | [`Store`] |
//! | server, its options and bounds | [`Server`], [`ServerOptions`], [`Limits`] |
//! | the job secret and its proofs | [`JobSecret`] |
//! | errors | [`StoreError`] |
//!
//! ## Authentication
//! A job may share a secret, [`JobSecret`] (any bytes), read from
//! `FERROCOLL_JOB_SECRET` (`ferrocoll launch` puts 32 random bytes there, as
//! hex). When rank 0 has one, both ends prove they know it before any
//! request: the server sends a fresh random nonce, the client answers with
//! its own nonce and HMAC-SHA-256(secret, client label ‖ both nonces), and
//! the server, once it has checked that, answers with
//! HMAC-SHA-256(secret, server label ‖ both nonces). The client sends
//! nothing more to a server that cannot ([`StoreError::Impostor`]: a
//! process that took the port before rank 0 learns no key). The secret
//! never crosses the network, a recorded answer is useless for any other
//! nonce, and neither side's proof passes for the other's. A client
//! holding a secret refuses a store that does not ask for one. Without a
//! secret the store is **unauthenticated**: anyone who can reach the port
//! can read and write it — fine on a trusted, single-user host, not
//! otherwise. The traffic itself is not encrypted.
//!
//! ## Wire format (version 3)
//! On connect the server speaks first:
//! - greeting (22 bytes): `fcst`, version (1 byte: 3), auth (1 byte: 0 no
//!   secret asked, 1 HMAC-SHA-256 proofs asked), the server's nonce (16
//!   bytes);
//! - hello (52 bytes, client): `fccl`, the client's nonce (16 bytes),
//!   proof (32 bytes; zeros when none is asked);
//! - answer (33 bytes, server): verdict (0 accepted, 1 wrong secret, 2 too
//!   many connections, 3 not a hello; on anything but 0 the server
//!   closes), then the server's proof (32 bytes; zeros without a secret or
//!   on a refusal).
//!
//! Then one request, one reply, on the persistent connection: request = op
//! (1 byte: 1 set, 2 get, 3 add, 4 delete every key with this prefix), key
//! length (u32 LE), key, value length
//! (u32 LE), value; reply = status (1 byte: 0 ok/found, 1 missing, 2 key
//! too long, 3 value too long, 4 store full, 5 bad request), value length
//! (u32 LE), value. `add`'s value and reply are an i64 LE, a delete's reply the number of keys
//! removed (u64 LE); a too-long
//! reply's value is the cap as a u64 LE; a full or bad-request reply's is
//! a message. After a too-long or bad request the server closes the
//! connection (it did not read the rest).
//!
//! ## Bounds ([`Limits`], defaults in the constants below)
//! Keys up to [`MAX_KEY_BYTES`], values up to [`MAX_VALUE_BYTES`], at most
//! [`MAX_KEYS`] keys and [`MAX_STORE_BYTES`] in all (requests being read
//! count against it before their bodies are read, and a body is buffered
//! only as it arrives). At most [`MAX_CONNECTIONS`] authenticated
//! connections (so at most that many ranks per job); at most
//! [`MAX_PENDING`] still authenticating, the oldest closed when more come,
//! each given [`HANDSHAKE_TIMEOUT`] to authenticate. A request, once begun,
//! must arrive within [`FRAME_TIMEOUT`]; between requests a connection may
//! idle. Failed `accept`s (out of file descriptors) back off, 2 ms growing
//! to 200 ms, instead of spinning.
//!
//! Invariant: no call blocks longer than the store's timeout; a server or
//! client that goes away is an error on the other side, never a hang; no
//! input from the network makes the server panic or allocate beyond its
//! bounds.

#[cfg(test)]
mod attacks;
mod error;
mod protocol;
mod secret;
mod server;
mod store;

pub use error::StoreError;
#[doc(hidden)]
pub use protocol::fuzz_server;
pub use protocol::{
    ENTRY_OVERHEAD_BYTES, FRAME_TIMEOUT, HANDSHAKE_TIMEOUT, Limits, MAX_CONNECTIONS, MAX_KEY_BYTES,
    MAX_KEYS, MAX_PENDING, MAX_STORE_BYTES, MAX_VALUE_BYTES,
};
pub use secret::{
    JobSecret, NONCE_BYTES, PROOF_BYTES, constant_time_eq, hex, random_bytes, random_hex,
};
pub use server::{Server, ServerOptions};
pub use store::Store;
