//! Finding which ranks share a host, before any transport is opened.
//!
//! Each rank publishes a host key — `FERROCOLL_HOST_ID` if set, else its
//! hostname, boot id, pid namespace and the device of its shared-memory
//! directory — and the name of a probe file it wrote there holding a
//! random nonce. Two ranks share a host only if their keys match *and*
//! each read the nonce in the other's probe: equal keys alone would let
//! two network namespaces that share the machine's `/dev/shm` pass as one
//! host when they are not (or, with a hand-set id, two machines), and a
//! probe alone would let containers with a shared tmpfs but separate pid
//! namespaces pass. Each rank removes its own probe once every peer has
//! said what it read.
//!
//! A rank names its probe in the store (`pg/host-probe/<rank>`, with the
//! nonce) *before* it writes the file, so a rank killed at any moment of
//! setup leaves no probe its peers cannot find: a setup that fails
//! removes every probe named there that still holds its nonce.

use std::path::Path;

use ferrocoll_core::Rank;
use ferrocoll_rendezvous::Store;

use super::SetupError;
use super::watch::Watch;
use crate::config::ProcessConfig;
use crate::layout::HostLayout;
use crate::transport::shm::segment;

/// What a rank publishes about its host.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Card {
    key: String,
    name: String,
    probe: String,
    nonce: String,
}

impl Card {
    fn encode(&self) -> String {
        format!(
            "{}\n{}\n{}\n{}",
            self.key, self.name, self.probe, self.nonce
        )
    }

    fn decode(bytes: &[u8]) -> Option<Card> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.split('\n');
        let card = Card {
            key: lines.next()?.to_owned(),
            name: lines.next()?.to_owned(),
            probe: lines.next()?.to_owned(),
            nonce: lines.next()?.to_owned(),
        };
        lines.next().is_none().then_some(card)
    }
}

/// This rank's layout of the group.
pub(super) fn discover(
    store: &mut Store,
    watch: &mut Watch,
    rank: Rank,
    world_size: u32,
    config: &ProcessConfig,
) -> Result<HostLayout, SetupError> {
    let (key, name) = host_key(config.host_id.as_deref());
    let nonce = ferrocoll_rendezvous::random_hex::<16>();
    let probe = format!(
        "ferrocoll-{}probe-{}",
        config
            .job_id
            .as_deref()
            .map(|j| format!("{j}."))
            .unwrap_or_default(),
        ferrocoll_rendezvous::random_hex::<16>()
    );
    let probe_path = segment::directory().join(&probe);
    let mut mine = Card {
        key,
        name,
        probe,
        nonce,
    };
    // Named before written: whoever outlives this rank can remove it.
    store.set(&format!("pg/host-probe/{rank}"), mine.encode().as_bytes())?;
    // No probe (a read-only or missing tmpfs): this rank shares a host
    // with nobody, which TCP still serves.
    let wrote = write_probe(&probe_path, &mine.nonce);
    if !wrote {
        mine.probe = String::new();
    }
    let layout = exchange(store, watch, rank, world_size, &mine);
    if wrote {
        let _ = std::fs::remove_file(&probe_path);
    }
    layout
}

/// After a failed setup, remove the probe of every rank that named one
/// (a rank killed before it removed its own leaves it otherwise), each
/// only if it still holds the nonce named with it.
pub(super) fn remove_named_probes(store: &mut Store, world_size: u32) {
    for peer in 0..world_size {
        if let Ok(Some(bytes)) = store.get(&format!("pg/host-probe/{peer}"))
            && let Some(card) = Card::decode(&bytes)
            && reads_probe(&card)
        {
            let _ = std::fs::remove_file(segment::directory().join(&card.probe));
        }
    }
}

/// Publish this rank's card, read every peer's, say which peers' probes
/// this rank could read, and build the layout from everyone's answers.
fn exchange(
    store: &mut Store,
    watch: &mut Watch,
    rank: Rank,
    world_size: u32,
    mine: &Card,
) -> Result<HostLayout, SetupError> {
    store.set(&format!("pg/host/{rank}"), mine.encode().as_bytes())?;
    let mut cards = Vec::with_capacity(world_size as usize);
    for peer in 0..world_size {
        let bytes = watch.wait(store, &format!("pg/host/{peer}"))?;
        cards.push(Card::decode(&bytes).ok_or(SetupError::HostCard { rank: peer })?);
    }
    let seen: String = cards
        .iter()
        .enumerate()
        .map(|(peer, card)| {
            let ok = peer as Rank == rank || (card.key == mine.key && reads_probe(card));
            if ok { '1' } else { '0' }
        })
        .collect();
    store.set(&format!("pg/host-seen/{rank}"), seen.as_bytes())?;
    let mut seen_by = Vec::with_capacity(world_size as usize);
    for peer in 0..world_size {
        let row = watch.wait(store, &format!("pg/host-seen/{peer}"))?;
        seen_by.push(row);
    }
    let same = |a: usize, b: usize| {
        cards[a].key == cards[b].key
            && seen_by[a].get(b) == Some(&b'1')
            && seen_by[b].get(a) == Some(&b'1')
    };
    Ok(group(world_size as usize, same, |r| cards[r].name.clone()))
}

