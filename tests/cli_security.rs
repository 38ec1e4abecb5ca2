//! The job secret end to end, through the `env://` bootstrap of real
//! processes: bytes, not text.

#![cfg(unix)]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{free_port, wait_within};

/// `ferrocoll rendezvous` as `rank` of two, meeting at `port`.
fn rank(rank: u32, port: u16, secret: Option<&OsStr>) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrocoll"));
    c.args(["rendezvous", "--timeout", "10"])
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env_remove("FERROCOLL_JOB_SECRET");
    if let Some(s) = secret {
        c.env("FERROCOLL_JOB_SECRET", s);
    }
    c
}

#[test]
fn a_job_secret_that_is_not_unicode_still_authenticates() {
    // Before: a secret with a byte that is not UTF-8 read as no secret at
    // all, and rank 0's store let anyone in.
    let secret = OsStr::from_bytes(b"\xffnot-unicode-secret");
    let port = free_port();
    let mut host = rank(0, port, Some(secret))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stranger = rank(1, port, None).output().unwrap();
    let text = String::from_utf8_lossy(&stranger.stderr);
    assert!(
        !stranger.status.success(),
        "a rank without the secret joined: {text}"
    );
    assert!(text.contains("requires the job secret"), "{text}");
    // The same bytes are admitted.
    let member = rank(1, port, Some(secret)).output().unwrap();
    let text = String::from_utf8_lossy(&member.stdout);
    assert!(
        member.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&member.stderr)
    );
    assert!(text.contains("all 2 ranks met"), "{text}");
    assert!(
        wait_within(&mut host, Duration::from_secs(10)).is_some(),
        "rank 0 did not finish"
    );
}
