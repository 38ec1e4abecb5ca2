//! The TCP transport's connection handshake: who may become the connection
//! to which peer, each side proving the job secret to the other.
//!
//! The higher rank of each pair dials the lower one's data port (published
//! in the store). The acceptor speaks first:
//! - greeting (25 bytes): `fctp`, version (1 byte: 2), the acceptor's rank
//!   (u32 LE), its fresh random nonce (16 bytes);
//! - hello (56 bytes, dialer): `fcth`, the dialer's rank (u32 LE), its own
//!   fresh nonce (16 bytes), proof (32 bytes): HMAC-SHA-256(job secret,
//!   dialer label ‖ both nonces ‖ dialer ‖ acceptor ‖ world size), zeros
//!   when the job has no secret;
//! - answer (33 bytes, acceptor): verdict (0 accepted, 1 refused, then it
//!   closes) and, when it accepts, its own proof over the acceptor label
//!   and the same fields (zeros without a secret).
//!
//! The acceptor takes a hello only from a rank that should dial it (in
//! range, above itself), is not connected yet, and proves the secret.
//! Anyone else — a port scanner, another job, an impostor claiming a rank —
//! is refused and the acceptor keeps waiting for the real peer until the
//! deadline; greetings are read without blocking, so silent strangers
//! delay nobody, and at most [`MAX_PENDING`] wait at once (the oldest goes).
//! The dialer sends nothing more to an acceptor that cannot prove the
//! secret back (a process listening where the peer's port was). Without a
//! job secret the rank checks still hold but anyone who reaches the port
//! first can claim a rank: set `FERROCOLL_JOB_SECRET` on shared hosts and
//! networks.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_rendezvous::{JobSecret, NONCE_BYTES, PROOF_BYTES, random_bytes};

use super::SetupError;

const GREETING_MAGIC: [u8; 4] = *b"fctp";
const HELLO_MAGIC: [u8; 4] = *b"fcth";
const VERSION: u8 = 2;
const GREETING_BYTES: usize = 4 + 1 + 4 + NONCE_BYTES;
pub(crate) const HELLO_BYTES: usize = 4 + 4 + NONCE_BYTES + PROOF_BYTES;
const ANSWER_BYTES: usize = 1 + PROOF_BYTES;
const DIALER: &[u8] = b"ferrocoll-tcp-v2 dialer";
const ACCEPTOR: &[u8] = b"ferrocoll-tcp-v2 acceptor";
const ACCEPTED: u8 = 0;
const REFUSED: u8 = 1;
/// Connections still handshaking at once; beyond it the oldest is closed.
pub(crate) const MAX_PENDING: usize = 64;
/// Time a dialer has to send its hello (or the deadline, if sooner).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause of the accept loop when nothing happened.
const IDLE: Duration = Duration::from_millis(2);

/// Why a hello was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not a ferrocoll TCP hello.
    NotAHello,
    /// The claimed rank is not in the group.
    OutOfRange(u32),
    /// The claimed rank is this rank or below it: it would not dial us.
    ShouldNotDial(u32),
    /// The proof does not show the job secret.
    BadProof(u32),
    /// That rank is connected already.
    AlreadyConnected(u32),
}

/// Both nonces of one handshake: the acceptor's, then the dialer's.
type Nonces = ([u8; NONCE_BYTES], [u8; NONCE_BYTES]);

fn context(label: &[u8], nonces: &Nonces, dialer: Rank, acceptor: Rank, world: u32) -> Vec<u8> {
    let mut c = label.to_vec();
    c.extend_from_slice(&nonces.0);
    c.extend_from_slice(&nonces.1);
    for v in [dialer, acceptor, world] {
        c.extend_from_slice(&v.to_le_bytes());
    }
    c
}

fn greeting(acceptor: Rank, nonce: &[u8; NONCE_BYTES]) -> [u8; GREETING_BYTES] {
    let mut g = [0u8; GREETING_BYTES];
    g[..4].copy_from_slice(&GREETING_MAGIC);
    g[4] = VERSION;
    g[5..9].copy_from_slice(&acceptor.to_le_bytes());
    g[9..].copy_from_slice(nonce);
    g
}

