//! The store's client.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::protocol::{
    self, ANSWER_BYTES, Admission, GREETING_BYTES, MAX_CONNECTIONS, MAX_KEY_BYTES, MAX_VALUE_BYTES,
    OP_ADD, OP_DELETE_PREFIX, OP_GET, OP_SET, REPLY_BAD_REQUEST, REPLY_FULL, REPLY_KEY_TOO_LONG,
    REPLY_MISSING, REPLY_OK, REPLY_VALUE_TOO_LONG,
};
use crate::secret::{JobSecret, NONCE_BYTES, random_bytes};
use crate::server::{Server, ServerOptions};

/// A connection to the store.
#[derive(Debug)]
pub struct Store {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    timeout: Duration,
    /// The address joined, for errors.
    addr: String,
    secret: Option<JobSecret>,
    /// Where the connection went: rank 0's own server, or `addr` resolved.
    target: SocketAddr,
    /// Prefixed to every key, so groups formed later (a communicator's
    /// split) reuse the server without meeting each other's keys.
    namespace: String,
    /// Kept alive on rank 0 for the life of the store.
    _server: Option<Server>,
    /// Set once a request went unanswered: a late reply would be read as
    /// the next request's, so every later request fails at once with it.
    broken: Option<StoreError>,
}

fn io(e: io::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

/// Whether an I/O error means the other side closed the connection.
fn is_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// Why one attempt at connecting failed.
enum Attempt {
    /// Worth another try before the deadline (refused, or closed during
    /// the handshake: the server had too many strangers pending).
    Retry(io::Error),
    /// Final.
    Fail(StoreError),
}

impl Store {
    /// Join the store at `addr` (`host:port`): rank 0 starts the server
    /// there first. Connecting retries until `timeout`. The job secret, if
    /// any, comes from `FERROCOLL_JOB_SECRET` ([`JobSecret::from_env`]); see
    /// [`join_with`](Self::join_with).
    pub fn join(addr: &str, rank: u32, timeout: Duration) -> Result<Store, StoreError> {
        Store::join_with(addr, rank, timeout, JobSecret::from_env().as_ref())
    }

    /// [`join`](Self::join) with an explicit job secret. With `Some`, rank
    /// 0's server admits only connections that prove they know it, and this
    /// client refuses a store that does not ask for it; with `None` the
    /// store is unauthenticated (anyone who can reach the port may use it).
    pub fn join_with(
        addr: &str,
        rank: u32,
        timeout: Duration,
        secret: Option<&JobSecret>,
    ) -> Result<Store, StoreError> {
        let resolved: SocketAddr = addr
            .to_socket_addrs()
            .map_err(|_| StoreError::BadAddress(addr.to_owned()))?
            .next()
            .ok_or_else(|| StoreError::BadAddress(addr.to_owned()))?;
        let server = if rank == 0 {
            let options = ServerOptions {
                secret: secret.cloned(),
                ..ServerOptions::default()
            };
            Some(Server::start_with(resolved, options)?)
        } else {
            None
        };
        let target = server.as_ref().map_or(resolved, Server::addr);
        let conn = open(&target, addr, secret, timeout)?;
        Ok(Store {
            reader: BufReader::new(conn.try_clone().map_err(io)?),
            writer: BufWriter::new(conn),
            timeout,
            addr: addr.to_owned(),
            secret: secret.cloned(),
            target,
            namespace: String::new(),
            _server: server,
            broken: None,
        })
    }

    /// A second connection to the same store, with the same secret and
    /// timeout, whose keys all live under `namespace` (appended to this
    /// store's own): a group formed inside an existing one — a split —
    /// meets there without touching the keys of the group that formed it.
    pub fn scoped(&self, namespace: &str) -> Result<Store, StoreError> {
        let conn = open(&self.target, &self.addr, self.secret.as_ref(), self.timeout)?;
        Ok(Store {
            reader: BufReader::new(conn.try_clone().map_err(io)?),
            writer: BufWriter::new(conn),
            timeout: self.timeout,
            addr: self.addr.clone(),
            secret: self.secret.clone(),
            target: self.target,
            namespace: format!("{}{namespace}/", self.namespace),
            _server: None,
            broken: None,
        })
    }

    /// The job secret this store was joined with: the transports
    /// authenticate their connections with the same one.
    pub fn secret(&self) -> Option<&JobSecret> {
        self.secret.as_ref()
    }

    /// This end of the connection to the store: the address other ranks
    /// can reach this process at (the interface that routes to rank 0).
    pub fn local_addr(&self) -> Result<SocketAddr, StoreError> {
        self.reader.get_ref().local_addr().map_err(io)
    }

    /// The address rank 0 serves on (rank 0 only; port 0 resolved).
    pub fn server_addr(&self) -> Option<SocketAddr> {
        self._server.as_ref().map(Server::addr)
    }

    fn closed(&self) -> StoreError {
        StoreError::Closed {
            addr: self.addr.clone(),
        }
    }

    /// An I/O error on the open connection, typed. A reply that did not
    /// come within the timeout leaves the connection unusable.
    fn lost(&mut self, e: io::Error) -> StoreError {
        if is_closed(&e) {
            self.closed()
        } else if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            let e = StoreError::Unresponsive {
                addr: self.addr.clone(),
                timeout: self.timeout,
            };
            self.broken = Some(e.clone());
            e
        } else {
            StoreError::Io(format!("talking to the store at {}: {e}", self.addr))
        }
    }

    fn request(&mut self, op: u8, key: &str, value: &[u8]) -> Result<(bool, Vec<u8>), StoreError> {
        let scoped;
        let key = if self.namespace.is_empty() {
            key
        } else {
            scoped = format!("{}{key}", self.namespace);
            &scoped
        };
        check_len("key", key.len(), MAX_KEY_BYTES)?;
        check_len("value", value.len(), MAX_VALUE_BYTES)?;
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        self.send(op, key, value).map_err(|e| self.lost(e))?;
        let (status, v) = self.receive().map_err(|e| self.lost(e))?;
        match status {
            REPLY_OK => Ok((true, v)),
            REPLY_MISSING => Ok((false, v)),
            REPLY_KEY_TOO_LONG => Err(too_large("key", key.len(), &v)),
            REPLY_VALUE_TOO_LONG => Err(too_large("value", value.len(), &v)),
            REPLY_FULL => Err(StoreError::Full(String::from_utf8_lossy(&v).into_owned())),
            REPLY_BAD_REQUEST => Err(StoreError::Protocol(format!(
                "the store refused a request: {}",
                String::from_utf8_lossy(&v)
            ))),
            other => Err(StoreError::Protocol(format!(
                "the store replied with unknown status {other}"
            ))),
        }
    }

    fn send(&mut self, op: u8, key: &str, value: &[u8]) -> io::Result<()> {
        self.writer
            .write_all(&crate::protocol::request(op, key.as_bytes(), value))?;
        self.writer.flush()
    }

    fn receive(&mut self) -> io::Result<(u8, Vec<u8>)> {
        let mut head = [0u8; 5];
        self.reader.read_exact(&mut head)?;
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > MAX_VALUE_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a {len}-byte reply (protocol error)"),
            ));
        }
        let mut v = vec![0u8; len];
        self.reader.read_exact(&mut v)?;
        Ok((head[0], v))
    }

    /// Store `value` under `key`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.request(OP_SET, key, value).map(|_| ())
    }

    /// The value under `key`, if set.
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (found, v) = self.request(OP_GET, key, &[])?;
        Ok(found.then_some(v))
    }

    /// Add `delta` to the counter `key` (0 if unset); returns the new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let (_, v) = self.request(OP_ADD, key, &delta.to_le_bytes())?;
        v.try_into()
            .map(i64::from_le_bytes)
            .map_err(|_| StoreError::Protocol("a counter reply that is not 8 bytes".into()))
    }
    /// Remove every key of this store's scope that starts with `prefix`
    /// (not empty); returns how many there were. What a group removes once
    /// every member is past its last use of them, so that a store serving
    /// many groups (a split per training step) does not fill.
    pub fn delete_prefix(&mut self, prefix: &str) -> Result<u64, StoreError> {
        if prefix.is_empty() {
            return Err(StoreError::Protocol(
                "an empty prefix would delete every key of the scope".into(),
            ));
        }
        let (_, v) = self.request(OP_DELETE_PREFIX, prefix, &[])?;
        v.try_into()
            .map(u64::from_le_bytes)
            .map_err(|_| StoreError::Protocol("a delete reply that is not 8 bytes".into()))
    }

    /// The value under `key`, waiting for it up to the store's timeout.
    pub fn wait(&mut self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.wait_all(&[key]).map(|mut v| v.remove(0))
    }

    /// The values under `keys`, in order, waiting for all of them up to
    /// the store's timeout in total (not per key: ranks that arrive one
    /// after another cannot stretch the wait to `keys.len()` timeouts).
    /// The error names the first key still missing at the deadline.
    pub fn wait_all<K: AsRef<str>>(&mut self, keys: &[K]) -> Result<Vec<Vec<u8>>, StoreError> {
        let deadline = Instant::now() + self.timeout;
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let key = key.as_ref();
            let mut pause = Duration::from_micros(200);
            loop {
                if let Some(v) = self.get(key)? {
                    out.push(v);
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(StoreError::Timeout {
                        key: key.to_owned(),
                        timeout: self.timeout,
                    });
                }
                std::thread::sleep(pause.min(deadline - now));
                pause = (pause * 2).min(Duration::from_millis(20));
            }
        }
        Ok(out)
    }

    /// Wait until `world_size` ranks have called `barrier(name)`.
    pub fn barrier(&mut self, name: &str, world_size: u32) -> Result<(), StoreError> {
        let key = format!("barrier/{name}");
        self.add(&key, 1)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            if self.add(&key, 0)? >= i64::from(world_size) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Timeout {
                    key,
                    timeout: self.timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn check_len(what: &'static str, len: usize, max: usize) -> Result<(), StoreError> {
    if len > max {
        return Err(StoreError::TooLarge { what, len, max });
    }
    Ok(())
}

/// The store's refusal of a too-long key or value; its reply carries its cap.
fn too_large(what: &'static str, len: usize, reply: &[u8]) -> StoreError {
    let max = <[u8; 8]>::try_from(reply).map_or(0, |b| u64::from_le_bytes(b) as usize);
    StoreError::TooLarge { what, len, max }
}

/// Connect and authenticate, retrying what is worth retrying until `timeout`.
fn open(
    target: &SocketAddr,
    addr: &str,
    secret: Option<&JobSecret>,
    timeout: Duration,
) -> Result<TcpStream, StoreError> {
    let deadline = Instant::now() + timeout;
    let conn = loop {
        match attempt(target, addr, secret, deadline) {
            Ok(c) => break c,
            Err(Attempt::Fail(e)) => return Err(e),
            Err(Attempt::Retry(e)) if Instant::now() < deadline => {
                tracing::trace!("store: connecting to {addr}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(Attempt::Retry(_)) => {
                return Err(StoreError::Unreachable {
                    addr: addr.to_owned(),
                    timeout,
                });
            }
        }
    };
    conn.set_read_timeout(Some(timeout)).map_err(io)?;
    conn.set_write_timeout(Some(timeout)).map_err(io)?;
    Ok(conn)
}

/// Connect once and authenticate.
fn attempt(
    target: &SocketAddr,
    addr: &str,
    secret: Option<&JobSecret>,
    deadline: Instant,
) -> Result<TcpStream, Attempt> {
    let mut conn =
        TcpStream::connect_timeout(target, Duration::from_millis(500)).map_err(Attempt::Retry)?;
    conn.set_nodelay(true).map_err(Attempt::Retry)?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    conn.set_read_timeout(Some(left)).map_err(Attempt::Retry)?;
    conn.set_write_timeout(Some(left)).map_err(Attempt::Retry)?;
    let mut g = [0u8; GREETING_BYTES];
    conn.read_exact(&mut g).map_err(Attempt::Retry)?;
    let owned = || addr.to_owned();
    let greeting = protocol::parse_greeting(&g).ok_or_else(|| {
        Attempt::Fail(StoreError::Protocol(format!(
            "{addr} is not a ferrocoll store (or another version of one)"
        )))
    })?;
    match (greeting.auth, secret) {
        (true, None) => return Err(Attempt::Fail(StoreError::SecretRequired { addr: owned() })),
        (false, Some(_)) => {
            return Err(Attempt::Fail(StoreError::Unauthenticated { addr: owned() }));
        }
        _ => {}
    }
    let mine: [u8; NONCE_BYTES] = random_bytes();
    conn.write_all(&protocol::hello(secret, &greeting.nonce, &mine))
        .map_err(Attempt::Retry)?;
    let mut verdict = [0u8; ANSWER_BYTES];
    conn.read_exact(&mut verdict).map_err(Attempt::Retry)?;
    match Admission::from_byte(verdict[0]) {
        // Nothing is sent before the server proved the secret back: a
        // process that took the port first learns no key and no value.
        Some(Admission::Accepted)
            if !protocol::server_proved(&verdict, secret, &greeting.nonce, &mine) =>
        {
            Err(Attempt::Fail(StoreError::Impostor { addr: owned() }))
        }
        Some(Admission::Accepted) => Ok(conn),
        Some(Admission::BadSecret) => Err(Attempt::Fail(StoreError::BadSecret { addr: owned() })),
        Some(Admission::Busy) => Err(Attempt::Fail(StoreError::Busy {
            addr: owned(),
            max: MAX_CONNECTIONS,
        })),
        // Closed as the oldest stranger pending: try again.
        Some(Admission::BadHello) => Err(Attempt::Retry(io::ErrorKind::ConnectionReset.into())),
        None => Err(Attempt::Fail(StoreError::Protocol(format!(
            "{addr} answered the hello with {}",
            verdict[0]
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn ranks_meet_exchange_and_count() {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let t = Duration::from_secs(10);
        let mut zero = Store::join(&addr, 0, t).unwrap();
        let handles: Vec<_> = (1..4u32)
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut s = Store::join(&addr, r, t).unwrap();
                    s.set(&format!("rank/{r}"), &r.to_le_bytes()).unwrap();
                    s.barrier("ready", 4).unwrap();
                    s.wait("rank/0").unwrap()
                })
            })
            .collect();
        zero.set("rank/0", b"zero").unwrap();
        zero.barrier("ready", 4).unwrap();
        for r in 1..4u32 {
            assert_eq!(zero.wait(&format!("rank/{r}")).unwrap(), r.to_le_bytes());
        }
        for h in handles {
            assert_eq!(h.join().unwrap(), b"zero");
        }
        assert_eq!(zero.add("n", 5).unwrap(), 5);
        assert_eq!(zero.add("n", -2).unwrap(), 3);
        assert_eq!(zero.get("missing").unwrap(), None);
    }

    #[test]
    fn scoped_stores_share_the_server_but_not_the_keys() {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let t = Duration::from_secs(10);
        let secret = JobSecret::new("scope test").unwrap();
        let mut zero = Store::join_with(&addr, 0, t, Some(&secret)).unwrap();
        let mut one = Store::join_with(&addr, 1, t, Some(&secret)).unwrap();
        let mut a = zero.scoped("split0.1").unwrap();
        let mut b = one.scoped("split0.1").unwrap();
        let mut nested = a.scoped("split3.0").unwrap();
        a.set("pg/config/0", b"a").unwrap();
        assert_eq!(b.wait("pg/config/0").unwrap(), b"a");
        assert_eq!(zero.get("pg/config/0").unwrap(), None);
        assert_eq!(nested.get("pg/config/0").unwrap(), None);
        nested.set("k", b"n").unwrap();
        assert_eq!(one.get("split0.1/split3.0/k").unwrap().unwrap(), b"n");
        assert_eq!(b.secret().map(JobSecret::expose), Some(secret.expose()));
        assert_eq!(b.add("count", 2).unwrap(), 2);
        assert_eq!(a.add("count", 1).unwrap(), 3);
        assert_eq!(zero.add("count", 0).unwrap(), 0);
    }

    /// Keys that appear one after another, each within a timeout of the
    /// one before, still fail a wait for all of them at one timeout.
    #[test]
    fn waiting_for_many_keys_is_bounded_by_one_timeout_in_all() {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let t = Duration::from_millis(1200);
        let mut zero = Store::join(&addr, 0, t).unwrap();
        let mut late = Store::join(&addr, 1, Duration::from_secs(10)).unwrap();
        let setter = std::thread::spawn(move || {
            for k in ["a", "b", "c"] {
                std::thread::sleep(Duration::from_millis(800));
                late.set(k, k.as_bytes()).unwrap();
            }
        });
        let start = Instant::now();
        let e = zero.wait_all(&["a", "b", "c"]).unwrap_err();
        let waited = start.elapsed();
        assert!(
            matches!(&e, StoreError::Timeout { key, .. } if key == "b"),
            "{e}"
        );
        assert!(waited < Duration::from_millis(2000), "{waited:?}");
        setter.join().unwrap();
        assert_eq!(
            zero.wait_all(&["a", "b", "c"]).unwrap(),
            [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert!(zero.wait_all::<&str>(&[]).unwrap().is_empty());
    }

    #[test]
    fn failures_are_typed_and_bounded() {
        let t = Duration::from_millis(300);
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let _zero = Store::join(&addr, 0, t).unwrap();
        // A second rank 0 on the same port.
        let err = Store::join(&addr, 0, t).unwrap_err();
        assert!(matches!(err, StoreError::AddressInUse { .. }), "{err}");
        // Nobody home.
        let started = Instant::now();
        let err = Store::join(&format!("127.0.0.1:{}", free_port()), 1, t).unwrap_err();
        assert!(matches!(err, StoreError::Unreachable { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(3));
        // A key that never comes.
        let mut s = Store::join(&addr, 1, t).unwrap();
        let err = s.wait("never").unwrap_err();
        assert!(matches!(err, StoreError::Timeout { .. }), "{err}");
        assert!(matches!(
            Store::join("no such host:x", 1, t),
            Err(StoreError::BadAddress(_))
        ));
    }
}
