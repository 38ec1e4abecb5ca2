//! The store against hostile or broken clients (issue 14's adversarial
//! cases): strangers without the secret, oversized frames, a store that
//! fills, silent and half-sent connections, connection floods, and a store
//! host that goes away.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::protocol::{self, ANSWER_BYTES, GREETING_BYTES, HELLO_BYTES, OP_SET};
use crate::secret::NONCE_BYTES;
use crate::{JobSecret, Limits, Server, ServerOptions, Store, StoreError};

const T: Duration = Duration::from_secs(5);

fn secret(s: &str) -> JobSecret {
    JobSecret::new(s).unwrap()
}

fn serve(secret: Option<JobSecret>, limits: Limits) -> Server {
    let options = ServerOptions { secret, limits };
    Server::start_with("127.0.0.1:0".parse().unwrap(), options).unwrap()
}

fn join(server: &Server, s: Option<&JobSecret>) -> Result<Store, StoreError> {
    Store::join_with(&server.addr().to_string(), 1, T, s)
}

/// A hand-driven connection, authenticated with `s`.
fn raw(addr: SocketAddr, s: Option<&JobSecret>) -> TcpStream {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(T)).unwrap();
    let mut g = [0u8; GREETING_BYTES];
    c.read_exact(&mut g).unwrap();
    let greeting = protocol::parse_greeting(&g).unwrap();
    c.write_all(&protocol::hello(s, &greeting.nonce, &[3; NONCE_BYTES]))
        .unwrap();
    let mut verdict = [0u8; ANSWER_BYTES];
    c.read_exact(&mut verdict).unwrap();
    assert_eq!(verdict[0], 0, "admitted");
    c
}

/// Read until the server closes; the bytes it sent first.
fn until_closed(c: &mut TcpStream, within: Duration) -> Vec<u8> {
    c.set_read_timeout(Some(within)).unwrap();
    let mut got = Vec::new();
    match c.read_to_end(&mut got) {
        Ok(_) => got,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => got,
        Err(e) => panic!("the server kept the connection open: {e}"),
    }
}

#[test]
fn only_clients_with_the_job_secret_are_admitted_and_errors_are_typed() {
    let s = secret("right");
    let server = serve(Some(s.clone()), Limits::default());
    let e = join(&server, Some(&secret("wrong"))).unwrap_err();
    assert!(matches!(e, StoreError::BadSecret { .. }), "{e}");
    let e = join(&server, None).unwrap_err();
    assert!(matches!(e, StoreError::SecretRequired { .. }), "{e}");
    assert!(e.to_string().contains("FERROCOLL_JOB_SECRET"), "{e}");
    let mut ok = join(&server, Some(&s)).unwrap();
    ok.set("k", b"v").unwrap();
    assert_eq!(ok.get("k").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(ok.secret(), Some(&s));
    // A process with a secret refuses a store that asks for none.
    let open = serve(None, Limits::default());
    let e = join(&open, Some(&s)).unwrap_err();
    assert!(matches!(e, StoreError::Unauthenticated { .. }), "{e}");
}

#[test]
fn a_request_sent_before_authenticating_is_refused_and_changes_nothing() {
    let s = secret("right");
    let server = serve(Some(s.clone()), Limits::default());
    // The old protocol: a set request straight away.
    let mut c = TcpStream::connect(server.addr()).unwrap();
    let mut attack = protocol::request(OP_SET, b"pg/tcp/0", b"6.6.6.6:1");
    attack.resize(HELLO_BYTES.max(attack.len()), 0);
    c.write_all(&attack).unwrap();
    let got = until_closed(&mut c, T);
    assert_eq!(
        got.len(),
        GREETING_BYTES + ANSWER_BYTES,
        "greeting, then a verdict"
    );
    assert_eq!(got[GREETING_BYTES], 3, "not a hello");
    // A hello with a wrong proof.
    let mut c = TcpStream::connect(server.addr()).unwrap();
    c.write_all(b"fccl").unwrap();
    c.write_all(&[0u8; HELLO_BYTES - 4]).unwrap();
    let got = until_closed(&mut c, T);
    assert_eq!(got[GREETING_BYTES], 1, "wrong secret");
    let mut ok = join(&server, Some(&s)).unwrap();
    assert_eq!(ok.get("pg/tcp/0").unwrap(), None);
}

#[test]
fn oversized_keys_and_values_are_refused_typed_without_allocating() {
    let server = serve(
        None,
        Limits {
            max_value_bytes: 100,
            ..Limits::default()
        },
    );
    let mut s = join(&server, None).unwrap();
    // Caught by the client before anything is sent.
    let e = s.set(&"k".repeat(5000), b"").unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::TooLarge {
                what: "key",
                len: 5000,
                max: 4096
            }
        ),
        "{e}"
    );
    let e = s.set("k", &vec![0; 2 << 20]).unwrap_err();
    assert!(
        matches!(e, StoreError::TooLarge { what: "value", .. }),
        "{e}"
    );
    // Caught by the server, which names its own cap.
    let e = s.set("k", &[0; 200]).unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::TooLarge {
                what: "value",
                len: 200,
                max: 100
            }
        ),
        "{e}"
    );
    // A raw client announcing a 4 GiB key gets a refusal and a close, at once.
    let mut c = raw(server.addr(), None);
    let mut huge = vec![OP_SET];
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    c.write_all(&huge).unwrap();
    let got = until_closed(&mut c, T);
    assert_eq!(got[0], protocol::REPLY_KEY_TOO_LONG);
}

