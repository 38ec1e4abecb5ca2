//! The store's wire format and its in-memory table, as pure functions over
//! `impl Read` and plain data, so the server, the client and the fuzz
//! target share one parser (see the crate docs for the format).

use std::collections::HashMap;
use std::io::{self, Read};
use std::time::Duration;

use crate::secret::{JobSecret, NONCE_BYTES, PROOF_BYTES};

/// The server's greeting starts with these bytes.
pub(crate) const GREETING_MAGIC: [u8; 4] = *b"fcst";
/// The client's hello starts with these bytes.
pub(crate) const HELLO_MAGIC: [u8; 4] = *b"fccl";
/// The wire format's version, in the greeting.
pub(crate) const VERSION: u8 = 3;
/// Greeting: magic, version, whether a proof is asked for, nonce.
pub(crate) const GREETING_BYTES: usize = 4 + 1 + 1 + NONCE_BYTES;
/// Hello: magic, the client's nonce, proof (zeros when none is asked for).
pub(crate) const HELLO_BYTES: usize = 4 + NONCE_BYTES + PROOF_BYTES;
/// The server's answer: the verdict, then its own proof (zeros when no
/// secret is asked for, or the verdict is a refusal).
pub(crate) const ANSWER_BYTES: usize = 1 + PROOF_BYTES;

/// What the client proves knowledge of the secret over: this label, then
/// the server's nonce and the client's.
const PROOF_LABEL: &[u8] = b"ferrocoll-store-v3 client";
/// What the server proves it over, likewise: another label, so that a
/// client's proof never passes for a server's.
const SERVER_LABEL: &[u8] = b"ferrocoll-store-v3 server";

/// Greeting flag: no secret is asked for.
pub(crate) const AUTH_NONE: u8 = 0;
/// Greeting flag: the hello must carry an HMAC-SHA-256 proof.
pub(crate) const AUTH_HMAC: u8 = 1;

/// The server's answer to a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Admission {
    /// Welcome: requests may follow.
    Accepted = 0,
    /// The proof is wrong; the server closes the connection.
    BadSecret = 1,
    /// The server holds its maximum of connections; it closes this one.
    Busy = 2,
    /// The hello is not a ferrocoll store hello; the server closes.
    BadHello = 3,
}

impl Admission {
    pub(crate) fn from_byte(b: u8) -> Option<Admission> {
        [
            Admission::Accepted,
            Admission::BadSecret,
            Admission::Busy,
            Admission::BadHello,
        ]
        .into_iter()
        .find(|a| *a as u8 == b)
    }
}

/// Request operations.
pub(crate) const OP_SET: u8 = 1;
pub(crate) const OP_GET: u8 = 2;
pub(crate) const OP_ADD: u8 = 3;
/// Remove every key that starts with the request's key.
pub(crate) const OP_DELETE_PREFIX: u8 = 4;

/// Reply statuses.
pub(crate) const REPLY_OK: u8 = 0;
pub(crate) const REPLY_MISSING: u8 = 1;
pub(crate) const REPLY_KEY_TOO_LONG: u8 = 2;
pub(crate) const REPLY_VALUE_TOO_LONG: u8 = 3;
pub(crate) const REPLY_FULL: u8 = 4;
pub(crate) const REPLY_BAD_REQUEST: u8 = 5;

