use super::inflow::Pieces;
use super::*;
use crate::transport::message::frame::{self, Frame, MAX_WIRE_CHANNELS, PREFIX_BYTES};
use ferrocoll_core::link::HEADER_BYTES;
use std::io::Write;
use std::net::TcpListener;

/// Rank 0's transport, connected to a test socket playing rank 1.
fn pair() -> (TcpTransport, TcpStream) {
    pair_with_room(0)
}

/// [`pair`] with room for one-shot inputs of `room` bytes.
fn pair_with_room(room: usize) -> (TcpTransport, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mine, _) = listener.accept().unwrap();
    let t = TcpTransport::new(
        0,
        vec![None, Some(mine)],
        2,
        Duration::from_secs(5),
        4096,
        room,
    )
    .unwrap();
    (t, peer)
}

fn frame(kind: u32, channel: u32, len: u64) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&kind.to_le_bytes());
    f.extend_from_slice(&channel.to_le_bytes());
    f.extend_from_slice(&len.to_le_bytes());
    f
}

fn data_frame(channel: u32, call: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = frame(DATA, channel, (HEADER_BYTES + payload.len()) as u64);
    f.extend_from_slice(&Header::new(call, payload.len(), "test").encode());
    f.extend_from_slice(payload);
    f
}

fn failure_of(t: &mut TcpTransport) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Err(e) = t.check() {
            return e.to_string();
        }
        assert!(Instant::now() < deadline, "the bad frame went unnoticed");
        let seen = t.ticket();
        t.wait(seen, Instant::now() + Duration::from_millis(50));
    }
}

/// Every frame `bytes` holds, read through `Inflow` in pieces of the
/// given sizes; `Err` with what stopped it.
fn read_all(bytes: &[u8], cuts: Vec<usize>, max_payload: usize) -> (Vec<Frame>, std::io::Error) {
    let mut source = Pieces {
        data: bytes,
        cuts,
        turn: 0,
        stall: false,
    };
    let mut inflow = Inflow::new(max_payload, 2);
    let mut frames = Vec::new();
    loop {
        if let Err(e) = inflow.pump(&mut source, |f| {
            frames.push(f);
            Ok(())
        }) {
            return (frames, e);
        }
    }
}

#[test]
fn frames_announcing_absurd_lengths_fail_the_peer_without_allocating() {
    for bad in [
        frame(DATA, 0, 1 << 60),
        frame(DATA, 0, 3),
        frame(FAIL, 0, 1 << 40),
        frame(ACK, 0, 0),
        frame(ACK, 0, 1 << 50),
        frame(BYE, 0, 8),
        frame(99, 0, 0),
    ] {
        let (mut t, mut peer) = pair();
        peer.write_all(&bad).unwrap();
        let e = failure_of(&mut t);
        assert!(
            e.contains("rank 1 failed") && e.contains("protocol error"),
            "{e}"
        );
    }
}

#[test]
fn an_ack_returning_no_credit_is_a_protocol_error() {
    let (mut t, mut peer) = pair();
    let mut f = frame(ACK, 0, 8);
    f.extend_from_slice(&0u64.to_le_bytes());
    peer.write_all(&f).unwrap();
    assert!(failure_of(&mut t).contains("no credit"));
}

#[test]
fn a_fail_frame_blaming_a_rank_outside_the_group_is_a_protocol_error_of_the_sender() {
    for culprit in [2, 99, u32::MAX] {
        let (mut t, mut peer) = pair();
        peer.write_all(&frame(FAIL, culprit, 4)).unwrap();
        peer.write_all(b"boom").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let e = loop {
            if let Err(e) = t.check() {
                break e;
            }
            assert!(Instant::now() < deadline, "the bad frame went unnoticed");
            std::thread::sleep(Duration::from_millis(5));
        };
        match &e {
            CommError::PeerFailed { rank, reason } => {
                assert_eq!(*rank, 1, "the sender is blamed, not rank {culprit}: {e}");
                assert!(reason.contains("protocol error"), "{e}");
            }
            other => panic!("{other}"),
        }
    }
}

