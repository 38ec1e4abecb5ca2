//! The wire protocol's tests: frames, caps, proofs and the table.

use super::*;

#[test]
fn lengths_over_the_caps_are_refused_before_any_body_is_read() {
    let limits = Limits::default();
    let mut huge_key = vec![OP_SET];
    huge_key.extend_from_slice(&u32::MAX.to_le_bytes());
    match read_request(&mut huge_key.as_slice(), &limits) {
        Err(RequestError::Refused((REPLY_KEY_TOO_LONG, max))) => {
            assert_eq!(max, 4096u64.to_le_bytes())
        }
        other => panic!("{other:?}"),
    }
    let mut huge_value = request(OP_SET, b"k", b"");
    huge_value.truncate(1 + 4 + 1);
    huge_value.extend_from_slice(&(64u32 << 20).to_le_bytes());
    assert!(matches!(
        read_request(&mut huge_value.as_slice(), &limits),
        Err(RequestError::Refused((REPLY_VALUE_TOO_LONG, _)))
    ));
    // A length that lies about a short stream is an end of stream, and
    // allocates only what arrived.
    let mut short = request(OP_SET, b"k", b"");
    short.truncate(1 + 4 + 1);
    short.extend_from_slice(&(1u32 << 20).to_le_bytes());
    short.extend_from_slice(b"abc");
    assert!(matches!(
        read_request(&mut short.as_slice(), &limits),
        Err(RequestError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof
    ));
    assert!(matches!(
        read_request(&mut request(9, b"k", b"").as_slice(), &limits),
        Err(RequestError::Refused((REPLY_BAD_REQUEST, _)))
    ));
}

#[test]
fn the_table_keeps_within_its_key_and_byte_caps() {
    let limits = Limits {
        max_keys: 3,
        max_total_bytes: 3 * (ENTRY_OVERHEAD_BYTES + 10),
        ..Limits::default()
    };
    let mut t = Table::default();
    let set = |k: &str, v: &[u8]| Request {
        op: Op::Set,
        key: k.into(),
        value: v.into(),
    };
    for k in ["a", "b", "c"] {
        assert_eq!(t.apply(set(k, b"123456789"), &limits).0, REPLY_OK);
    }
    let (status, why) = t.apply(set("d", b""), &limits);
    assert_eq!(status, REPLY_FULL);
    assert!(String::from_utf8_lossy(&why).contains("3 keys"));
    // Replacing a key is not a new key; growing it past the byte cap is refused.
    assert_eq!(t.apply(set("a", b"x"), &limits).0, REPLY_OK);
    let (status, why) = t.apply(set("a", &[0; 40]), &limits);
    assert_eq!(status, REPLY_FULL, "{}", String::from_utf8_lossy(&why));
    assert!(t.bytes() <= limits.max_total_bytes);
    assert!(t.reserve(limits.max_total_bytes, &limits).is_err());
}

#[test]
fn deleting_a_prefix_frees_its_keys_and_their_bytes_only() {
    let limits = Limits::default();
    let mut t = Table::default();
    let set = |k: &str| Request {
        op: Op::Set,
        key: k.into(),
        value: b"v".to_vec(),
    };
    for k in ["split1.0/pg/a", "split1.0/pg/b", "split1.1/pg/a", "other"] {
        assert_eq!(t.apply(set(k), &limits).0, REPLY_OK);
    }
    let before = t.bytes();
    let del = Request {
        op: Op::DeletePrefix,
        key: b"split1.0/".to_vec(),
        value: Vec::new(),
    };
    let (status, n) = t.apply(del, &limits);
    assert_eq!((status, n), (REPLY_OK, 2u64.to_le_bytes().to_vec()));
    assert_eq!(t.keys(), 2);
    assert_eq!(t.bytes(), before - 2 * cost(b"split1.0/pg/a", b"v"));
}

#[test]
fn counters_neither_wrap_nor_replace_values() {
    let limits = Limits::default();
    let mut t = Table::default();
    let req = |op, k: &str, v: &[u8]| Request {
        op,
        key: k.into(),
        value: v.into(),
    };
    let add = |d: i64| d.to_le_bytes();
    assert_eq!(
        t.apply(req(Op::Add, "n", &add(i64::MAX)), &limits).0,
        REPLY_OK
    );
    let (status, why) = t.apply(req(Op::Add, "n", &add(1)), &limits);
    assert_eq!(
        status,
        REPLY_BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&why)
    );
    assert!(String::from_utf8_lossy(&why).contains("overflows"));
    assert_eq!(t.apply(req(Op::Set, "v", &[7; 100]), &limits).0, REPLY_OK);
    let (status, why) = t.apply(req(Op::Add, "v", &add(1)), &limits);
    assert_eq!(status, REPLY_BAD_REQUEST);
    assert!(String::from_utf8_lossy(&why).contains("not a counter"));
}

