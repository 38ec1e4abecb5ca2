//! The store's server, run by rank 0 on a background thread: one thread per
//! connection, every connection authenticated first, every bound of
//! [`Limits`] enforced (see the crate docs).

use std::collections::VecDeque;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::protocol::{
    self, Admission, HELLO_BYTES, Limits, RequestError, Table, answer, check_hello, greeting,
};
use crate::secret::{JobSecret, NONCE_BYTES, random_bytes};

/// Stack of each connection's thread: the thread only parses frames.
const CONNECTION_STACK_BYTES: usize = 256 << 10;
/// First pause after a failed `accept` (out of file descriptors, say).
const FIRST_BACKOFF: Duration = Duration::from_millis(2);
/// Longest pause between failed `accept`s.
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// How a server runs: who may connect and within what bounds.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// The job secret every connection must prove it knows; `None` serves
    /// anyone who can reach the port (unauthenticated: only for a trusted
    /// host and network).
    pub secret: Option<JobSecret>,
    /// The bounds on keys, values, the store's size and connections.
    pub limits: Limits,
}

impl ServerOptions {
    /// The secret from `FERROCOLL_JOB_SECRET` (if set) and default bounds.
    pub fn from_env() -> ServerOptions {
        ServerOptions {
            secret: JobSecret::from_env(),
            limits: Limits::default(),
        }
    }
}

/// A running store server; it serves until the process exits.
pub struct Server {
    addr: SocketAddr,
    state: Arc<State>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("authenticated", &self.state.options.secret.is_some())
            .finish()
    }
}

impl Server {
    /// Listen on `addr` (port 0 picks a free port) and serve on a
    /// background thread, asking for the secret in `FERROCOLL_JOB_SECRET`
    /// if it is set ([`ServerOptions::from_env`]). A port already in use
    /// is [`StoreError::AddressInUse`].
    pub fn start(addr: SocketAddr) -> Result<Server, StoreError> {
        Server::start_with(addr, ServerOptions::from_env())
    }

    /// [`start`](Self::start) with explicit options.
    pub fn start_with(addr: SocketAddr, options: ServerOptions) -> Result<Server, StoreError> {
        let listener = TcpListener::bind(addr).map_err(|e| match e.kind() {
            io::ErrorKind::AddrInUse => StoreError::AddressInUse { addr },
            _ => StoreError::Io(format!("binding {addr}: {e}")),
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let state = Arc::new(State {
            options,
            table: Mutex::default(),
            conns: Mutex::default(),
        });
        let served = state.clone();
        std::thread::Builder::new()
            .name("ferrocoll-store".into())
            .spawn(move || {
                accept_loop(
                    || Some(listener.accept().map(|(s, _)| s)),
                    |conn| admit(&served, conn),
                    std::thread::sleep,
                );
            })
            .map_err(|e| StoreError::Io(e.to_string()))?;
        Ok(Server { addr, state })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections authenticated and being served now.
    pub fn connections(&self) -> usize {
        self.state.conns().authenticated
    }
}

/// What every connection's thread shares.
struct State {
    options: ServerOptions,
    table: Mutex<Table>,
    conns: Mutex<Conns>,
}

#[derive(Default)]
struct Conns {
    authenticated: usize,
    /// Connections still authenticating, oldest first, with a handle to
    /// close each.
    pending: VecDeque<(u64, TcpStream)>,
    next_id: u64,
}

impl State {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn conns(&self) -> MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Note a new connection as pending; closes the oldest pending one if
    /// there are too many. `None` if the connection cannot be tracked.
    fn register(&self, conn: &TcpStream) -> Option<u64> {
        let handle = conn.try_clone().ok()?;
        let mut conns = self.conns();
        let id = conns.next_id;
        conns.next_id += 1;
        conns.pending.push_back((id, handle));
        while conns.pending.len() > self.options.limits.max_pending.max(1) {
            if let Some((_, oldest)) = conns.pending.pop_front() {
                tracing::debug!("store: closing the oldest unauthenticated connection");
                let _ = oldest.shutdown(Shutdown::Both);
            }
        }
        Some(id)
    }

    /// Forget a pending connection (it ended or authenticated).
    fn forget(&self, id: u64) {
        self.conns().pending.retain(|(i, _)| *i != id);
    }

    /// Move an authenticated connection from pending to served, if there
    /// is room: `Accepted`, or `Busy` (or `BadHello` when it was already
    /// closed for being the oldest pending).
    fn promote(&self, id: u64) -> Admission {
        let mut conns = self.conns();
        let before = conns.pending.len();
        conns.pending.retain(|(i, _)| *i != id);
        if conns.pending.len() == before {
            return Admission::BadHello;
        }
        if conns.authenticated >= self.options.limits.max_connections {
            return Admission::Busy;
        }
        conns.authenticated += 1;
        Admission::Accepted
    }
}

/// Pauses after failed `accept`s: growing from [`FIRST_BACKOFF`] to
/// [`MAX_BACKOFF`], reset by a success, so running out of file descriptors
/// does not spin a core.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    pause: Option<Duration>,
}

impl Backoff {
    /// The pause after one more failure.
    pub fn failed(&mut self) -> Duration {
        let next = self
            .pause
            .map_or(FIRST_BACKOFF, |p| (p * 2).min(MAX_BACKOFF));
        self.pause = Some(next);
        next
    }

    /// A success: the next failure pauses briefly again.
    pub fn succeeded(&mut self) {
        self.pause = None;
    }
}

/// Accept connections until `accept` returns `None`, handing each to
/// `handle`; after an error, `sleep` for the backoff's pause.
fn accept_loop(
    mut accept: impl FnMut() -> Option<io::Result<TcpStream>>,
    mut handle: impl FnMut(TcpStream),
    mut sleep: impl FnMut(Duration),
) {
    let mut backoff = Backoff::default();
    while let Some(next) = accept() {
        match next {
            Ok(conn) => {
                backoff.succeeded();
                handle(conn);
            }
            Err(e) => {
                let pause = backoff.failed();
                if pause == FIRST_BACKOFF {
                    tracing::warn!("store: accept failed ({e}); backing off");
                }
                sleep(pause);
            }
        }
    }
}

/// Serve one new connection on its own thread.
fn admit(state: &Arc<State>, conn: TcpStream) {
    let Some(id) = state.register(&conn) else {
        return;
    };
    let served = state.clone();
    let spawned = std::thread::Builder::new()
        .name("ferrocoll-store-conn".into())
        .stack_size(CONNECTION_STACK_BYTES)
        .spawn(move || {
            if let Err(e) = serve(conn, id, &served) {
                tracing::trace!("store connection ended: {e}");
            }
            served.forget(id);
        });
    if spawned.is_err() {
        state.forget(id);
    }
}

/// Holds one of the server's connection slots; gives it back when dropped.
struct Slot<'a>(&'a State);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut conns = self.0.conns();
        conns.authenticated = conns.authenticated.saturating_sub(1);
    }
}