/// Hosts in order of their lowest rank: a rank joins the first host whose
/// first rank it shares a host with (the same answer on every rank, from
/// the same cards).
fn group(
    n: usize,
    same: impl Fn(usize, usize) -> bool,
    name: impl Fn(usize) -> String,
) -> HostLayout {
    let mut leaders: Vec<usize> = Vec::new();
    let mut host_of = Vec::with_capacity(n);
    for r in 0..n {
        match leaders.iter().position(|&l| same(l, r)) {
            Some(h) => host_of.push(h as u32),
            None => {
                host_of.push(leaders.len() as u32);
                leaders.push(r);
            }
        }
    }
    let names = leaders.iter().map(|&l| name(l)).collect();
    HostLayout::new(host_of, names).unwrap_or_else(|| HostLayout::single(n as u32, name(0)))
}

/// Whether this rank can read the nonce a peer wrote in its probe; the
/// name must be one of ours (never a path from the store).
fn reads_probe(card: &Card) -> bool {
    let ok_name = card.probe.starts_with("ferrocoll-")
        && card.probe.len() < 128
        && card
            .probe
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !card.probe.contains("..");
    ok_name
        && std::fs::read(segment::directory().join(&card.probe))
            .is_ok_and(|read| read == card.nonce.as_bytes())
}

fn write_probe(path: &Path, nonce: &str) -> bool {
    use std::io::Write;
    let file = {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        o.open(path)
    };
    match file.and_then(|mut f| f.write_all(nonce.as_bytes())) {
        Ok(()) => true,
        Err(_) => {
            let _ = std::fs::remove_file(path);
            false
        }
    }
}

/// This process's host key and a name for messages.
fn host_key(host_id: Option<&str>) -> (String, String) {
    if let Some(id) = host_id {
        return (format!("id={id}"), id.to_owned());
    }
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let hostname = ferrocoll_core::host::name();
    let boot = read("/proc/sys/kernel/random/boot_id");
    let pid_ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let shm = shm_device(&segment::directory());
    (
        format!("host={hostname} boot={boot} {pid_ns} shm={shm}"),
        hostname,
    )
}

#[cfg(unix)]
fn shm_device(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).map_or(0, |m| m.dev())
}

#[cfg(not(unix))]
fn shm_device(_dir: &Path) -> u64 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_round_trip_and_extra_lines_are_refused() {
        let c = Card {
            key: "k".into(),
            name: "n".into(),
            probe: "ferrocoll-probe-ab".into(),
            nonce: "00".into(),
        };
        assert_eq!(Card::decode(c.encode().as_bytes()), Some(c.clone()));
        assert_eq!(Card::decode(format!("{}\nx", c.encode()).as_bytes()), None);
        assert_eq!(Card::decode(b"k\nn"), None);
    }

    #[test]
    fn a_probe_name_from_the_store_never_leaves_the_shm_directory() {
        for probe in [
            "../../etc/passwd",
            "ferrocoll-../x",
            "ferrocoll-a/b",
            "other",
        ] {
            let card = Card {
                key: String::new(),
                name: String::new(),
                probe: probe.into(),
                nonce: String::new(),
            };
            assert!(!reads_probe(&card), "{probe}");
        }
    }

    #[test]
    fn grouping_is_by_first_rank_and_needs_both_directions() {
        // Ranks 0, 2 on one host; 1, 3 on another; 4 shares a key with 0
        // but only one direction of the probe: a host of its own.
        let hosts = [0, 1, 0, 1, 0];
        let one_way = |a: usize, b: usize| !(a == 4 && b == 0);
        let same = |a: usize, b: usize| hosts[a] == hosts[b] && one_way(a, b) && one_way(b, a);
        let l = group(5, same, |r| format!("h{}", hosts[r]));
        assert_eq!(
            (0..5).map(|r| l.host(r)).collect::<Vec<_>>(),
            [0, 1, 0, 1, 2]
        );
        assert_eq!(l.host_name(2), "h0");
    }

    #[test]
    fn the_host_key_is_the_id_when_one_is_given() {
        assert_eq!(host_key(Some("node7")).0, "id=node7");
        let (key, name) = host_key(None);
        assert!(key.starts_with("host="), "{key}");
        assert!(!name.is_empty());
    }
}
