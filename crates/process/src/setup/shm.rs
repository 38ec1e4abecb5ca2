//! Forming a shared-memory group without leaving anything behind.
//!
//! Every rank creates its own segment, maps every peer's, and once all
//! ranks have mapped everything removes every name of the group (its own
//! and, in case that peer died just then, its peers'), so from then on no
//! name is left in tmpfs whatever happens to the processes. Before that point a
//! rank that fails — or notices a peer process exit, within about 50 ms —
//! removes every segment name of the group, its peers' included: the
//! names carry a token unique to this group, and a dead rank cannot
//! remove its own. When `ProcessConfig::job_id` is set (from
//! `FERROCOLL_JOB_ID`, which `ferrocoll launch` sets), the names start with it, so the launcher can remove what
//! ranks killed together left behind.

use std::path::PathBuf;

use ferrocoll_core::Rank;
use ferrocoll_rendezvous::Store;

use super::SetupError;
use super::watch::Watch;
use crate::config::ProcessConfig;
use crate::transport::Transport;
use crate::transport::shm::segment::{self, Segment};
use crate::transport::shm::{Shape, ShmTransport};

/// Open the shared-memory transport of `rank`.
pub(super) fn open(
    store: &mut Store,
    watch: &mut Watch,
    rank: Rank,
    world_size: u32,
    config: &ProcessConfig,
) -> Result<Box<dyn Transport>, SetupError> {
    let shape = shape(world_size, config);
    if rank == 0 {
        store.set("pg/token", new_token(config.job_id.as_deref()).as_bytes())?;
    }
    let token = String::from_utf8_lossy(&watch.wait(store, "pg/token")?).into_owned();
    let names = Names { token, world_size };
    form(store, watch, rank, &shape, &names).map_err(|e| {
        // Explain first: "no such file" because a peer removed the names
        // must become the exit that made it do so.
        let e = watch.explain(store, e);
        names.remove_all();
        e
    })
}

/// The segments of a group of `world_size` ranks.
fn shape(world_size: u32, config: &ProcessConfig) -> Shape {
    Shape {
        world_size,
        channels: config.max_channels.max(1) + 1,
        slots: config.link_slots(),
        slot_bytes: config.max_message_bytes.max(64),
        staging_bytes: config
            .one_shot_rule(world_size)
            .staging_bytes(world_size)
            .next_multiple_of(64),
        heap_bytes: config.shared_heap_bytes,
    }
}

/// Refuse, before anything is published or created, a group whose
/// segments overflow or do not fit where they live (an absurd world size
/// once left a sparse multi-petabyte file behind).
pub(super) fn check_capacity(world_size: u32, config: &ProcessConfig) -> Result<(), SetupError> {
    check_space(&shape(world_size, config))
}

/// Create, publish, map everything, and meet at the barrier.
fn form(
    store: &mut Store,
    watch: &mut Watch,
    rank: Rank,
    shape: &Shape,
    names: &Names,
) -> Result<Box<dyn Transport>, SetupError> {
    let own = names.path(rank);
    let segment = ShmTransport::create_segment(&own, shape).map_err(|source| SetupError::Shm {
        what: "create",
        path: own.display().to_string(),
        source,
    })?;
    store.set(&format!("pg/shm/{rank}"), own.to_string_lossy().as_bytes())?;
    let mut all: Vec<Option<Segment>> = (0..names.world_size).map(|_| None).collect();
    let mut pids = vec![std::process::id(); names.world_size as usize];
    for peer in (0..names.world_size).filter(|&p| p != rank) {
        watch.wait(store, &format!("pg/shm/{peer}"))?;
        // The path is ours to compute: a value from the store never names
        // a file outside the group's own.
        let path = names.path(peer);
        let (seg, pid) = Segment::open(&path, shape.segment_bytes())
            .and_then(|s| ShmTransport::validate(&s).map(|pid| (s, pid)))
            .map_err(|source| SetupError::Shm {
                what: "open",
                path: path.display().to_string(),
                source,
            })?;
        pids[peer as usize] = pid;
        all[peer as usize] = Some(seg);
    }
    watch.barrier(store, "pg/mapped")?;
    // Every rank has mapped every segment: the names are no longer needed.
    // Each rank removes them all, not just its own, so a rank killed
    // right after the barrier leaves nothing behind while any survives.
    segment.unlink();
    names.remove_all();
    all[rank as usize] = Some(segment);
    let all = all.into_iter().flatten().collect();
    Ok(Box::new(ShmTransport::new(rank, *shape, all, pids)))
}

/// The segment names of one group.
struct Names {
    token: String,
    world_size: u32,
}

impl Names {
    fn path(&self, rank: Rank) -> PathBuf {
        segment::directory().join(format!("ferrocoll-{}-{rank}", self.token))
    }

    /// Remove every rank's name (those that exist): on a failed setup.
    fn remove_all(&self) {
        for r in 0..self.world_size {
            let _ = std::fs::remove_file(self.path(r));
        }
    }
}

/// A token no other group on this host uses: the job id if any, this
/// process and the time.
fn new_token(job_id: Option<&str>) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // The settings layer keeps only letters and digits: safe in a name.
    let job = job_id.map(|j| format!("{j}.")).unwrap_or_default();
    format!("{job}{}-{nanos:x}", std::process::id())
}

fn check_space(shape: &Shape) -> Result<(), SetupError> {
    let dir = segment::directory();
    let free = segment::free_bytes(&dir).unwrap_or(u64::MAX);
    let need = shape.checked_segment_bytes().map_or(u64::MAX, |b| b as u64);
    // Only this rank's own: peers may have created theirs already.
    if need == u64::MAX || need > free {
        return Err(SetupError::ShmSpace {
            world_size: shape.world_size,
            need,
            free,
            dir: dir.display().to_string(),
        });
    }
    Ok(())
}
