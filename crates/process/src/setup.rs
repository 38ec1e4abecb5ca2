//! Forming a group: every rank meets in the rendezvous store, agrees on
//! the settings, and opens the transport to every other rank.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_rendezvous::{Store, StoreError};
use thiserror::Error;

use crate::config::{ProcessConfig, TransportKind};
use crate::transport::Transport;
use crate::transport::tcp::TcpTransport;

/// Why a process group could not be formed.
#[derive(Debug, Error)]
pub enum SetupError {
    /// `world_size` was 0.
    #[error("a process group needs at least one rank (world size 0)")]
    EmptyWorld,
    /// `rank` is not below `world_size`.
    #[error("rank {rank} is out of range for world size {world_size}")]
    RankOutOfRange {
        /// The rank given.
        rank: Rank,
        /// The world size given.
        world_size: u32,
    },
    /// The rendezvous failed (unreachable, timed out, port in use).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Ranks passed different settings.
    #[error(
        "rank {rank}'s settings differ from rank 0's: {mine} vs {theirs} (pass the same ProcessConfig everywhere)"
    )]
    ConfigMismatch {
        /// The rank that noticed.
        rank: Rank,
        /// Its settings.
        mine: String,
        /// Rank 0's.
        theirs: String,
    },
    /// A shared-memory segment could not be created or opened.
    #[error(
        "shared memory: cannot {what} {path}: {source} (all ranks on one host, with room in its tmpfs? or use --transport tcp)"
    )]
    Shm {
        /// Create or open.
        what: &'static str,
        /// The segment's file.
        path: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// A TCP connection could not be made.
    #[error("tcp: {what}: {source}")]
    Tcp {
        /// What was being done.
        what: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// This system has no shared-memory transport.
    #[error("the shared-memory transport needs a Unix system; use tcp")]
    Unsupported,
}

/// The settings every rank must share, as text to compare.
fn fingerprint(config: &ProcessConfig, world_size: u32) -> String {
    format!(
        "world={world_size} transport={} max_message={} slots={} max_channels={} channels={} algorithm={:?} selector={} schedule={:?}",
        config.transport,
        config.max_message_bytes,
        config.slots_per_link,
        config.max_channels,
        config.channels,
        config.algorithm,
        config.selector.is_some(),
        config.schedule.as_ref().map(|v| &v.schedule().name),
    )
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Meet the others and open the transport.
pub(crate) fn connect(
    store: &mut Store,
    rank: Rank,
    world_size: u32,
    config: &ProcessConfig,
) -> Result<Box<dyn Transport>, SetupError> {
    if world_size == 0 {
        return Err(SetupError::EmptyWorld);
    }
    if rank >= world_size {
        return Err(SetupError::RankOutOfRange { rank, world_size });
    }
    let mine = fingerprint(config, world_size);
    store.set(&format!("pg/config/{rank}"), mine.as_bytes())?;
    let theirs = text(store.wait("pg/config/0")?);
    if theirs != mine {
        return Err(SetupError::ConfigMismatch { rank, mine, theirs });
    }
    let transport: Box<dyn Transport> = match config.transport {
        TransportKind::Shm => shm(store, rank, world_size, config)?,
        TransportKind::Tcp => Box::new(tcp(store, rank, world_size, config)?),
    };
    store.barrier("pg/connected", world_size)?;
    tracing::debug!(rank, world_size, transport = %config.transport, "process group formed");
    Ok(transport)
}

#[cfg(unix)]
fn shm(
    store: &mut Store,
    rank: Rank,
    world_size: u32,
    config: &ProcessConfig,
) -> Result<Box<dyn Transport>, SetupError> {
    use crate::transport::shm::segment::{self, Segment};
    use crate::transport::shm::{Shape, ShmTransport};

    let shape = Shape {
        world_size,
        channels: config.max_channels.max(1) + 1,
        slots: config.link_slots(),
        slot_bytes: config.max_message_bytes.max(64),
    };
    if rank == 0 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let token = format!("{}-{nanos:x}", std::process::id());
        store.set("pg/token", token.as_bytes())?;
    }
    let token = text(store.wait("pg/token")?);
    let path_of = |r: Rank| segment::directory().join(format!("ferrocoll-{token}-{r}"));
    let own = path_of(rank);
    let segment = ShmTransport::create_segment(&own, &shape).map_err(|source| SetupError::Shm {
        what: "create",
        path: own.display().to_string(),
        source,
    })?;
    store.set(&format!("pg/shm/{rank}"), own.to_string_lossy().as_bytes())?;
    let mut all: Vec<Option<Segment>> = (0..world_size).map(|_| None).collect();
    let mut pids = vec![std::process::id(); world_size as usize];
    let opened = (|| {
        for peer in (0..world_size).filter(|&p| p != rank) {
            let path = std::path::PathBuf::from(text(store.wait(&format!("pg/shm/{peer}"))?));
            let seg = Segment::open(&path, shape.segment_bytes())
                .and_then(|s| ShmTransport::validate(&s).map(|pid| (s, pid)))
                .map_err(|source| SetupError::Shm {
                    what: "open",
                    path: path.display().to_string(),
                    source,
                })?;
            pids[peer as usize] = seg.1;
            all[peer as usize] = Some(seg.0);
        }
        store.barrier("pg/mapped", world_size)?;
        Ok::<(), SetupError>(())
    })();
    // Every rank has mapped every segment (or gave up): the names are no
    // longer needed, and nothing is left in tmpfs if a process dies.
    segment.unlink();
    opened?;
    all[rank as usize] = Some(segment);
    let all = all
        .into_iter()
        .map(|s| s.expect("every rank mapped"))
        .collect();
    Ok(Box::new(ShmTransport::new(rank, shape, all, pids)))
}

#[cfg(not(unix))]
fn shm(
    _store: &mut Store,
    _rank: Rank,
    _world_size: u32,
    _config: &ProcessConfig,
) -> Result<Box<dyn Transport>, SetupError> {
    Err(SetupError::Unsupported)
}

const HELLO: u32 = u32::from_le_bytes(*b"fcol");

fn tcp(
    store: &mut Store,
    rank: Rank,
    world_size: u32,
    config: &ProcessConfig,
) -> Result<TcpTransport, SetupError> {
    let tcp_err = |what: String| move |source| SetupError::Tcp { what, source };
    let ip = store.local_addr()?.ip();
    let listener =
        TcpListener::bind(SocketAddr::new(ip, 0)).map_err(tcp_err(format!("listen on {ip}")))?;
    let addr = listener
        .local_addr()
        .map_err(tcp_err("read the listening address".into()))?;
    store.set(&format!("pg/tcp/{rank}"), addr.to_string().as_bytes())?;
    let deadline = Instant::now() + config.timeout;
    let mut streams: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
    // Connect to every lower rank (their listeners queue us even before
    // they accept), then accept every higher one.
    for peer in 0..rank {
        let at = text(store.wait(&format!("pg/tcp/{peer}"))?);
        let peer_addr: SocketAddr = at.parse().map_err(|_| SetupError::Tcp {
            what: format!("rank {peer} published a bad address `{at}`"),
            source: std::io::Error::from(std::io::ErrorKind::InvalidData),
        })?;
        let mut stream = loop {
            match TcpStream::connect_timeout(&peer_addr, Duration::from_secs(1)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(SetupError::Tcp {
                        what: format!("connect to rank {peer} at {peer_addr}"),
                        source: e,
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut hello = [0u8; 8];
        hello[..4].copy_from_slice(&HELLO.to_le_bytes());
        hello[4..].copy_from_slice(&rank.to_le_bytes());
        stream
            .write_all(&hello)
            .map_err(tcp_err(format!("greet rank {peer}")))?;
        streams[peer as usize] = Some(stream);
    }
    listener
        .set_nonblocking(true)
        .map_err(tcp_err("set up the listener".into()))?;
    let mut waiting = world_size - rank - 1;
    while waiting > 0 {
        match listener.accept() {
            Ok((mut stream, _from)) => {
                // Read the greeting with what is left of the deadline (at
                // most a second): a silent stranger must not stall us.
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .clamp(Duration::from_millis(10), Duration::from_secs(1));
                let mut hello = [0u8; 8];
                let greeted = stream
                    .set_nonblocking(false)
                    .and_then(|()| stream.set_read_timeout(Some(left)))
                    .and_then(|()| stream.read_exact(&mut hello))
                    .and_then(|()| stream.set_read_timeout(None));
                let peer = u32::from_le_bytes(hello[4..].try_into().expect("4 bytes"));
                let magic = u32::from_le_bytes(hello[..4].try_into().expect("4 bytes"));
                if greeted.is_err() || magic != HELLO || peer <= rank || peer >= world_size {
                    // Not one of ours (a port scanner, another job): ignore it.
                    continue;
                }
                if streams[peer as usize].replace(stream).is_none() {
                    waiting -= 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<Rank> = (rank + 1..world_size)
                        .filter(|&p| streams[p as usize].is_none())
                        .collect();
                    return Err(SetupError::Tcp {
                        what: format!("ranks {missing:?} did not connect to {addr}"),
                        source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(tcp_err("accept".into())(e)),
        }
    }
    TcpTransport::new(
        rank,
        streams,
        config.link_slots(),
        config.timeout,
        config.max_message_bytes.max(64),
    )
    .map_err(tcp_err("start the connection readers".into()))
}