pub(crate) fn hello(
    secret: Option<&JobSecret>,
    nonces: &Nonces,
    dialer: Rank,
    acceptor: Rank,
    world: u32,
) -> [u8; HELLO_BYTES] {
    let mut h = [0u8; HELLO_BYTES];
    h[..4].copy_from_slice(&HELLO_MAGIC);
    h[4..8].copy_from_slice(&dialer.to_le_bytes());
    h[8..8 + NONCE_BYTES].copy_from_slice(&nonces.1);
    if let Some(s) = secret {
        h[8 + NONCE_BYTES..]
            .copy_from_slice(&s.prove(&context(DIALER, nonces, dialer, acceptor, world)));
    }
    h
}

/// The dialer's nonce in a hello, beside the acceptor's own.
fn nonces_of(h: &[u8; HELLO_BYTES], mine: &[u8; NONCE_BYTES]) -> Nonces {
    let mut theirs = [0u8; NONCE_BYTES];
    theirs.copy_from_slice(&h[8..8 + NONCE_BYTES]);
    (*mine, theirs)
}

/// The rank a hello may become the connection of, or why not.
pub(crate) fn check_hello(
    h: &[u8; HELLO_BYTES],
    me: Rank,
    world: u32,
    connected: impl Fn(Rank) -> bool,
    secret: Option<&JobSecret>,
    nonce: &[u8; NONCE_BYTES],
) -> Result<Rank, Refusal> {
    if h[..4] != HELLO_MAGIC {
        return Err(Refusal::NotAHello);
    }
    let peer = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    if peer >= world {
        return Err(Refusal::OutOfRange(peer));
    }
    if peer <= me {
        return Err(Refusal::ShouldNotDial(peer));
    }
    let nonces = nonces_of(h, nonce);
    if let Some(s) = secret
        && !s.verify(
            &context(DIALER, &nonces, peer, me, world),
            &h[8 + NONCE_BYTES..],
        )
    {
        return Err(Refusal::BadProof(peer));
    }
    if connected(peer) {
        return Err(Refusal::AlreadyConnected(peer));
    }
    Ok(peer)
}

/// The acceptor's answer admitting `dialer`: the verdict and its proof.
fn acceptance(
    secret: Option<&JobSecret>,
    nonces: &Nonces,
    dialer: Rank,
    acceptor: Rank,
    world: u32,
) -> [u8; ANSWER_BYTES] {
    let mut a = [0u8; ANSWER_BYTES];
    a[0] = ACCEPTED;
    if let Some(s) = secret {
        a[1..].copy_from_slice(&s.prove(&context(ACCEPTOR, nonces, dialer, acceptor, world)));
    }
    a
}

/// Run the dialer's half on a fresh connection to `peer`.
pub(crate) fn dial(
    stream: &mut TcpStream,
    me: Rank,
    peer: Rank,
    world: u32,
    secret: Option<&JobSecret>,
    deadline: Instant,
) -> io::Result<()> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(10));
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))?;
    let mut g = [0u8; GREETING_BYTES];
    stream.read_exact(&mut g)?;
    let acceptor = u32::from_le_bytes([g[5], g[6], g[7], g[8]]);
    if g[..4] != GREETING_MAGIC || g[4] != VERSION || acceptor != peer {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the listener is not that rank's ferrocoll data port",
        ));
    }
    let mut theirs = [0u8; NONCE_BYTES];
    theirs.copy_from_slice(&g[9..]);
    let nonces = (theirs, random_bytes());
    stream.write_all(&hello(secret, &nonces, me, peer, world))?;
    let mut answer = [0u8; ANSWER_BYTES];
    stream.read_exact(&mut answer)?;
    if answer[0] != ACCEPTED {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "it refused the handshake (a different FERROCOLL_JOB_SECRET?)",
        ));
    }
    if let Some(s) = secret
        && !s.verify(&context(ACCEPTOR, &nonces, me, peer, world), &answer[1..])
    {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "it admitted this rank without proving the job secret: not that rank's data port \
             (another process listening there?); nothing was sent to it",
        ));
    }
    stream.set_read_timeout(None)
}