/// Largest key the store accepts, in bytes (keys are short names such as
/// `pg/tcp/12`; 4 KiB leaves wide margin).
pub const MAX_KEY_BYTES: usize = 4 << 10;
/// Largest value the store accepts, in bytes (values are addresses, paths,
/// pids and settings strings of well under 1 KiB; 1 MiB leaves margin for
/// a user's own bootstrap data).
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Bytes the store may hold in all, counting every key, value and a fixed
/// overhead per entry ([`ENTRY_OVERHEAD_BYTES`]).
pub const MAX_STORE_BYTES: usize = 64 << 20;
/// Keys the store may hold (a group of `n` ranks sets about `4n`).
pub const MAX_KEYS: usize = 1 << 17;
/// What each entry costs against [`MAX_STORE_BYTES`] beyond its key and
/// value (the map's own bookkeeping, roughly).
pub const ENTRY_OVERHEAD_BYTES: usize = 64;
/// Authenticated connections the server keeps at once. Each rank holds
/// one, so this bounds a job at 4096 ranks per store; it is a bound on
/// the server's threads, not a tuning knob.
pub const MAX_CONNECTIONS: usize = 4096;
/// Connections still authenticating at once; when more arrive, the oldest
/// is closed, so idle strangers cannot keep a rank out (a real client
/// finishes its handshake within a round trip).
pub const MAX_PENDING: usize = 128;
/// Time a new connection has to send its hello.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a started request (or a reply) has to finish crossing the wire.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// The store server's bounds (defaults: the constants of this crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest key, in bytes.
    pub max_key_bytes: usize,
    /// Largest value, in bytes.
    pub max_value_bytes: usize,
    /// Most keys held.
    pub max_keys: usize,
    /// Most bytes held (keys, values and per-entry overhead, plus requests
    /// being read).
    pub max_total_bytes: usize,
    /// Most authenticated connections at once.
    pub max_connections: usize,
    /// Most connections still authenticating; beyond it the oldest goes.
    pub max_pending: usize,
    /// Time a new connection has to authenticate.
    pub handshake_timeout: Duration,
    /// Time a request that has begun has to arrive in full.
    pub frame_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: MAX_KEY_BYTES,
            max_value_bytes: MAX_VALUE_BYTES,
            max_keys: MAX_KEYS,
            max_total_bytes: MAX_STORE_BYTES,
            max_connections: MAX_CONNECTIONS,
            max_pending: MAX_PENDING,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            frame_timeout: FRAME_TIMEOUT,
        }
    }
}

/// The greeting a server sends on a new connection.
pub(crate) fn greeting(auth: bool, nonce: &[u8; NONCE_BYTES]) -> [u8; GREETING_BYTES] {
    let mut g = [0u8; GREETING_BYTES];
    g[..4].copy_from_slice(&GREETING_MAGIC);
    g[4] = VERSION;
    g[5] = if auth { AUTH_HMAC } else { AUTH_NONE };
    g[6..].copy_from_slice(nonce);
    g
}

/// A greeting as the client reads it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Greeting {
    pub auth: bool,
    pub nonce: [u8; NONCE_BYTES],
}

/// Parse a greeting; `None` if it is not a ferrocoll store of this version.
pub(crate) fn parse_greeting(g: &[u8; GREETING_BYTES]) -> Option<Greeting> {
    if g[..4] != GREETING_MAGIC || g[4] != VERSION || g[5] > AUTH_HMAC {
        return None;
    }
    let mut nonce = [0u8; NONCE_BYTES];
    nonce.copy_from_slice(&g[6..]);
    Some(Greeting {
        auth: g[5] == AUTH_HMAC,
        nonce,
    })
}

fn proof_context(label: &[u8], server: &[u8; NONCE_BYTES], client: &[u8; NONCE_BYTES]) -> Vec<u8> {
    [label, server.as_slice(), client.as_slice()].concat()
}

/// The hello a client answers a greeting with: its own fresh nonce (the
/// server proves itself over it) and its proof.
pub(crate) fn hello(
    secret: Option<&JobSecret>,
    server: &[u8; NONCE_BYTES],
    client: &[u8; NONCE_BYTES],
) -> [u8; HELLO_BYTES] {
    let mut h = [0u8; HELLO_BYTES];
    h[..4].copy_from_slice(&HELLO_MAGIC);
    h[4..4 + NONCE_BYTES].copy_from_slice(client);
    if let Some(s) = secret {
        h[4 + NONCE_BYTES..].copy_from_slice(&s.prove(&proof_context(PROOF_LABEL, server, client)));
    }
    h
}