#[test]
fn a_peers_failure_text_reaches_the_survivor_with_its_escape_codes_defused() {
    // Before: "\x1b[2J" in a peer's reason cleared the survivor's screen
    // when the error was printed.
    let (mut t, mut peer) = pair();
    let reason = b"\x1b[2J\x1b]0;title\x07panicked\r\n";
    // Failed at position 0: it concerns every call.
    peer.write_all(&frame(FAIL, 1, 8 + reason.len() as u64))
        .unwrap();
    peer.write_all(&0u64.to_le_bytes()).unwrap();
    peer.write_all(reason).unwrap();
    let text = failure_of(&mut t);
    assert!(!text.chars().any(char::is_control), "{text:?}");
    assert!(
        text.contains("\\u{1b}[2J") && text.contains("panicked"),
        "{text}"
    );
}

#[test]
fn frames_on_channels_past_the_wire_bound_are_protocol_errors() {
    for channel in [MAX_WIRE_CHANNELS, u32::MAX - 1] {
        let mut bad = frame(ACK, channel, 8);
        bad.extend_from_slice(&1u64.to_le_bytes());
        let (mut t, mut peer) = pair();
        peer.write_all(&bad).unwrap();
        let e = failure_of(&mut t);
        assert!(e.contains("protocol error") && e.contains("channel"), "{e}");
    }
    // The point-to-point channel is one a peer may use.
    let mut stream = frame(ACK, u32::MAX, 8);
    stream.extend_from_slice(&3u64.to_le_bytes());
    stream.extend(frame(BYE, 0, 0));
    let (frames, end) = read_all(&stream, vec![5, 1, 40], 64);
    assert_eq!(end.kind(), std::io::ErrorKind::UnexpectedEof);
    assert!(matches!(
        frames[..],
        [
            Frame::Ack {
                channel: u32::MAX,
                count: 3
            },
            Frame::Bye
        ]
    ));
}

#[test]
fn the_frame_reader_survives_truncated_and_garbled_streams() {
    let good = data_frame(0, 3, &[1u8; 8]);
    for cut in 0..good.len() {
        let (frames, end) = read_all(&good[..cut], vec![3, 7], 64);
        assert!(frames.is_empty(), "cut at {cut}");
        assert_eq!(
            end.kind(),
            std::io::ErrorKind::UnexpectedEof,
            "cut at {cut}"
        );
    }
    let (frames, _) = read_all(&good, vec![1], 64);
    assert!(matches!(frames[..], [Frame::Data { .. }]));
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..2000 {
        let bytes: Vec<u8> = (0..64)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        fuzz_frames(&bytes);
    }
}

/// Small and large frames interleaved, read in odd piece sizes: each
/// comes out whole and in order, a large payload straight into its own
/// buffer.
#[test]
fn frames_of_every_size_survive_any_split() {
    let sizes = [
        0usize,
        1,
        8,
        4096,
        70_000,
        3,
        200_000,
        65_536 - PREFIX_BYTES - HEADER_BYTES,
    ];
    let mut stream = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let payload: Vec<u8> = (0..n).map(|k| (k * 7 + i) as u8).collect();
        stream.extend(data_frame(i as u32, i as u64, &payload));
    }
    for cuts in [
        vec![1 << 20],
        vec![1],
        vec![13, 4096, 100_000, 7],
        vec![65_536],
    ] {
        let (frames, end) = read_all(&stream, cuts.clone(), 1 << 20);
        assert_eq!(end.kind(), std::io::ErrorKind::UnexpectedEof);
        assert_eq!(frames.len(), sizes.len(), "{cuts:?}");
        for (i, f) in frames.iter().enumerate() {
            let Frame::Data {
                channel,
                header,
                data,
                ..
            } = f
            else {
                panic!("{f:?}")
            };
            assert_eq!((*channel, header.call), (i as u32, i as u64));
            let bytes = frame::payload_bytes_of(data);
            assert!(
                (0..sizes[i]).all(|k| bytes[k] == (k * 7 + i) as u8),
                "{cuts:?} frame {i}"
            );
        }
    }
}

