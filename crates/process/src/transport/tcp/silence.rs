//! How long a TCP peer may stay silent before its connection counts as
//! broken: the kernel's own bound (`TCP_USER_TIMEOUT`, keepalive), so a
//! host that lost power or its link is lost within it whatever the
//! collective timeout.

use std::net::TcpStream;
use std::time::Duration;

/// How long a peer may stay silent — data it was sent unacknowledged, or
/// keepalive probes of an idle connection unanswered — before its
/// connection counts as broken: a host whose link went down or that lost
/// power is lost within this bound, whatever the collective timeout. A
/// peer that is merely slow still acknowledges (its kernel does).
pub(super) const SILENCE: Duration = Duration::from_secs(2);

/// Have the kernel break `stream` after `limit` of silence from the
/// other end (`TCP_USER_TIMEOUT`, with keepalive probes so an idle
/// connection is tested too). Best effort: where the options do not
/// exist the collective timeout still applies.
pub(super) fn bound(stream: &TcpStream, limit: Duration) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let fd = stream.as_raw_fd();
        let secs = (limit.as_secs() / 2).max(1) as libc::c_int;
        let options = [
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs),
            (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, secs),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 2),
            (
                libc::IPPROTO_TCP,
                libc::TCP_USER_TIMEOUT,
                limit.as_millis().min(i32::MAX as u128) as libc::c_int,
            ),
        ];
        for (level, name, value) in options {
            // SAFETY: a setsockopt on a socket this transport owns, with a
            // pointer to a live c_int and its size.
            unsafe {
                libc::setsockopt(
                    fd,
                    level,
                    name,
                    (&value as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (stream, limit);
}