/// A connection that has been greeted and is sending its hello.
struct Pending {
    stream: TcpStream,
    nonce: [u8; NONCE_BYTES],
    got: [u8; HELLO_BYTES],
    filled: usize,
    until: Instant,
}

enum Progress {
    Waiting,
    Hello([u8; HELLO_BYTES]),
    Gone,
}

impl Pending {
    /// Greet a new connection; `None` if it is already gone.
    fn greet(stream: TcpStream, me: Rank, deadline: Instant) -> Option<Pending> {
        let nonce: [u8; NONCE_BYTES] = random_bytes();
        stream.set_nonblocking(false).ok()?;
        stream
            .set_write_timeout(Some(Duration::from_millis(200)))
            .ok()?;
        (&stream).write_all(&greeting(me, &nonce)).ok()?;
        stream.set_nonblocking(true).ok()?;
        Some(Pending {
            stream,
            nonce,
            got: [0; HELLO_BYTES],
            filled: 0,
            until: deadline.min(Instant::now() + HELLO_TIMEOUT),
        })
    }

    /// Read what has arrived, without blocking.
    fn poll(&mut self) -> Progress {
        loop {
            match self.stream.read(&mut self.got[self.filled..]) {
                Ok(0) => return Progress::Gone,
                Ok(n) => {
                    self.filled += n;
                    if self.filled == HELLO_BYTES {
                        return Progress::Hello(self.got);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return if Instant::now() >= self.until {
                        Progress::Gone
                    } else {
                        Progress::Waiting
                    };
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Progress::Gone,
            }
        }
    }
}

/// Accept a connection from every `wanted` rank above `me` into `streams`
/// (indexed by rank), refusing every other comer, until `deadline` or until
/// `peers_alive` says a peer that would dial is gone.
pub(crate) fn accept_peers(
    listener: &TcpListener,
    me: Rank,
    streams: &mut [Option<TcpStream>],
    wanted: &dyn Fn(Rank) -> bool,
    secret: Option<&JobSecret>,
    deadline: Instant,
    peers_alive: &mut dyn FnMut() -> Result<(), SetupError>,
) -> Result<(), SetupError> {
    let world = streams.len() as u32;
    let missing = |streams: &[Option<TcpStream>]| -> Vec<Rank> {
        (me + 1..world)
            .filter(|&p| wanted(p) && streams[p as usize].is_none())
            .collect()
    };
    let tcp_err = |what: &str, source| SetupError::Tcp {
        what: what.to_owned(),
        source,
    };
    listener
        .set_nonblocking(true)
        .map_err(|e| tcp_err("set up the listener", e))?;
    let mut pending: VecDeque<Pending> = VecDeque::new();
    while !missing(streams).is_empty() {
        let mut progressed = false;
        match listener.accept() {
            Ok((stream, _)) => {
                progressed = true;
                pending.extend(Pending::greet(stream, me, deadline));
                while pending.len() > MAX_PENDING {
                    pending.pop_front();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // Out of file descriptors, a connection aborted before it was
            // taken: transient; pause and go on until the deadline.
            Err(e) => {
                tracing::debug!("tcp: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        progressed |= poll_pending(&mut pending, me, streams, secret);
        peers_alive()?;
        if Instant::now() >= deadline {
            let missing = missing(streams);
            let addr = listener
                .local_addr()
                .map_or_else(|_| "its data port".to_owned(), |a| a.to_string());
            return Err(tcp_err(
                &format!("ranks {missing:?} did not connect to {addr}"),
                io::ErrorKind::TimedOut.into(),
            ));
        }
        if !progressed {
            std::thread::sleep(IDLE);
        }
    }
    Ok(())
}

/// Advance every pending handshake; true if any finished.
fn poll_pending(
    pending: &mut VecDeque<Pending>,
    me: Rank,
    streams: &mut [Option<TcpStream>],
    secret: Option<&JobSecret>,
) -> bool {
    let world = streams.len() as u32;
    let mut finished = false;
    for mut p in std::mem::take(pending) {
        let hello = match p.poll() {
            Progress::Waiting => {
                pending.push_back(p);
                continue;
            }
            Progress::Gone => {
                finished = true;
                continue;
            }
            Progress::Hello(h) => h,
        };
        finished = true;
        let connected = |r: Rank| streams[r as usize].is_some();
        match check_hello(&hello, me, world, connected, secret, &p.nonce) {
            Ok(peer) => {
                let answer = acceptance(secret, &nonces_of(&hello, &p.nonce), peer, me, world);
                if let Some(stream) = admit(p.stream, &answer) {
                    streams[peer as usize] = Some(stream);
                }
            }
            Err(why) => {
                let from = p.stream.peer_addr().ok();
                tracing::warn!(?from, "tcp: refused a connection to rank {me}: {why:?}");
                let mut refusal = [0u8; ANSWER_BYTES];
                refusal[0] = REFUSED;
                let _ = (&p.stream).write_all(&refusal);
            }
        }
    }
    finished
}

/// Tell an accepted dialer so, and hand its stream over in blocking mode.
fn admit(stream: TcpStream, answer: &[u8; ANSWER_BYTES]) -> Option<TcpStream> {
    stream.set_nonblocking(false).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(1)))
        .ok()?;
    (&stream).write_all(answer).ok()?;
    Some(stream)
}

/// Feed `data` to the acceptor's hello check as rank 1 of 4 with rank 3
/// already connected, with and without a secret. The fuzz target's entry
/// point: no input may panic, and no input without the secret's proof may
/// be accepted when there is a secret.
#[doc(hidden)]
pub fn fuzz_hello(data: &[u8]) {
    let Some(h) = data.get(..HELLO_BYTES) else {
        return;
    };
    let Ok(h) = <[u8; HELLO_BYTES]>::try_from(h) else {
        return;
    };
    let nonce = [9u8; NONCE_BYTES];
    let connected = |r: Rank| r == 3;
    if let Ok(peer) = check_hello(&h, 1, 4, connected, None, &nonce) {
        assert_eq!(peer, 2, "only the unconnected rank above 1");
    }
    let secret = JobSecret::new("fuzz");
    if let Ok(peer) = check_hello(&h, 1, 4, connected, secret.as_ref(), &nonce) {
        assert_eq!(peer, 2);
        let nonces = nonces_of(&h, &nonce);
        assert_eq!(
            h,
            hello(secret.as_ref(), &nonces, 2, 1, 4),
            "a forged proof"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    const WORLD: u32 = 3;

    fn secret(s: &str) -> JobSecret {
        JobSecret::new(s).unwrap()
    }

    /// Rank 0 accepting on a thread; returns its address and the ranks it admitted.
    fn acceptor(
        secret: Option<JobSecret>,
        within: Duration,
    ) -> (
        SocketAddr,
        std::thread::JoinHandle<Result<Vec<bool>, String>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let mut streams: Vec<Option<TcpStream>> = (0..WORLD).map(|_| None).collect();
            let deadline = Instant::now() + within;
            accept_peers(
                &listener,
                0,
                &mut streams,
                &|_| true,
                secret.as_ref(),
                deadline,
                &mut || Ok(()),
            )
            .map_err(|e| e.to_string())?;
            Ok(streams.iter().map(Option::is_some).collect())
        });
        (addr, h)
    }

    /// Dial as `claim` with `secret`; whether the acceptor admitted us.
    fn dial_as(addr: SocketAddr, claim: Rank, secret: Option<&JobSecret>) -> io::Result<TcpStream> {
        let mut s = TcpStream::connect(addr)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        dial(&mut s, claim, 0, WORLD, secret, deadline).map(|()| s)
    }

    /// A raw hello claiming `claim`, after reading the greeting.
    fn raw_hello(addr: SocketAddr, claim: Rank, proof: [u8; PROOF_BYTES]) -> Vec<u8> {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut g = [0u8; GREETING_BYTES];
        s.read_exact(&mut g).unwrap();
        let mut h = HELLO_MAGIC.to_vec();
        h.extend_from_slice(&claim.to_le_bytes());
        h.extend_from_slice(&[7; NONCE_BYTES]);
        h.extend_from_slice(&proof);
        s.write_all(&h).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        rest
    }

    #[test]
    fn impostors_who_dial_first_are_refused_and_the_real_peers_still_connect() {
        let s = secret("job");
        let (addr, rank0) = acceptor(Some(s.clone()), Duration::from_secs(10));
        // A silent stranger, and strangers claiming ranks without the secret.
        let _silent = TcpStream::connect(addr).unwrap();
        let mut refused = [0u8; ANSWER_BYTES];
        refused[0] = REFUSED;
        assert_eq!(raw_hello(addr, 2, [0; PROOF_BYTES]), refused);
        let e = dial_as(addr, 1, Some(&secret("another job"))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let e = dial_as(addr, 2, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        // With the secret, but claiming ranks that must not dial rank 0.
        for claim in [0, WORLD, u32::MAX] {
            assert!(dial_as(addr, claim, Some(&s)).is_err(), "rank {claim}");
        }
        // The real peers.
        let _one = dial_as(addr, 1, Some(&s)).expect("rank 1 connects");
        let _two = dial_as(addr, 2, Some(&s)).expect("rank 2 connects");
        assert_eq!(rank0.join().unwrap(), Ok(vec![false, true, true]));
    }

    #[test]
    fn a_second_connection_for_a_connected_rank_is_refused() {
        let s = secret("job");
        let nonce = [3u8; NONCE_BYTES];
        let nonces = (nonce, [5u8; NONCE_BYTES]);
        let h = hello(Some(&s), &nonces, 2, 0, WORLD);
        assert_eq!(
            check_hello(&h, 0, WORLD, |_| false, Some(&s), &nonce),
            Ok(2)
        );
        assert_eq!(
            check_hello(&h, 0, WORLD, |r| r == 2, Some(&s), &nonce),
            Err(Refusal::AlreadyConnected(2))
        );
        // A recorded hello is useless against another nonce.
        assert_eq!(
            check_hello(&h, 0, WORLD, |_| false, Some(&s), &[4u8; NONCE_BYTES]),
            Err(Refusal::BadProof(2))
        );
        // Without a secret, the rank checks still hold.
        let h = hello(None, &nonces, 0, 1, WORLD);
        assert_eq!(
            check_hello(&h, 1, WORLD, |_| false, None, &nonce),
            Err(Refusal::ShouldNotDial(0))
        );
    }

    #[test]
    fn only_strangers_until_the_deadline_is_a_timeout_naming_the_missing_ranks() {
        let (addr, rank0) = acceptor(Some(secret("job")), Duration::from_millis(500));
        let _ = raw_hello(addr, 1, [0; PROOF_BYTES]);
        let e = rank0.join().unwrap().unwrap_err();
        assert!(e.contains("[1, 2]") && e.contains("did not connect"), "{e}");
    }

    #[test]
    fn the_fuzz_entry_point_survives_odd_inputs() {
        fuzz_hello(&[]);
        fuzz_hello(&[0xff; 100]);
        let nonces = ([9; NONCE_BYTES], [1; NONCE_BYTES]);
        fuzz_hello(&hello(None, &nonces, 2, 1, 4));
        fuzz_hello(&hello(JobSecret::new("fuzz").as_ref(), &nonces, 2, 1, 4));
    }

    #[test]
    fn a_listener_that_cannot_prove_the_secret_back_gets_no_data() {
        // Something listens where rank 0's data port was and admits
        // anyone, echoing the dialer's proof as its own (before: the
        // dialer took it for rank 0 and sent it its data).
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let impostor = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            c.write_all(&greeting(0, &[2; NONCE_BYTES])).unwrap();
            let mut h = [0u8; HELLO_BYTES];
            c.read_exact(&mut h).unwrap();
            let mut answer = [ACCEPTED; ANSWER_BYTES];
            answer[1..].copy_from_slice(&h[8 + NONCE_BYTES..]);
            c.write_all(&answer).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut rest = Vec::new();
            let _ = c.read_to_end(&mut rest);
            rest
        });
        let e = {
            let mut stream = TcpStream::connect(addr).unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            dial(&mut stream, 1, 0, WORLD, Some(&secret("job")), deadline).unwrap_err()
        };
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("without proving"), "{e}");
        assert!(
            impostor.join().unwrap().is_empty(),
            "nothing after the hello"
        );
    }
}
