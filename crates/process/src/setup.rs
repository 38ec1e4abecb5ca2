//! Forming a group: every rank meets in the rendezvous store, agrees on
//! the settings, and opens the transport to every other rank.

mod handshake;
mod hosts;
mod shm;
mod watch;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ferrocoll_core::Rank;
use ferrocoll_rendezvous::{JobSecret, Store, StoreError};
#[doc(hidden)]
pub use handshake::fuzz_hello;
use thiserror::Error;

use crate::config::{ProcessConfig, TransportKind};
use crate::layout::HostLayout;
use crate::transport::Transport;
use crate::transport::mixed::MixedTransport;
use crate::transport::tcp::TcpTransport;
use crate::{MpiGroup, cluster};
use watch::Watch;

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
    /// The segments this group needs do not fit this host's tmpfs (or
    /// their size overflows): nothing was created.
    #[error(
        "shared memory: {world_size} ranks need {need} bytes per rank in {dir}, which has {free} free (fewer ranks, smaller ProcessConfig::max_message_bytes or max_channels, or --transport tcp)"
    )]
    ShmSpace {
        /// Ranks in the group.
        world_size: u32,
        /// Bytes one rank's segment needs (`u64::MAX`: more than can be counted).
        need: u64,
        /// Bytes free where segments live.
        free: u64,
        /// Where segments live.
        dir: String,
    },
    /// A peer's process exited while the group was forming.
    #[error("rank {rank} (process {pid}) exited while the group was forming ({during})")]
    PeerExited {
        /// The rank.
        rank: Rank,
        /// Its process id.
        pid: u32,
        /// The setup step this rank was at.
        during: String,
    },
    /// A TCP group needs more connections than this process may open.
    #[error(
        "tcp: {world_size} ranks need a connection to every peer, but this process can hold {capacity} (its file limit, `ulimit -n`, less 64 spare; the tcp transport takes at most 8192 ranks)"
    )]
    TooManyConnections {
        /// Ranks in the group.
        world_size: u32,
        /// Peers this process can hold: its open-file limit (`RLIMIT_NOFILE`)
        /// less spares, at most 8192.
        capacity: u64,
    },
    /// A peer's host card in the store could not be read.
    #[error("rank {rank} published a malformed host card")]
    HostCard {
        /// The rank whose card it is.
        rank: Rank,
    },
    /// Shared memory was asked for, but the group spans several hosts
    /// (ranks whose host keys differ, or who cannot read each other's
    /// probe files in shared memory).
    #[error(
        "shared memory links ranks of one host, but this group spans {hosts} hosts: {layout}; use the tcp transport"
    )]
    NotOneHost {
        /// How many hosts.
        hosts: u32,
        /// Each host and its ranks.
        layout: String,
    },
    /// The group's network model ([`crate::ClusterModel`]: a rate, a
    /// cluster file) gave no selector: rank 0 could not describe the
    /// group, or its description builds none. Every rank reports it.
    #[error("the network between the group's hosts: {reason}")]
    Cluster {
        /// Why, in the model's words.
        reason: String,
    },
    /// This system has no shared-memory transport.
    #[error("the shared-memory transport needs a Unix system; use tcp")]
    Unsupported,
    /// MPI links were asked for and cannot be had: a build without the
    /// `mpi` feature, a group not formed over MPI, or an MPI call failed.
    #[error("MPI links: {reason}")]
    Mpi {
        /// Why.
        reason: String,
    },
}

#[cfg(feature = "mpi")]
impl From<crate::mpi::MpiError> for SetupError {
    fn from(e: crate::mpi::MpiError) -> Self {
        SetupError::Mpi {
            reason: e.to_string(),
        }
    }
}