/// The server's verdict on a hello: `Accepted` (before the connection
/// count is checked), `BadSecret` or `BadHello`.
pub(crate) fn check_hello(
    h: &[u8; HELLO_BYTES],
    secret: Option<&JobSecret>,
    server: &[u8; NONCE_BYTES],
) -> Admission {
    if h[..4] != HELLO_MAGIC {
        return Admission::BadHello;
    }
    match secret {
        None => Admission::Accepted,
        Some(s)
            if s.verify(
                &proof_context(PROOF_LABEL, server, &client_nonce(h)),
                &h[4 + NONCE_BYTES..],
            ) =>
        {
            Admission::Accepted
        }
        Some(_) => Admission::BadSecret,
    }
}

fn client_nonce(h: &[u8; HELLO_BYTES]) -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    n.copy_from_slice(&h[4..4 + NONCE_BYTES]);
    n
}

/// The server's answer to a hello: the verdict and, when it admits a
/// client that proved the secret, the server's own proof.
pub(crate) fn answer(
    verdict: Admission,
    secret: Option<&JobSecret>,
    server: &[u8; NONCE_BYTES],
    h: &[u8; HELLO_BYTES],
) -> [u8; ANSWER_BYTES] {
    let mut a = [0u8; ANSWER_BYTES];
    a[0] = verdict as u8;
    if let (Admission::Accepted, Some(s)) = (verdict, secret) {
        a[1..].copy_from_slice(&s.prove(&proof_context(SERVER_LABEL, server, &client_nonce(h))));
    }
    a
}

/// Whether an admitting answer proves that the server knows `secret`
/// (always, without one: nothing to prove).
pub(crate) fn server_proved(
    a: &[u8; ANSWER_BYTES],
    secret: Option<&JobSecret>,
    server: &[u8; NONCE_BYTES],
    client: &[u8; NONCE_BYTES],
) -> bool {
    secret.is_none_or(|s| s.verify(&proof_context(SERVER_LABEL, server, client), &a[1..]))
}

/// A request's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Set,
    Get,
    Add,
    DeletePrefix,
}

/// One request, read in full.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub op: Op,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// Why a request could not be read.
#[derive(Debug)]
pub(crate) enum RequestError {
    /// The stream broke or timed out mid-request.
    Io(io::Error),
    /// The request breaks a bound or the format: answer with this reply
    /// (a status and, for a length over a cap, the cap as a u64 LE; else a
    /// message), then close (the rest of the request is not read).
    Refused(Reply),
    /// The request was read in full (its body discarded) and is answered
    /// with this reply; the connection stays in step.
    Rejected(Reply),
}

