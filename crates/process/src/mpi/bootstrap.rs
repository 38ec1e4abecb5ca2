//! The rendezvous store of a group formed over MPI: rank 0 serves it and
//! broadcasts where, with a fresh job secret, over the group's own
//! communicator (so the program sets no `MASTER_ADDR`, and no stranger
//! can join).
//!
//! Rank 0 serves on loopback when MPI puts every rank on one node;
//! otherwise on `MASTER_ADDR` when set, else on its first IPv4 interface
//! that is up and not loopback (the one a cluster's hosts usually reach
//! each other by; set `MASTER_ADDR` where it is not).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use ferrocoll_rendezvous::{JobSecret, Store};

use super::MpiError;
use super::raw::Comm;

/// What rank 0 broadcasts: `ok`, its address and the secret, or why not.
const OK: &[u8] = b"ok\n";
const ERR: &[u8] = b"err\n";

/// Every rank's connection to the group's store (collective over `comm`).
pub(super) fn store(comm: &Comm, timeout: Duration) -> Result<Store, MpiError> {
    let one_node = comm.node_size()? == comm.size();
    if comm.rank() == 0 {
        let served = serve(one_node, timeout);
        let mut message = match &served {
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
        comm.broadcast(0, &mut message)?;
        return served.map(|(store, _)| store);
    }
    let mut message = Vec::new();
    comm.broadcast(0, &mut message)?;
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
    let secret = body.get(cut + 1..).map(|s| {
        // SAFETY: the bytes are what rank 0's `as_encoded_bytes` gave, from
        // the same build of this crate on the same platform.
        unsafe { std::ffi::OsString::from_encoded_bytes_unchecked(s.to_vec()) }
    });
    let secret = secret
        .and_then(JobSecret::new)
        .ok_or_else(|| bootstrap("rank 0 broadcast no job secret".into()))?;
    Store::join_with(&addr, comm.rank(), timeout, Some(&secret))
        .map_err(|e| bootstrap(format!("joining rank 0's store at {addr}: {e}")))
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
        let up = flags & libc::IFF_UP as u32 != 0 && flags & libc::IFF_LOOPBACK as u32 == 0;
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
