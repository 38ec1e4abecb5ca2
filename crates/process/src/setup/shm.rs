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
//!
//! Each name ends in 128 random bits of its own rank's, published through
//! the (authenticated) store before the file is made: another local user
//! who sees rank 0's segment cannot predict the others' names and take
//! them first, which once denied any shared-memory job. A name that
//! exists anyway is reported with its owner, not as a full tmpfs.

use std::path::PathBuf;

use ferrocoll_core::Rank;
use ferrocoll_rendezvous::Store;

use super::SetupError;
use super::watch::Watch;
use crate::config::ProcessConfig;
use crate::transport::shm::segment::{self, Segment};
use crate::transport::shm::{Shape, ShmTransport};

/// Open the shared-memory transport of `rank` to `members` (the group's
/// ranks on this host, in order, `rank` among them; every rank of the
/// group when it is on one host). Failures name group ranks.
pub(super) fn open(
    store: &mut Store,
    watch: &mut Watch,
    rank: Rank,
    members: &[Rank],
    world_size: u32,
    config: &ProcessConfig,
) -> Result<ShmTransport, SetupError> {
    let shape = shape(members.len() as u32, world_size, config);
    // One token per host: its first rank makes it.
    let token_key = format!("pg/token/{}", members[0]);
    if rank == members[0] {
        store.set(&token_key, new_token(config.job_id.as_deref()).as_bytes())?;
    }
    let token = String::from_utf8_lossy(&watch.wait(store, &token_key)?).into_owned();
    let mut names = Names {
        token,
        members: members.to_vec(),
        suffixes: vec![None; members.len()],
    };
    form(store, watch, rank, &shape, &mut names).map_err(|e| {
        // Explain first: "no such file" because a peer removed the names
        // must become the exit that made it do so.
        let e = watch.explain(store, e);
        names.learn_published(store);
        names.remove_all();
        e
    })
}