/// The settings every rank must share, as text to compare (`over_mpi`:
/// the group forms over MPI).
fn fingerprint(config: &ProcessConfig, world_size: u32, over_mpi: bool) -> String {
    // As planned: `None` and the executor's default plan the same.
    let planned = config.planner_settings();
    format!(
        "world={world_size} transport={} net={} max_message={} slots={} max_channels={} channels={} chunk={} algorithm={:?} algorithms={} selector={} schedule={:?} one_shot={} shared_heap={} heap_chunk={} cluster={} kernel_watch={}",
        config.transport,
        if config.net_is_mpi(over_mpi) {
            "mpi"
        } else {
            "tcp"
        },
        config.max_message_bytes,
        planned.slots_per_link,
        config.max_channels,
        planned.channels,
        planned.max_chunk_bytes,
        config.planning.algorithm,
        config
            .planning
            .algorithms
            .as_ref()
            .map_or_else(|| "auto".to_owned(), ToString::to_string),
        config.planning.selector.is_some(),
        config
            .planning
            .schedule
            .as_ref()
            .map(|v| &v.schedule().name),
        // The staging and the heap are laid out from these: ranks that
        // differ would read each other's segments at other offsets.
        config.one_shot_rule(world_size).budget(),
        config.shared_heap_bytes,
        // Calls on the heap's plan are cut with it: ranks that differ
        // would each run their own plan. Without a heap there is none.
        if config.shared_heap_bytes > 0 {
            config.heap_planner_settings().max_chunk_bytes
        } else {
            0
        },
        config
            .cluster
            .as_ref()
            .map_or_else(|| "none".to_owned(), |c| c.0.settings()),
        // Its checkpoints are calls: a rank without them would meet its
        // peers' checkpoint with its next call.
        config.planning.kernel_watch.enabled,
    )
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A formed group, as this rank sees it.
pub(crate) struct Formed {
    /// Its links.
    pub transport: Box<dyn Transport>,
    /// What kinds they are, in words (`shm inside each of 2 hosts, mpi across`).
    pub links: String,
    /// Which rank is on which host.
    pub layout: HostLayout,
    /// Rank 0's description of the network between the hosts, where the
    /// configuration has a model of it and the group spans hosts.
    pub network: Option<String>,
}

/// Meet the others and open the transport; `mpi`: the group forms over
/// MPI, on this communicator (whose ranks are the group's).
pub(crate) fn connect(
    store: &mut Store,
    rank: Rank,
    world_size: u32,
    config: &ProcessConfig,
    mpi: Option<&MpiGroup>,
) -> Result<Formed, SetupError> {
    if world_size == 0 {
        return Err(SetupError::EmptyWorld);
    }
    if rank >= world_size {
        return Err(SetupError::RankOutOfRange { rank, world_size });
    }
    let over_mpi = mpi.is_some();
    let wants_mpi = config.transport == TransportKind::Mpi
        || (config.transport == TransportKind::Auto && config.net_is_mpi(over_mpi));
    if wants_mpi {
        mpi_available(mpi, world_size)?;
    }
    match config.transport {
        TransportKind::Shm => shm::check_capacity(world_size, world_size, config)?,
        TransportKind::Tcp => check_files(world_size)?,
        TransportKind::Mpi => {}
        // Each host is checked once the hosts are known; a group that fits
        // neither on one host nor in a TCP mesh is refused now.
        TransportKind::Auto => {
            if let Err(e) = shm::check_capacity(world_size, world_size, config)
                && !wants_mpi
            {
                check_files(world_size).map_err(|_| e)?;
            }
        }
    }
    let mut watch = Watch::start(store, rank, world_size, config.planning.timeout)?;
    let formed = form(store, &mut watch, (rank, world_size), config, mpi);
    formed.map_err(|e| {
        // A rank killed mid-setup cannot remove its host probe: the ones
        // it named are removed by those that see the setup fail.
        hosts::remove_named_probes(store, world_size);
        // Name the root cause, and leave it for peers that see us exit.
        let e = watch.explain(store, e);
        watch.record_cause(store, &e);
        e
    })
}

/// The largest TCP group: a full mesh, polled by the calling thread,
/// stops making sense well before it, whatever the file limit says.
const MAX_TCP_WORLD: u64 = 8192;

/// Refuse a TCP group whose connections this process could not open: one
/// per peer, plus room for the store, the listener and the program's own
/// (and never more than [`MAX_TCP_WORLD`] ranks).
#[cfg(unix)]
fn check_files(world_size: u32) -> Result<(), SetupError> {
    const SPARE: u64 = 64;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Ok(());
    }
    // `rlim_t` is narrower than u64 on some 32-bit targets.
    #[allow(clippy::unnecessary_cast)]
    let files = limit.rlim_cur as u64;
    let capacity = files.saturating_sub(SPARE).min(MAX_TCP_WORLD);
    if u64::from(world_size) > capacity {
        return Err(SetupError::TooManyConnections {
            world_size,
            capacity,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_files(_world_size: u32) -> Result<(), SetupError> {
    Ok(())
}

/// Agree on the settings, open the transport and meet at the last barrier,
/// every wait watching the peers' processes.
fn form(
    store: &mut Store,
    watch: &mut Watch,
    (rank, world_size): (Rank, u32),
    config: &ProcessConfig,
    mpi: Option<&MpiGroup>,
) -> Result<Formed, SetupError> {
    let mine = fingerprint(config, world_size, mpi.is_some());
    store.set(&format!("pg/config/{rank}"), mine.as_bytes())?;
    let theirs = text(watch.wait(store, "pg/config/0")?);
    if theirs != mine {
        return Err(SetupError::ConfigMismatch { rank, mine, theirs });
    }
    let layout = hosts::discover(store, watch, rank, world_size, config)?;
    if config.transport == TransportKind::Shm && layout.hosts() > 1 {
        // Every rank refuses alike; rank 0 holds the store until each has
        // read what it needs, so none sees a closed store instead.
        store.set(&format!("pg/refused/{rank}"), b"1")?;
        if rank == 0 {
            hold_store_for_refusals(store, world_size, config.planning.timeout);
        }
        return Err(SetupError::NotOneHost {
            hosts: layout.hosts(),
            layout: (0..layout.hosts())
                .map(|h| layout.describe_host(h))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let network = describe_network(store, watch, rank, &layout, config)?;
    let (transport, links) = open(store, watch, (rank, world_size), &layout, config, mpi)?;
    watch.barrier(store, "pg/connected")?;
    reclaim(store, world_size)?;
    tracing::debug!(
        rank,
        world_size,
        hosts = layout.hosts(),
        transport = %config.transport,
        "process group formed"
    );
    Ok(Formed {
        transport,
        links,
        layout,
        network,
    })
}

/// Rank 0's description of the network between the hosts, read by every
/// rank: only where a model is configured, the group spans hosts, and
/// nothing forced leaves the selector a choice.
fn describe_network(
    store: &mut Store,
    watch: &mut Watch,
    rank: Rank,
    layout: &HostLayout,
    config: &ProcessConfig,
) -> Result<Option<String>, SetupError> {
    let planning = &config.planning;
    let Some(model) = &config.cluster else {
        return Ok(None);
    };
    if layout.hosts() < 2
        || planning.algorithm.is_some()
        || planning.schedule.is_some()
        || planning.selector.is_some()
    {
        return Ok(None);
    }
    const KEY: &str = "pg/cluster";
    if rank == 0 {
        store.set(
            KEY,
            cluster::publishable(model.0.as_ref(), layout).as_bytes(),
        )?;
    }
    cluster::read_published(text(watch.wait(store, KEY)?))
        .map(Some)
        .map_err(|reason| SetupError::Cluster { reason })
}

/// The links of `rank`: shared memory to the ranks of its host and the
/// network (TCP, or MPI) to the others, unless the configuration forces
/// one kind.
fn open(
    store: &mut Store,
    watch: &mut Watch,
    (rank, world_size): (Rank, u32),
    layout: &HostLayout,
    config: &ProcessConfig,
    mpi: Option<&MpiGroup>,
) -> Result<(Box<dyn Transport>, String), SetupError> {
    let local = layout.ranks_on(layout.host(rank));
    let everyone = |_: Rank| true;
    let one_host = layout.hosts() == 1;
    let alone = (0..layout.hosts()).all(|h| layout.ranks_on(h).len() == 1);
    let net_mpi = config.net_is_mpi(mpi.is_some());
    let kind = match config.transport {
        TransportKind::Auto if one_host => TransportKind::Shm,
        TransportKind::Auto if alone && net_mpi => TransportKind::Mpi,
        TransportKind::Auto if alone => TransportKind::Tcp,
        kind => kind,
    };
    let links = match (kind, layout.hosts()) {
        (TransportKind::Auto, hosts) => format!(
            "shm inside each of {hosts} hosts, {} across",
            if net_mpi { "mpi" } else { "tcp" }
        ),
        (kind, 1) => kind.to_string(),
        (kind, hosts) => format!("{kind} ({hosts} hosts)"),
    };
    let transport: Box<dyn Transport> = match kind {
        TransportKind::Shm => {
            if config.transport == TransportKind::Auto {
                shm::check_capacity(world_size, world_size, config)?;
            }
            Box::new(shm::open(store, watch, rank, &local, world_size, config)?)
        }
        TransportKind::Tcp => {
            if config.transport == TransportKind::Auto {
                check_files(world_size)?;
            }
            Box::new(tcp(store, watch, rank, world_size, &everyone, config)?)
        }
        TransportKind::Mpi => mpi_links(mpi, world_size, config, None)?,
        TransportKind::Auto if net_mpi => {
            shm::check_capacity(local.len() as u32, world_size, config)?;
            // The MPI side first: a group that cannot have it makes no segments.
            mpi_available(mpi, world_size)?;
            let shm = shm::open(store, watch, rank, &local, world_size, config)?;
            mpi_links(mpi, world_size, config, Some((rank, &local, shm)))?
        }
        TransportKind::Auto => {
            shm::check_capacity(local.len() as u32, world_size, config)?;
            check_files(world_size)?;
            let shm = shm::open(store, watch, rank, &local, world_size, config)?;
            let remote = |peer: Rank| !layout.same_host(rank, peer);
            let tcp = tcp(store, watch, rank, world_size, &remote, config)?;
            Box::new(MixedTransport::new(rank, &local, world_size, shm, tcp))
        }
    };
    Ok((transport, links))
}

/// Refuse MPI links where there is no MPI group of `world_size` ranks.
fn mpi_available(mpi: Option<&MpiGroup>, world_size: u32) -> Result<(), SetupError> {
    let reason = if cfg!(not(feature = "mpi")) {
        "this build of ferrocoll has no MPI (build it with the `mpi` feature)".to_owned()
    } else {
        match mpi.map(MpiGroup::size) {
            Some(n) if n == world_size => return Ok(()),
            Some(n) => format!("the MPI communicator has {n} ranks, the group {world_size}"),
            None => "MPI links need a group formed over MPI (`ProcessCommunicator::connect_mpi`, \
                     or `ferrocoll::env::mpi_communicator` under mpirun)"
                .to_owned(),
        }
    };
    Err(SetupError::Mpi { reason })
}

/// MPI links to every rank, or — with this rank's host's shared-memory
/// links — MPI to the ranks of other hosts only.
#[cfg(feature = "mpi")]
fn mpi_links(
    mpi: Option<&MpiGroup>,
    world_size: u32,
    config: &ProcessConfig,
    shm: Option<(Rank, &[Rank], crate::transport::shm::ShmTransport)>,
) -> Result<Box<dyn Transport>, SetupError> {
    use crate::transport::mpi::MpiTransport;
    mpi_available(mpi, world_size)?;
    let group = mpi.expect("checked just above");
    let net = MpiTransport::new(
        group,
        config.link_slots(),
        config.max_message_bytes.max(64),
        config.one_shot_rule(world_size).staging_bytes(world_size),
        config.mpi_fragment_bytes,
    );
    Ok(match shm {
        None => Box::new(net),
        Some((rank, local, shm)) => {
            Box::new(MixedTransport::new(rank, local, world_size, shm, net))
        }
    })
}

#[cfg(not(feature = "mpi"))]
fn mpi_links(
    mpi: Option<&MpiGroup>,
    world_size: u32,
    _config: &ProcessConfig,
    _shm: Option<(Rank, &[Rank], crate::transport::shm::ShmTransport)>,
) -> Result<Box<dyn Transport>, SetupError> {
    mpi_available(mpi, world_size).map(|()| unreachable!("no MPI group exists without the feature"))
}

/// Keep rank 0 (and the store it hosts) up until every rank has said it
/// refuses, for at most a few seconds: a peer that died meanwhile must
/// not hold it for the whole timeout, and one that exited after saying
/// so must not end the wait for the others.
fn hold_store_for_refusals(store: &mut Store, world_size: u32, timeout: Duration) {
    let until = Instant::now() + timeout.min(Duration::from_secs(5));
    let mut pending: Vec<u32> = (1..world_size).collect();
    while !pending.is_empty() && Instant::now() < until {
        pending.retain(|p| !matches!(store.get(&format!("pg/refused/{p}")), Ok(Some(_))));
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Remove the setup's keys once every member is past its last use of
/// them: each member counts itself done after the last barrier, and the
/// last to do so (nobody reads them any more) deletes them. Without this
/// a store that forms a group per `split` fills after some thousands.
fn reclaim(store: &mut Store, world_size: u32) -> Result<(), SetupError> {
    if store.add("pg/done", 1)? == i64::from(world_size) {
        store.delete_prefix("pg/")?;
        store.delete_prefix("barrier/pg/")?;
    }
    Ok(())
}

/// Open the TCP transport to the `wanted` peers: publish a data port,
/// dial every lower one and accept every higher one, each connection
/// authenticated with the job secret the store was joined with (see
/// [`handshake`]).
fn tcp(
    store: &mut Store,
    watch: &mut Watch,
    rank: Rank,
    world_size: u32,
    wanted: &dyn Fn(Rank) -> bool,
    config: &ProcessConfig,
) -> Result<TcpTransport, SetupError> {
    let tcp_err = |what: String| move |source| SetupError::Tcp { what, source };
    let secret = store.secret().cloned();
    let ip = store.local_addr()?.ip();
    let listener =
        TcpListener::bind(SocketAddr::new(ip, 0)).map_err(tcp_err(format!("listen on {ip}")))?;
    let addr = listener
        .local_addr()
        .map_err(tcp_err("read the listening address".into()))?;
    store.set(&format!("pg/tcp/{rank}"), addr.to_string().as_bytes())?;
    let deadline = watch.deadline();
    let mut streams: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
    // Dial every lower rank (each answers once it has dialed its own lower
    // ranks, so rank 0 first), then accept every higher one.
    for peer in (0..rank).filter(|&p| wanted(p)) {
        let stream = dial_peer(
            store,
            watch,
            rank,
            peer,
            world_size,
            secret.as_ref(),
            deadline,
        )?;
        streams[peer as usize] = Some(stream);
    }
    let mut peers_alive = || watch.check(store, "waiting for higher ranks to connect");
    handshake::accept_peers(
        &listener,
        rank,
        &mut streams,
        wanted,
        secret.as_ref(),
        deadline,
        &mut peers_alive,
    )?;
    TcpTransport::new(
        rank,
        streams,
        config.link_slots(),
        config.planning.timeout,
        config.max_message_bytes.max(64),
        config.one_shot_rule(world_size).staging_bytes(world_size),
    )
    .map_err(tcp_err("set the connections up".into()))
}

/// Connect to `peer`'s published data port and run the dialer's handshake.
fn dial_peer(
    store: &mut Store,
    watch: &mut Watch,
    rank: Rank,
    peer: Rank,
    world_size: u32,
    secret: Option<&JobSecret>,
    deadline: Instant,
) -> Result<TcpStream, SetupError> {
    let at = text(watch.wait(store, &format!("pg/tcp/{peer}"))?);
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
            Err(_) => {
                watch.check(store, &format!("connecting to rank {peer}"))?;
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    handshake::dial(&mut stream, rank, peer, world_size, secret, deadline).map_err(|source| {
        SetupError::Tcp {
            what: format!("handshake with rank {peer} at {peer_addr}"),
            source,
        }
    })?;
    Ok(stream)
}
