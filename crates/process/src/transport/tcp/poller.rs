//! Sleeping until a connection has something to read, or until another
//! thread (an abort) asks the waiting one to look again.
//!
//! On Unix this is `poll(2)` over the connections and the read end of a
//! pipe the [`Waker`] writes a byte into. Elsewhere the waiter naps
//! briefly and looks again.

use std::time::Duration;

/// The longest one nap lasts where there is no `poll`.
#[cfg(not(unix))]
const NAP: Duration = Duration::from_micros(200);

/// Wakes a thread sleeping in [`Poller::sleep`] from any thread.
pub(super) struct Waker {
    #[cfg(unix)]
    write: std::os::fd::OwnedFd,
}

impl Waker {
    pub fn wake(&self) {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a one-byte write from a live buffer to a descriptor
            // this waker owns; a full pipe (EAGAIN) already wakes the poller.
            unsafe { libc::write(self.write.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        }
    }
}

/// The waiting side.
pub(super) struct Poller {
    #[cfg(unix)]
    read: std::os::fd::OwnedFd,
}

#[cfg(unix)]
pub(super) type Fd = std::os::fd::RawFd;
#[cfg(not(unix))]
pub(super) type Fd = ();

impl Poller {
    /// A poller and the waker that interrupts it.
    pub fn new() -> std::io::Result<(Poller, Waker)> {
        #[cfg(unix)]
        {
            use std::os::fd::FromRawFd;
            let fds = new_pipe()?;
            // SAFETY: both descriptors were just created and are owned here.
            let (read, write) = unsafe {
                (
                    std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                    std::os::fd::OwnedFd::from_raw_fd(fds[1]),
                )
            };
            Ok((Poller { read }, Waker { write }))
        }
        #[cfg(not(unix))]
        Ok((Poller {}, Waker {}))
    }

    /// Sleep until one of `fds` is readable (or closed), the waker rang,
    /// or `limit` passed. Spurious returns are fine: callers look again.
    pub fn sleep(&self, fds: &[Fd], limit: Duration) {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            let mut set = readable(fds);
            set.push(libc::pollfd {
                fd: self.read.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            if poll(&mut set, limit) && set.last().is_some_and(|p| p.revents != 0) {
                self.drain();
            }
        }
        #[cfg(not(unix))]
        {
            let _ = fds;
            std::thread::sleep(limit.min(NAP));
        }
    }

    #[cfg(unix)]
    fn drain(&self) {
        use std::os::fd::AsRawFd;
        let mut sink = [0u8; 64];
        // SAFETY: reads into a live local buffer from a non-blocking pipe
        // this poller owns; stops at EAGAIN.
        while unsafe { libc::read(self.read.as_raw_fd(), sink.as_mut_ptr().cast(), sink.len()) } > 0
        {
        }
    }
}

/// Sleep until `stream` has room to write, one of `fds` is readable, or
/// `limit` passed.
pub(super) fn wait_writable(stream: &std::net::TcpStream, fds: &[Fd], limit: Duration) {
    #[cfg(unix)]
    {
        let mut set = readable(fds);
        set.push(libc::pollfd {
            fd: fd_of(stream),
            events: libc::POLLOUT,
            revents: 0,
        });
        poll(&mut set, limit);
    }
    #[cfg(not(unix))]
    {
        let _ = (stream, fds);
        std::thread::sleep(limit.min(NAP));
    }
}

/// The descriptor to poll for `stream`.
pub(super) fn fd_of(stream: &std::net::TcpStream) -> Fd {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        stream.as_raw_fd()
    }
    #[cfg(not(unix))]
    let _ = stream;
}

#[cfg(unix)]
fn readable(fds: &[Fd]) -> Vec<libc::pollfd> {
    fds.iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect()
}

/// `poll(2)` for at most `limit`, rounded up to whole milliseconds (a
/// wait shorter than one must not become a spin); whether anything is
/// ready.
#[cfg(unix)]
fn poll(set: &mut [libc::pollfd], limit: Duration) -> bool {
    let ms = limit.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: `set` is a live array of `set.len()` pollfds.
    unsafe { libc::poll(set.as_mut_ptr(), set.len() as libc::nfds_t, ms) > 0 }
}

/// A pipe, both ends non-blocking (a waker never blocks, a drain stops
/// when empty) and not inherited by programs the rank starts — set
/// atomically on Linux, so a fork elsewhere in the process cannot leak it.
#[cfg(target_os = "linux")]
fn new_pipe() -> std::io::Result<[libc::c_int; 2]> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fds)
}

#[cfg(all(unix, not(target_os = "linux")))]
fn new_pipe() -> std::io::Result<[libc::c_int; 2]> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    for fd in fds {
        // SAFETY: fcntl on a descriptor just created here.
        let ok = unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
                && libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) == 0
        };
        if !ok {
            let e = std::io::Error::last_os_error();
            // SAFETY: closing the two descriptors created above, once.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
            return Err(e);
        }
    }
    Ok(fds)
}