#[test]
fn the_store_refuses_keys_and_bytes_past_its_caps() {
    let server = serve(
        None,
        Limits {
            max_keys: 10,
            max_total_bytes: 40 * 1024,
            ..Limits::default()
        },
    );
    let mut s = join(&server, None).unwrap();
    for i in 0..10 {
        s.set(&format!("k{i}"), b"v").unwrap();
    }
    let e = s.set("k10", b"v").unwrap_err();
    assert!(
        matches!(&e, StoreError::Full(why) if why.contains("10 keys")),
        "{e}"
    );
    let e = s.add("counter", 1).unwrap_err();
    assert!(matches!(e, StoreError::Full(_)), "{e}");
    // Existing keys may still change, within the byte cap.
    s.set("k0", &[1; 1000]).unwrap();
    let e = s.set("k1", &[1; 50 * 1024]).unwrap_err();
    assert!(
        matches!(&e, StoreError::Full(why) if why.contains("bytes")),
        "{e}"
    );
    assert_eq!(s.get("k1").unwrap().as_deref(), Some(&b"v"[..]));
}

#[test]
fn a_silent_stranger_is_closed_after_the_handshake_timeout() {
    let server = serve(
        Some(secret("x")),
        Limits {
            handshake_timeout: Duration::from_millis(300),
            ..Limits::default()
        },
    );
    let started = Instant::now();
    let mut c = TcpStream::connect(server.addr()).unwrap();
    // Trickling the hello does not stretch the deadline.
    c.write_all(b"f").unwrap();
    let got = until_closed(&mut c, T);
    assert_eq!(got.len(), GREETING_BYTES);
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_half_sent_request_times_out_and_frees_its_slot() {
    let server = serve(
        None,
        Limits {
            frame_timeout: Duration::from_millis(300),
            ..Limits::default()
        },
    );
    let mut c = raw(server.addr(), None);
    assert_eq!(server.connections(), 1);
    let half = protocol::request(OP_SET, b"key", b"value");
    c.write_all(&half[..7]).unwrap();
    let started = Instant::now();
    until_closed(&mut c, T);
    assert!(started.elapsed() < Duration::from_secs(3));
    let deadline = Instant::now() + T;
    while server.connections() != 0 {
        assert!(Instant::now() < deadline, "the slot was never freed");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn idle_strangers_cannot_keep_a_late_rank_out() {
    let s = secret("x");
    let server = serve(
        Some(s.clone()),
        Limits {
            max_pending: 16,
            max_connections: 64,
            ..Limits::default()
        },
    );
    // Far more idle strangers than the server keeps pending or serves.
    let strangers: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(server.addr()).unwrap())
        .collect();
    let started = Instant::now();
    let mut late = join(&server, Some(&s)).unwrap();
    late.set("k", b"v").unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    drop(strangers);
}

#[test]
fn connections_past_the_cap_get_a_typed_busy_error() {
    let server = serve(
        None,
        Limits {
            max_connections: 2,
            ..Limits::default()
        },
    );
    let _a = join(&server, None).unwrap();
    let _b = join(&server, None).unwrap();
    let e = join(&server, None).unwrap_err();
    assert!(matches!(e, StoreError::Busy { .. }), "{e}");
    drop(_a);
    let deadline = Instant::now() + T;
    while server.connections() > 1 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    join(&server, None).expect("a freed slot is reused");
}

#[test]
fn a_store_host_that_exits_is_a_typed_closed_error() {
    // A store that admits one client, then goes away (rank 0 exited).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let host = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        c.write_all(&protocol::greeting(false, &[0; 16])).unwrap();
        let mut hello = [0u8; HELLO_BYTES];
        c.read_exact(&mut hello).unwrap();
        c.write_all(&[0; ANSWER_BYTES]).unwrap();
    });
    let mut s = Store::join_with(&addr.to_string(), 1, T, None).unwrap();
    host.join().unwrap();
    let e = s.get("k").unwrap_err();
    assert!(matches!(e, StoreError::Closed { .. }), "{e}");
    assert!(e.to_string().contains("rank 0"), "{e}");
    assert!(!e.to_string().contains("fill whole buffer"), "{e}");
}

#[test]
fn a_server_that_cannot_prove_the_secret_back_gets_nothing() {
    // A process that takes MASTER_PORT before rank 0 and admits everyone
    // (before: it was treated as the store, learned every key and could
    // hand out its own addresses for the ranks' data ports).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let impostor = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        c.write_all(&protocol::greeting(true, &[5; NONCE_BYTES]))
            .unwrap();
        let mut hello = [0u8; HELLO_BYTES];
        c.read_exact(&mut hello).unwrap();
        // Admitted, with the client's own proof echoed as "ours".
        let mut answer = [0u8; ANSWER_BYTES];
        answer[1..].copy_from_slice(&hello[4 + NONCE_BYTES..]);
        c.write_all(&answer).unwrap();
        until_closed(&mut c, T)
    });
    let e = Store::join_with(&addr.to_string(), 1, T, Some(&secret("ours"))).unwrap_err();
    assert!(matches!(e, StoreError::Impostor { .. }), "{e}");
    assert!(e.to_string().contains("nothing was sent"), "{e}");
    let after_hello = impostor.join().unwrap();
    assert!(
        after_hello.is_empty(),
        "sent {after_hello:?} to an impostor"
    );
}
