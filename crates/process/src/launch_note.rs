//! Telling `ferrocoll launch` that this process is failing because a
//! peer failed first, so the launcher does not name it as the cause.
//!
//! Exit order alone cannot tell cause from consequence: a rank that
//! `.unwrap()`s the [`CommError::PeerFailed`](ferrocoll_core::comm::CommError)
//! its peer's death gave it exits 101 (a panic) right after the culprit,
//! and a rank that panics on its own bug exits after the peers that saw
//! it go. So each rank says which it is, once, before the error reaches
//! its caller: a datagram to the launcher's socket, named after the job
//! (`FERROCOLL_JOB_ID`). The launcher checks the sender's pid from the
//! kernel's credentials, not from the message. Without a launcher (no
//! job id, or no one bound to the name) the datagram goes nowhere.

use std::sync::atomic::{AtomicBool, Ordering};

/// The abstract socket name the launcher of job `job_id` reads notes on.
pub fn socket_name(job_id: &str) -> String {
    format!("ferrocoll-launch-{job_id}")
}

/// The one note there is: this process fails as a consequence.
pub const CONSEQUENCE: &[u8] = b"consequence";

/// Send the note for this process, once; never fails the caller.
pub(crate) fn peer_failed_first(job_id: Option<&str>) {
    static SENT: AtomicBool = AtomicBool::new(false);
    let Some(job) = job_id else { return };
    if SENT.swap(true, Ordering::Relaxed) {
        return;
    }
    send(&socket_name(job));
}

#[cfg(target_os = "linux")]
fn send(name: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Ok(addr) = SocketAddr::from_abstract_name(name.as_bytes()) else {
        return;
    };
    if let Ok(socket) = UnixDatagram::unbound() {
        // A full queue or no launcher: the note is advice, never an error.
        let _ = socket.set_nonblocking(true);
        let _ = socket.send_to_addr(CONSEQUENCE, &addr);
    }
}

#[cfg(not(target_os = "linux"))]
fn send(_name: &str) {}
