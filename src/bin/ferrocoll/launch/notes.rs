//! The launcher's end of the ranks' notes (`ferrocoll::process::launch_note`):
//! an abstract datagram socket named after the job, on which a rank that
//! is failing because a peer failed first says so before it exits.
//!
//! The sender is the pid the kernel attaches (`SO_PASSCRED`), never what
//! the message claims, and it counts only if it is in a rank's process
//! group: another local user who learns the job id can send datagrams,
//! but cannot make them come from a rank.

/// The socket, where one could be bound (Linux).
pub(super) struct Notes {
    #[cfg(target_os = "linux")]
    socket: std::os::unix::net::UnixDatagram,
}

impl Notes {
    /// Bind the job's socket; `None` (blame from exit order alone) where
    /// it cannot be bound.
    #[cfg(target_os = "linux")]
    pub fn bind(job_id: &str) -> Option<Notes> {
        use std::os::fd::AsRawFd;
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixDatagram};
        let name = ferrocoll::process::launch_note::socket_name(job_id);
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
        let socket = UnixDatagram::bind_addr(&addr).ok()?;
        socket.set_nonblocking(true).ok()?;
        let on: libc::c_int = 1;
        // SAFETY: setting an int option on a socket we own, with its size.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        (rc == 0).then_some(Notes { socket })
    }

    #[cfg(not(target_os = "linux"))]
    pub fn bind(_job_id: &str) -> Option<Notes> {
        None
    }

    /// The pids that sent a consequence note since the last look.
    #[cfg(target_os = "linux")]
    pub fn consequences(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        while let Some((pid, body)) = self.receive() {
            if body == ferrocoll::process::launch_note::CONSEQUENCE {
                pids.push(pid);
            }
        }
        pids
    }

    #[cfg(not(target_os = "linux"))]
    pub fn consequences(&self) -> Vec<u32> {
        Vec::new()
    }

    /// One datagram and its sender's pid from the kernel; `None` when none
    /// is queued (or one came without credentials, which is skipped).
    #[cfg(target_os = "linux")]
    fn receive(&self) -> Option<(u32, Vec<u8>)> {
        use std::os::fd::AsRawFd;
        loop {
            let mut body = [0u8; 64];
            // u64s keep the control buffer aligned for cmsghdr.
            let mut control = [0u64; 16];
            let mut iov = libc::iovec {
                iov_base: body.as_mut_ptr().cast(),
                iov_len: body.len(),
            };
            // SAFETY: a zeroed msghdr is valid; its pointers are set below
            // to buffers that outlive the call.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control) as _;
            // SAFETY: msg points at live buffers of the stated sizes.
            let n = unsafe { libc::recvmsg(self.socket.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
            if n < 0 {
                return None;
            }
            if let Some(pid) = sender(&msg) {
                return Some((pid, body[..n as usize].to_vec()));
            }
        }
    }
}

/// The sender's pid from a received message's `SCM_CREDENTIALS`.
#[cfg(target_os = "linux")]
fn sender(msg: &libc::msghdr) -> Option<u32> {
    // SAFETY: walking the control messages the kernel wrote into a buffer
    // recvmsg filled, with the libc macros that bound every step by
    // msg_controllen; the ucred is read unaligned.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_CREDENTIALS
            {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                return u32::try_from(cred.pid).ok();
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    None
}

/// The process group of `pid`, if it still exists.
#[cfg(unix)]
pub(super) fn group_of(pid: u32) -> Option<u32> {
    // SAFETY: getpgid only reads the kernel's process table.
    let group = unsafe { libc::getpgid(pid as libc::pid_t) };
    u32::try_from(group).ok().filter(|&g| g > 0)
}

#[cfg(not(unix))]
pub(super) fn group_of(_pid: u32) -> Option<u32> {
    None
}