#[test]
fn a_payload_that_disagrees_with_its_header_is_refused() {
    let (mut t, mut peer) = pair();
    let header = Header::new(0, 100, "all-reduce").encode();
    peer.write_all(&frame(DATA, 0, (HEADER_BYTES + 8) as u64))
        .unwrap();
    peer.write_all(&header).unwrap();
    peer.write_all(&[0u8; 8]).unwrap();
    let e = failure_of(&mut t);
    assert!(e.contains("header says 100"), "{e}");
    assert!(t.peek(1, 0).unwrap().is_none(), "nothing was queued");
}

#[test]
fn a_closed_connection_is_a_lost_peer_and_bye_is_not() {
    // A lost peer is gone, not a failure of calls that need nothing
    // more from it: what it sent is still delivered.
    let (mut t, mut peer) = pair();
    peer.write_all(&data_frame(5, 0, &[9u8; 16])).unwrap();
    drop(peer);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !t.departed(1) {
        assert!(Instant::now() < deadline);
        let seen = t.ticket();
        t.wait(seen, Instant::now() + Duration::from_millis(5));
    }
    assert!(t.farewell(1).contains("lost"), "{}", t.farewell(1));
    assert!(t.check().is_ok());
    assert!(
        t.peek(1, 5).unwrap().is_some(),
        "its last message is still here"
    );
    let (mut t, mut peer) = pair();
    peer.write_all(&frame(BYE, 0, 0)).unwrap();
    drop(peer);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !t.departed(1) {
        assert!(Instant::now() < deadline);
        let seen = t.ticket();
        t.wait(seen, Instant::now() + Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(t.check().is_ok(), "leaving cleanly is not a failure");
}

/// Credits for consumed messages travel in front of the next frame to
/// the same peer, or at the end of the call: never one ack per message.
#[test]
fn credits_ride_with_the_next_frame_or_settle_at_the_end_of_a_call() {
    let (mut t, mut peer) = pair();
    for call in 0..2 {
        peer.write_all(&data_frame(5, call, &[9u8; 16])).unwrap();
    }
    while t.peek(1, 5).unwrap().map(|_| ()).is_none() || t.mail.queues[&(1, 5)].len() < 2 {
        let seen = t.ticket();
        t.wait(seen, Instant::now() + Duration::from_millis(20));
    }
    t.release(1, 5).unwrap();
    t.release(1, 5).unwrap();
    let room = t.reserve(1, 0, 8).unwrap().unwrap();
    // SAFETY: the reserved room holds 8 bytes.
    unsafe { room.write_bytes(1, 8) };
    t.commit(1, 0, &Header::new(0, 8, "x")).unwrap();
    let mut got = vec![0u8; 24 + PREFIX_BYTES + HEADER_BYTES + 8];
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::io::Read::read_exact(&mut peer, &mut got).unwrap();
    let (frames, _) = read_all(&got, vec![1 << 20], 64);
    assert!(
        matches!(
            frames[..],
            [
                Frame::Ack {
                    channel: 5,
                    count: 2
                },
                Frame::Data { channel: 0, .. }
            ]
        ),
        "{frames:?}"
    );
    peer.write_all(&data_frame(5, 2, &[1u8; 8])).unwrap();
    while t.peek(1, 5).unwrap().is_none() {
        let seen = t.ticket();
        t.wait(seen, Instant::now() + Duration::from_millis(20));
    }
    t.release(1, 5).unwrap();
    t.settle();
    let mut ack = [0u8; 24];
    std::io::Read::read_exact(&mut peer, &mut ack).unwrap();
    let (frames, _) = read_all(&ack, vec![24], 64);
    assert!(
        matches!(
            frames[..],
            [Frame::Ack {
                channel: 5,
                count: 1
            }]
        ),
        "{frames:?}"
    );
}

/// Two ranks writing more to each other than the sockets hold at once,
/// neither reading in between: each write reads while it waits, so both
/// finish.
#[test]
fn writers_facing_each_other_do_not_deadlock() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    let big = 8 << 20;
    let make = |rank: Rank, s: TcpStream| {
        let streams = if rank == 0 {
            vec![None, Some(s)]
        } else {
            vec![Some(s), None]
        };
        TcpTransport::new(rank, streams, 4, Duration::from_secs(20), big, 0).unwrap()
    };
    let run = |mut t: TcpTransport, peer: Rank| {
        std::thread::spawn(move || {
            for call in 0..3u64 {
                let room = t.reserve(peer, 0, big).unwrap().unwrap();
                // SAFETY: the reserved room holds `big` bytes.
                unsafe { room.write_bytes(call as u8 + 1, big) };
                t.commit(peer, 0, &Header::new(call, big, "x")).unwrap();
            }
            for call in 0..3u64 {
                let deadline = Instant::now() + Duration::from_secs(20);
                let m = loop {
                    if let Some(m) = t.peek(peer, 0).unwrap() {
                        break m;
                    }
                    assert!(Instant::now() < deadline, "no message {call}");
                    let seen = t.ticket();
                    t.wait(seen, deadline);
                };
                assert_eq!((m.call, m.len), (call, big));
                // SAFETY: the message holds `m.len` bytes until released.
                let bytes = unsafe { std::slice::from_raw_parts(m.payload, m.len) };
                assert!(bytes.iter().all(|&b| b == call as u8 + 1));
                t.release(peer, 0).unwrap();
            }
            t.settle();
            t
        })
    };
    let (ta, tb) = (run(make(0, a), 1), run(make(1, b), 0));
    let (ta, tb) = (ta.join().unwrap(), tb.join().unwrap());
    drop((ta, tb));
}

/// A peer that sends more than its credits allow (or floods
/// announcements) broke the protocol: the link fails instead of queueing
/// without bound.
#[test]
fn messages_beyond_the_credits_are_a_protocol_error() {
    for (channel, allowed) in [(0u32, 2u32), (CONTROL_CHANNEL, 4)] {
        let (mut t, mut peer) = pair();
        for call in 0..=u64::from(allowed) {
            peer.write_all(&data_frame(channel, call, &[0u8; 8]))
                .unwrap();
        }
        let e = failure_of(&mut t);
        assert!(
            e.contains("protocol error") && e.contains("unconsumed"),
            "{e}"
        );
    }
}

/// A one-shot input travels inside the announcement; peers keep it by
/// call parity, so the next call's does not replace this one's.
#[test]
fn announced_inputs_are_kept_by_call_parity() {
    let (mut t, mut peer) = pair_with_room(64);
    for (call, fill) in [(6u64, 1u8), (7, 2)] {
        peer.write_all(&data_frame(CONTROL_CHANNEL, call, &[fill; 24]))
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while t
        .mail
        .queues
        .get(&(1, CONTROL_CHANNEL))
        .map_or(0, |q| q.len())
        < 2
    {
        assert!(Instant::now() < deadline);
        let seen = t.ticket();
        t.wait(seen, Instant::now() + Duration::from_millis(20));
    }
    assert_eq!(t.announcement(1).unwrap().map(|h| h.call), Some(7));
    for (call, fill) in [(6u64, 1u8), (7, 2)] {
        let (at, len) = t.staging(1, call).unwrap();
        // SAFETY: the staged input holds `len` bytes while kept.
        let bytes = unsafe { std::slice::from_raw_parts(at, len) };
        assert_eq!(bytes, &[fill; 24]);
    }
    assert!(
        t.staging(1, 8).is_none(),
        "no input for a call not announced"
    );
    assert_eq!(t.staging(0, 0).map(|(_, room)| room), Some(64));
    assert!(pair().0.staging(0, 0).is_none(), "no one-shot without room");
}