#[test]
fn hellos_prove_the_secret_for_this_nonce_only() {
    let s = JobSecret::new("s3cret").unwrap();
    let other = JobSecret::new("guess").unwrap();
    let nonce = [1u8; NONCE_BYTES];
    let mine = [9u8; NONCE_BYTES];
    let check = |h, secret| check_hello(&h, secret, &nonce);
    assert_eq!(
        check(hello(Some(&s), &nonce, &mine), Some(&s)),
        Admission::Accepted
    );
    assert_eq!(
        check(hello(Some(&other), &nonce, &mine), Some(&s)),
        Admission::BadSecret
    );
    assert_eq!(
        check(hello(None, &nonce, &mine), Some(&s)),
        Admission::BadSecret
    );
    assert_eq!(
        check(hello(Some(&s), &[2u8; NONCE_BYTES], &mine), Some(&s)),
        Admission::BadSecret,
        "a proof for another nonce is a replay"
    );
    // The old protocol's first bytes (a set request) are not a hello.
    let mut old = request(OP_SET, b"key", b"v");
    old.resize(HELLO_BYTES, 0);
    let old: [u8; HELLO_BYTES] = old.try_into().unwrap();
    assert_eq!(check(old, None), Admission::BadHello);
    let g = greeting(true, &nonce);
    assert_eq!(parse_greeting(&g), Some(Greeting { auth: true, nonce }));
}

#[test]
fn the_server_proves_the_secret_back_over_the_clients_nonce() {
    let s = JobSecret::new("s3cret").unwrap();
    let (server, client) = ([1u8; NONCE_BYTES], [9u8; NONCE_BYTES]);
    let h = hello(Some(&s), &server, &client);
    let a = answer(Admission::Accepted, Some(&s), &server, &h);
    assert!(server_proved(&a, Some(&s), &server, &client));
    // An impostor that admits everyone without the secret, or echoes
    // the client's own proof, or answers for another client nonce.
    let blind = answer(Admission::Accepted, None, &server, &h);
    assert!(!server_proved(&blind, Some(&s), &server, &client));
    let mut echo = [0u8; ANSWER_BYTES];
    echo[1..].copy_from_slice(&h[4 + NONCE_BYTES..]);
    assert!(!server_proved(&echo, Some(&s), &server, &client));
    assert!(!server_proved(&a, Some(&s), &server, &[8u8; NONCE_BYTES]));
    // Refusals carry no proof.
    assert_eq!(
        answer(Admission::BadSecret, Some(&s), &server, &h)[1..],
        [0; PROOF_BYTES]
    );
}

#[test]
fn the_fuzz_entry_point_survives_odd_inputs() {
    fuzz_server(&[]);
    fuzz_server(&[0xff; 100]);
    let mut data = hello(None, &[0; NONCE_BYTES], &[0; NONCE_BYTES]).to_vec();
    for i in 0..40u32 {
        data.extend(request(OP_SET, &i.to_le_bytes(), &[1; 200]));
        data.extend(request(OP_ADD, &i.to_le_bytes(), &[1; 8]));
    }
    fuzz_server(&data);
}
