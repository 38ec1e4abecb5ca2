//! The rendezvous store of a group formed over MPI: rank 0 serves it and
//! broadcasts where, with a fresh job secret, over the group's own
//! communicator (so the program sets no `MASTER_ADDR`, and no stranger
//! can join).
//!
//! Rank 0 serves on loopback when the launcher put every rank on its node
//! (OpenMPI's and MPICH's local-size variables say so); otherwise on
//! `MASTER_ADDR` when set, else on its first IPv4 interface that is up,
//! running and not loopback (the one a cluster's hosts usually reach each
//! other by; set `MASTER_ADDR` where it is not). The broadcast is
//! non-blocking and given up at the group's deadline, so a rank that never
//! arrives is a typed error, not a hang.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use ferrocoll_rendezvous::{JobSecret, Store};

use super::MpiError;
use super::raw::Comm;

/// What rank 0 broadcasts: `ok`, its address and the secret, or why not.
const OK: &[u8] = b"ok\n";
const ERR: &[u8] = b"err\n";

/// The broadcast's size: `ok`, an address and a 64-digit secret, or a
/// reason, with a 2-byte length in front.
const MESSAGE_BYTES: usize = 1024;

/// Every rank's connection to the group's store (collective over `comm`,
/// given up at `deadline`).
pub(super) fn store(comm: &Comm, timeout: Duration, deadline: Instant) -> Result<Store, MpiError> {
    if comm.rank() == 0 {
        let served = serve(one_node(), timeout);
        let message = match &served {
            Ok((store, secret)) => {
                let addr = store
                    .server_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                [
                    OK,
                    addr.as_bytes(),
                    b"\n",
                    secret.expose().as_encoded_bytes(),
                ]
                .concat()
            }
            Err(e) => [ERR, e.to_string().as_bytes()].concat(),
        };
        comm.broadcast(0, framed(&message), deadline)?;
        return served.map(|(store, _)| store);
    }
    let message = unframed(comm.broadcast(0, vec![0; MESSAGE_BYTES], deadline)?);
    let bootstrap = |reason: String| MpiError::Bootstrap { reason };
    if let Some(why) = message.strip_prefix(ERR) {
        return Err(bootstrap(format!(
            "rank 0 could not serve the store: {}",
            String::from_utf8_lossy(why)
        )));
    }
    let body = message.strip_prefix(OK).ok_or_else(|| {
        bootstrap("rank 0 broadcast something else than a store's address".into())
    })?;
    let cut = body.iter().position(|&b| b == b'\n').unwrap_or(body.len());
    let addr = String::from_utf8_lossy(&body[..cut]).into_owned();
    let secret = body
        .get(cut + 1..)
        .map(|s| std::ffi::OsString::from(String::from_utf8_lossy(s).into_owned()))
        .and_then(JobSecret::new)
        .ok_or_else(|| bootstrap("rank 0 broadcast no job secret".into()))?;
    Store::join_with(&addr, comm.rank(), timeout, Some(&secret))
        .map_err(|e| bootstrap(format!("joining rank 0's store at {addr}: {e}")))
}

/// `message` (cut to fit) with its length in front, in a broadcast's buffer.
fn framed(message: &[u8]) -> Vec<u8> {
    let len = message.len().min(MESSAGE_BYTES - 2);
    let mut out = vec![0; MESSAGE_BYTES];
    out[..2].copy_from_slice(&(len as u16).to_le_bytes());
    out[2..2 + len].copy_from_slice(&message[..len]);
    out
}

/// The message a broadcast's buffer holds (its length checked).
fn unframed(buffer: Vec<u8>) -> Vec<u8> {
    let len = usize::from(u16::from_le_bytes([buffer[0], buffer[1]])).min(MESSAGE_BYTES - 2);
    buffer[2..2 + len].to_vec()
}

/// Whether the launcher put every rank on this node (OpenMPI's and
/// MPICH's variables); `false` when it does not say.
fn one_node() -> bool {
    let var = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    [
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"),
        ("MPI_LOCALNRANKS", "PMI_SIZE"),
    ]
    .iter()
    .any(|(local, all)| matches!((var(local), var(all)), (Some(l), Some(a)) if l == a))
}

/// Rank 0: start the store with a fresh secret.
fn serve(one_node: bool, timeout: Duration) -> Result<(Store, JobSecret), MpiError> {
    let ip = if one_node {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        match std::env::var("MASTER_ADDR") {
            Ok(host) if !host.trim().is_empty() => {
                return start(&format!("{}:0", host.trim()), timeout);
            }
            _ => first_interface().ok_or_else(|| MpiError::Bootstrap {
                reason: "rank 0 has no IPv4 interface other than loopback, but the ranks span \
                         nodes: set MASTER_ADDR to an address of rank 0's the others reach"
                    .into(),
            })?,
        }
    };
    start(&std::net::SocketAddr::new(ip, 0).to_string(), timeout)
}

fn start(addr: &str, timeout: Duration) -> Result<(Store, JobSecret), MpiError> {
    let secret = JobSecret::generate();
    let store =
        Store::join_with(addr, 0, timeout, Some(&secret)).map_err(|e| MpiError::Bootstrap {
            reason: format!("serving at {addr}: {e}"),
        })?;
    Ok((store, secret))
}

/// This host's first IPv4 address that is up and not loopback.
#[cfg(unix)]
fn first_interface() -> Option<IpAddr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocated, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut at = list;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until the
        // freeifaddrs below; its address, where set, is a sockaddr of the
        // family it names.
        let (flags, addr, next) = unsafe { ((*at).ifa_flags, (*at).ifa_addr, (*at).ifa_next) };
        let up = flags & libc::IFF_UP as u32 != 0
            && flags & libc::IFF_RUNNING as u32 != 0
            && flags & libc::IFF_LOOPBACK as u32 == 0;
        // SAFETY: as above; AF_INET addresses are sockaddr_in.
        if up && !addr.is_null() && i32::from(unsafe { (*addr).sa_family }) == libc::AF_INET {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let v4 = unsafe { *(addr as *const libc::sockaddr_in) };
            found = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))));
            break;
        }
        at = next;
    }
    // SAFETY: the list getifaddrs allocated, freed once, not used after.
    unsafe { libc::freeifaddrs(list) };
    found
}

#[cfg(not(unix))]
fn first_interface() -> Option<IpAddr> {
    None
}