impl From<io::Error> for RequestError {
    fn from(e: io::Error) -> Self {
        RequestError::Io(e)
    }
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// Read `len` bytes, growing the buffer only as bytes arrive, so a length
/// that lies costs nothing.
fn read_exactly(r: &mut impl Read, len: usize) -> io::Result<Vec<u8>> {
    let mut v = Vec::with_capacity(len.min(64 << 10));
    r.take(len as u64).read_to_end(&mut v)?;
    if v.len() != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(v)
}

fn too_long(status: u8, max: usize) -> RequestError {
    RequestError::Refused((status, (max as u64).to_le_bytes().to_vec()))
}

fn op_of(byte: u8) -> Result<Op, RequestError> {
    match byte {
        OP_SET => Ok(Op::Set),
        OP_GET => Ok(Op::Get),
        OP_ADD => Ok(Op::Add),
        OP_DELETE_PREFIX => Ok(Op::DeletePrefix),
        other => Err(RequestError::Refused((
            REPLY_BAD_REQUEST,
            format!("unknown operation {other}").into_bytes(),
        ))),
    }
}

/// Read the rest of a request whose first byte was `op`. `admit` is asked,
/// once the lengths are known and before the body is read, whether the
/// store has room for a request of that many bytes.
/// A request as it goes on the wire: op, key length, key, value length,
/// value (lengths u32 LE). Callers keep lengths within the caps, far
/// below `u32::MAX`.
pub(crate) fn request(op: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    let len = |b: &[u8]| u32::try_from(b.len()).unwrap_or(u32::MAX).to_le_bytes();
    let mut v = Vec::with_capacity(9 + key.len() + value.len());
    v.push(op);
    v.extend_from_slice(&len(key));
    v.extend_from_slice(key);
    v.extend_from_slice(&len(value));
    v.extend_from_slice(value);
    v
}

pub(crate) fn read_request_body(
    op: u8,
    r: &mut impl Read,
    limits: &Limits,
    admit: impl FnOnce(usize) -> Result<(), String>,
) -> Result<Request, RequestError> {
    let op = op_of(op)?;
    let key_len = read_u32(r)? as usize;
    if key_len > limits.max_key_bytes {
        return Err(too_long(REPLY_KEY_TOO_LONG, limits.max_key_bytes));
    }
    let key = read_exactly(r, key_len)?;
    let value_len = read_u32(r)? as usize;
    if value_len > limits.max_value_bytes {
        return Err(too_long(REPLY_VALUE_TOO_LONG, limits.max_value_bytes));
    }
    if let Err(why) = admit(key_len + value_len) {
        // Skip the body without keeping it, so the connection stays usable.
        let skipped = io::copy(&mut r.take(value_len as u64), &mut io::sink())?;
        if skipped != value_len as u64 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        }
        return Err(RequestError::Rejected((REPLY_FULL, why.into_bytes())));
    }
    let value = read_exactly(r, value_len)?;
    Ok(Request { op, key, value })
}

/// Read one whole request; `Ok(None)` at a clean end of stream. The fuzz
/// target's entry point (the server reads the first byte itself, to time
/// the rest).
pub(crate) fn read_request(
    r: &mut impl Read,
    limits: &Limits,
) -> Result<Option<Request>, RequestError> {
    let mut op = [0u8; 1];
    if r.read(&mut op)? == 0 {
        return Ok(None);
    }
    read_request_body(op[0], r, limits, |_| Ok(())).map(Some)
}

/// A reply: status and value.
pub(crate) type Reply = (u8, Vec<u8>);

/// The store's contents, with what they cost against the bounds.
#[derive(Debug, Default)]
pub(crate) struct Table {
    map: HashMap<Vec<u8>, Vec<u8>>,
    /// Bytes held: keys, values and per-entry overhead.
    bytes: usize,
    /// Bytes of requests being read (admitted, not yet applied).
    reserved: usize,
}

fn cost(key: &[u8], value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD_BYTES
}

impl Table {
    /// Bytes held (keys, values, overhead).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keys held.
    pub fn keys(&self) -> usize {
        self.map.len()
    }

    /// Set aside room for a request of `len` bytes being read, if there is
    /// room; give it back with [`release`](Self::release).
    pub fn reserve(&mut self, len: usize, limits: &Limits) -> Result<(), String> {
        let after = self.bytes + self.reserved + len;
        if after > limits.max_total_bytes {
            return Err(full_bytes(limits));
        }
        self.reserved += len;
        Ok(())
    }

    /// Give back room set aside by [`reserve`](Self::reserve).
    pub fn release(&mut self, len: usize) {
        self.reserved = self.reserved.saturating_sub(len);
    }

    /// Carry out a request.
    pub fn apply(&mut self, req: Request, limits: &Limits) -> Reply {
        match req.op {
            Op::Set => match self.put(req.key, req.value, limits) {
                Ok(()) => (REPLY_OK, Vec::new()),
                Err(why) => (REPLY_FULL, why.into_bytes()),
            },
            Op::Get => match self.map.get(&req.key) {
                Some(v) => (REPLY_OK, v.clone()),
                None => (REPLY_MISSING, Vec::new()),
            },
            Op::Add => self.add(req.key, &req.value, limits),
            Op::DeletePrefix => {
                let removed = self.delete_prefix(&req.key);
                (REPLY_OK, (removed as u64).to_le_bytes().to_vec())
            }
        }
    }