/// The segments of `local` ranks linked by shared memory in a group of
/// `world_size` (whose one-shot calls stage every rank's input).
fn shape(local: u32, world_size: u32, config: &ProcessConfig) -> Shape {
    Shape {
        world_size: local,
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
pub(super) fn check_capacity(
    local: u32,
    world_size: u32,
    config: &ProcessConfig,
) -> Result<(), SetupError> {
    check_space(&shape(local, world_size, config))
}

/// Create, publish, map everything, and meet at the barrier.
fn form(
    store: &mut Store,
    watch: &mut Watch,
    rank: Rank,
    shape: &Shape,
    names: &mut Names,
) -> Result<ShmTransport, SetupError> {
    let me = names
        .index(rank)
        .expect("a rank is among its host's members");
    let suffix = ferrocoll_rendezvous::random_hex::<16>();
    // Published before the file exists, so a failed setup can remove it.
    store.set(&name_key(rank), suffix.as_bytes())?;
    let own = names.named(rank, &suffix);
    names.suffixes[me] = Some(suffix);
    let segment = ShmTransport::create_segment(&own, shape).map_err(|source| SetupError::Shm {
        what: "create",
        path: own.display().to_string(),
        source: explain_existing(&own, source),
    })?;
    store.set(&format!("pg/shm/{rank}"), b"ready")?;
    let local = names.members.len();
    let mut all: Vec<Option<Segment>> = (0..local).map(|_| None).collect();
    let mut pids = vec![std::process::id(); local];
    for (at, peer) in names.members.clone().into_iter().enumerate() {
        if peer == rank {
            continue;
        }
        watch.wait(store, &format!("pg/shm/{peer}"))?;
        names.learn(at, &watch.wait(store, &name_key(peer))?);
        // The path is ours to compute: a value from the store never names
        // a file outside the group's own.
        let Some(path) = names.path(at) else {
            return Err(SetupError::Shm {
                what: "name",
                path: format!("rank {peer}'s segment"),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the store holds no well-formed name for it",
                ),
            });
        };
        let (seg, pid) = Segment::open(&path, shape.segment_bytes())
            .and_then(|s| ShmTransport::validate(&s).map(|pid| (s, pid)))
            .map_err(|source| SetupError::Shm {
                what: "open",
                path: path.display().to_string(),
                source,
            })?;
        pids[at] = pid;
        all[at] = Some(seg);
    }
    // Every rank of the group meets here, whatever its host.
    watch.barrier(store, "pg/mapped")?;
    // Every rank has mapped every segment: the names are no longer needed.
    // Each rank removes them all, not just its own, so a rank killed
    // right after the barrier leaves nothing behind while any survives.
    segment.unlink();
    names.remove_all();
    all[me] = Some(segment);
    let all = all.into_iter().flatten().collect();
    Ok(ShmTransport::new(me as Rank, *shape, all, pids).named(rank))
}

/// The segment names of the ranks of one host: the token of the host's
/// group, its members (group ranks) and each one's random suffix, as far
/// as known, by position among the members.
struct Names {
    token: String,
    members: Vec<Rank>,
    suffixes: Vec<Option<String>>,
}

/// The store key of rank `rank`'s segment suffix.
fn name_key(rank: Rank) -> String {
    format!("pg/shm-name/{rank}")
}

impl Names {
    fn index(&self, rank: Rank) -> Option<usize> {
        self.members.iter().position(|&m| m == rank)
    }

    fn path(&self, at: usize) -> Option<PathBuf> {
        let suffix = self.suffixes.get(at)?.as_ref()?;
        Some(self.named(self.members[at], suffix))
    }

    fn named(&self, rank: Rank, suffix: &str) -> PathBuf {
        segment::directory().join(format!("ferrocoll-{}-{rank}-{suffix}", self.token))
    }

    /// Take member `at`'s suffix from the store, if it is 32 hex digits
    /// (a value from the store must never widen a name into a path).
    fn learn(&mut self, at: usize, value: &[u8]) {
        let ok = value.len() == 32 && value.iter().all(u8::is_ascii_hexdigit);
        if ok && let Some(slot) = self.suffixes.get_mut(at) {
            *slot = Some(String::from_utf8_lossy(value).into_owned());
        }
    }

    /// Every suffix the store already holds (best effort: on a failed
    /// setup, the store may be gone too).
    fn learn_published(&mut self, store: &mut Store) {
        for at in 0..self.members.len() {
            if self.suffixes[at].is_none()
                && let Ok(Some(value)) = store.get(&name_key(self.members[at]))
            {
                self.learn(at, &value);
            }
        }
    }

    /// Remove every member's name (those that are known and exist): on a
    /// failed setup.
    fn remove_all(&self) {
        for at in 0..self.members.len() {
            if let Some(path) = self.path(at) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// A name that exists already is not a full tmpfs: say whose it is.
fn explain_existing(path: &std::path::Path, err: std::io::Error) -> std::io::Error {
    use std::os::unix::fs::MetadataExt;
    if err.kind() != std::io::ErrorKind::AlreadyExists {
        return err;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let owner = std::fs::symlink_metadata(path).map(|m| m.uid());
    let whose = match owner {
        Ok(uid) if uid == me => "this user's own: a process of it took the name".to_owned(),
        Ok(uid) => format!("owned by uid {uid}, not this user (uid {me}): someone else took it"),
        Err(_) => "gone again".to_owned(),
    };
    std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("the name exists already ({whose}); nothing was written into it"),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_that_exists_already_is_reported_with_its_owner_not_as_space() {
        let path = std::env::temp_dir().join(format!("ferrocoll-exists-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let err = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap_err();
        let said = explain_existing(&path, err).to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(said.contains("exists already"), "{said}");
        assert!(said.contains("this user's own"), "{said}");
    }

    #[test]
    fn only_well_formed_suffixes_from_the_store_become_names() {
        let mut names = Names {
            token: "t".into(),
            members: vec![2, 5, 6],
            suffixes: vec![None; 3],
        };
        names.learn(0, b"../../etc/passwd");
        names.learn(1, &[b'a'; 32]);
        names.learn(7, &[b'a'; 32]);
        assert!(names.path(0).is_none());
        // Named by group rank, found by position among the host's ranks.
        assert!(
            names
                .path(1)
                .unwrap()
                .ends_with(format!("ferrocoll-t-5-{}", "a".repeat(32)))
        );
    }
}