/// A reader whose reads fail once `deadline` has passed, however slowly
/// the bytes trickle in.
struct Timed<'a> {
    inner: &'a mut BufReader<TcpStream>,
    deadline: Instant,
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.inner.buffer().is_empty() {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "a frame did not arrive in time",
                ));
            }
            self.inner.get_ref().set_read_timeout(Some(left))?;
        }
        self.inner.read(buf)
    }
}

fn serve(conn: TcpStream, id: u64, state: &State) -> io::Result<()> {
    let limits = state.options.limits;
    conn.set_nodelay(true)?;
    conn.set_write_timeout(Some(limits.frame_timeout))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut writer = BufWriter::new(conn);
    let Some(_slot) = handshake(&mut reader, &mut writer, id, state)? else {
        return Ok(());
    };
    loop {
        if reader.buffer().is_empty() {
            // Between requests a connection may idle while the group lives.
            reader.get_ref().set_read_timeout(None)?;
        }
        let mut op = [0u8; 1];
        if reader.read(&mut op)? == 0 {
            return Ok(());
        }
        let mut timed = Timed {
            inner: &mut reader,
            deadline: Instant::now() + limits.frame_timeout,
        };
        let mut reserved = 0;
        let request = protocol::read_request_body(op[0], &mut timed, &limits, |len| {
            state.table().reserve(len, &limits)?;
            reserved = len;
            Ok(())
        });
        state.table().release(reserved);
        let (reply, close) = match request {
            Ok(request) => (state.table().apply(request, &limits), false),
            Err(RequestError::Refused(reply)) => (reply, true),
            Err(RequestError::Rejected(reply)) => (reply, false),
            Err(RequestError::Io(e)) => return Err(e),
        };
        write_reply(&mut writer, &reply)?;
        if close {
            // The rest of the request was not read: the stream is out of step.
            return Ok(());
        }
    }
}

/// Greet, read the hello within the handshake timeout, and answer it.
/// `Some(slot)` once the connection is authenticated and admitted.
fn handshake<'a>(
    reader: &mut BufReader<TcpStream>,
    writer: &mut BufWriter<TcpStream>,
    id: u64,
    state: &'a State,
) -> io::Result<Option<Slot<'a>>> {
    let secret = state.options.secret.as_ref();
    let nonce: [u8; NONCE_BYTES] = random_bytes();
    writer.write_all(&greeting(secret.is_some(), &nonce))?;
    writer.flush()?;
    let mut hello = [0u8; HELLO_BYTES];
    Timed {
        inner: reader,
        deadline: Instant::now() + state.options.limits.handshake_timeout,
    }
    .read_exact(&mut hello)?;
    let verdict = match check_hello(&hello, secret, &nonce) {
        Admission::Accepted => state.promote(id),
        refused => refused,
    };
    writer.write_all(&answer(verdict, secret, &nonce, &hello))?;
    writer.flush()?;
    if verdict != Admission::Accepted {
        tracing::debug!("store: refused a connection: {verdict:?}");
        return Ok(None);
    }
    Ok(Some(Slot(state)))
}

fn write_reply(w: &mut impl Write, (status, value): &protocol::Reply) -> io::Result<()> {
    w.write_all(&[*status])?;
    w.write_all(&(value.len() as u32).to_le_bytes())?;
    w.write_all(value)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_back_off_instead_of_spinning() {
        // 200 failed accepts in a row (EMFILE, say), then one success.
        let mut calls = 0;
        let mut slept = Vec::new();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        accept_loop(
            || {
                calls += 1;
                match calls {
                    1..=200 => Some(Err(io::Error::from_raw_os_error(24))),
                    201 => {
                        let _c = TcpStream::connect(addr).unwrap();
                        Some(listener.accept().map(|(s, _)| s))
                    }
                    202 => Some(Err(io::Error::from_raw_os_error(24))),
                    _ => None,
                }
            },
            drop,
            |d| slept.push(d),
        );
        assert_eq!(slept.len(), 201, "one pause per failure");
        let total: Duration = slept[..200].iter().sum();
        assert!(
            total >= Duration::from_secs(30),
            "200 failures must pause for a while, not spin: {total:?}"
        );
        assert!(slept.iter().all(|&d| d <= MAX_BACKOFF));
        assert_eq!(slept[200], FIRST_BACKOFF, "a success resets the backoff");
    }
}