    /// Remove every key starting with `prefix`; returns how many.
    fn delete_prefix(&mut self, prefix: &[u8]) -> usize {
        let before = self.map.len();
        let mut freed = 0;
        self.map.retain(|k, v| {
            let keep = !k.starts_with(prefix);
            if !keep {
                freed += cost(k, v);
            }
            keep
        });
        self.bytes -= freed;
        before - self.map.len()
    }

    fn add(&mut self, key: Vec<u8>, delta: &[u8], limits: &Limits) -> Reply {
        let Ok(delta) = <[u8; 8]>::try_from(delta).map(i64::from_le_bytes) else {
            return (
                REPLY_BAD_REQUEST,
                format!("add takes an 8-byte counter, not {} bytes", delta.len()).into_bytes(),
            );
        };
        // A counter is 8 bytes; anything else under the key is a value a
        // counter must not silently replace, and a sum past i64 must not wrap.
        let old = match self
            .map
            .get(&key)
            .map(|v| <[u8; 8]>::try_from(v.as_slice()))
        {
            None => 0,
            Some(Ok(counter)) => i64::from_le_bytes(counter),
            Some(Err(_)) => {
                return (
                    REPLY_BAD_REQUEST,
                    b"add on a key that holds a value, not a counter".to_vec(),
                );
            }
        };
        let Some(now) = old.checked_add(delta) else {
            return (
                REPLY_BAD_REQUEST,
                format!("add of {delta} to {old} overflows the counter").into_bytes(),
            );
        };
        let bytes = now.to_le_bytes().to_vec();
        match self.put(key, bytes.clone(), limits) {
            Ok(()) => (REPLY_OK, bytes),
            Err(why) => (REPLY_FULL, why.into_bytes()),
        }
    }

    /// Insert or replace, if the result stays within the bounds.
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>, limits: &Limits) -> Result<(), String> {
        let old = self.map.get(&key).map(|v| cost(&key, v));
        if old.is_none() && self.map.len() >= limits.max_keys {
            return Err(format!(
                "the store holds its maximum of {} keys",
                limits.max_keys
            ));
        }
        let after = self.bytes - old.unwrap_or(0) + cost(&key, &value);
        if after > limits.max_total_bytes {
            return Err(full_bytes(limits));
        }
        self.bytes = after;
        self.map.insert(key, value);
        Ok(())
    }
}

fn full_bytes(limits: &Limits) -> String {
    format!(
        "the store holds its maximum of {} bytes",
        limits.max_total_bytes
    )
}

/// Feed `data` to the server's parsers as if it arrived on a connection:
/// a hello, then requests, applied to a table with small bounds. Any
/// input must end in a reply or an error, never a panic, and the table
/// must stay within its bounds. The fuzz target's entry point.
#[doc(hidden)]
pub fn fuzz_server(data: &[u8]) {
    let limits = Limits {
        max_key_bytes: 64,
        max_value_bytes: 256,
        max_keys: 16,
        max_total_bytes: 2048,
        ..Limits::default()
    };
    let secret = JobSecret::new("fuzz");
    let nonce = [7u8; NONCE_BYTES];
    let mut r = data;
    let mut h = [0u8; HELLO_BYTES];
    if r.read_exact(&mut h).is_err() {
        return;
    }
    // Whatever the verdict, go on to the requests: the parser behind the
    // handshake must be robust too.
    let _ = check_hello(&h, secret.as_ref(), &nonce);
    let mut table = Table::default();
    while let Ok(Some(req)) = read_request(&mut r, &limits) {
        let _ = table.apply(req, &limits);
        assert!(table.bytes() <= limits.max_total_bytes);
        assert!(table.keys() <= limits.max_keys);
    }
}

#[cfg(test)]
mod tests;
