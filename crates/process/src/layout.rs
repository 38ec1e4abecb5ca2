//! Which ranks of a group share a host: the group's layout, found at
//! setup (see `setup::hosts`) and the same on every rank.
//!
//! Hosts are numbered in the order of their lowest rank, and a host's
//! ranks in rank order: rank 0 is always host 0's local rank 0.

use ferrocoll_core::Rank;

/// The hosts of a group and the ranks on each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLayout {
    /// The host index of every rank.
    host_of: Vec<u32>,
    /// Each host's name (its hostname, or its `FERROCOLL_HOST_ID`), for
    /// messages.
    names: Vec<String>,
}

impl HostLayout {
    /// A layout from each rank's host index and each host's name; `None`
    /// unless hosts are numbered by their lowest rank and every host has
    /// a rank and a name.
    pub fn new(host_of: Vec<u32>, names: Vec<String>) -> Option<HostLayout> {
        let mut next = 0u32;
        for &h in &host_of {
            if h == next {
                next += 1;
            } else if h > next {
                return None;
            }
        }
        (next as usize == names.len()).then_some(HostLayout { host_of, names })
    }

    /// Every rank on one host.
    pub fn single(world_size: u32, name: String) -> HostLayout {
        HostLayout {
            host_of: vec![0; world_size as usize],
            names: vec![name],
        }
    }

    /// How many hosts the group spans.
    pub fn hosts(&self) -> u32 {
        self.names.len() as u32
    }

    /// The host of every rank, in rank order.
    pub fn host_of(&self) -> &[u32] {
        &self.host_of
    }

    /// The host `rank` is on.
    pub fn host(&self, rank: Rank) -> u32 {
        self.host_of[rank as usize]
    }

    /// A host's name.
    pub fn host_name(&self, host: u32) -> &str {
        &self.names[host as usize]
    }

    /// The ranks on `host`, in rank order.
    pub fn ranks_on(&self, host: u32) -> Vec<Rank> {
        (0..self.host_of.len() as Rank)
            .filter(|&r| self.host_of[r as usize] == host)
            .collect()
    }

    /// `rank`'s position among the ranks of its host (torchrun's
    /// `LOCAL_RANK`).
    pub fn local_rank(&self, rank: Rank) -> u32 {
        let host = self.host(rank);
        self.host_of[..rank as usize]
            .iter()
            .filter(|&&h| h == host)
            .count() as u32
    }

    /// How many ranks share `rank`'s host (`LOCAL_WORLD_SIZE`).
    pub fn local_size(&self, rank: Rank) -> u32 {
        let host = self.host(rank);
        self.host_of.iter().filter(|&&h| h == host).count() as u32
    }

    /// Whether two ranks share a host.
    pub fn same_host(&self, a: Rank, b: Rank) -> bool {
        self.host(a) == self.host(b)
    }

    /// "host h1 (ranks 2–3)", for messages.
    pub fn describe_host(&self, host: u32) -> String {
        let ranks = self.ranks_on(host);
        let span = match (ranks.first(), ranks.last()) {
            (Some(a), Some(b)) if a == b => format!("rank {a}"),
            (Some(a), Some(b)) if (b - a) as usize + 1 == ranks.len() => {
                format!("ranks {a}–{b}")
            }
            _ => format!(
                "ranks {}",
                ranks
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        };
        format!("host {} `{}` ({span})", host, self.host_name(host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_ranks_and_sizes_follow_rank_order_within_each_host() {
        let l = HostLayout::new(vec![0, 0, 1, 0, 1], vec!["a".into(), "b".into()]).unwrap();
        assert_eq!(l.hosts(), 2);
        assert_eq!(
            (0..5).map(|r| l.local_rank(r)).collect::<Vec<_>>(),
            [0, 1, 0, 2, 1]
        );
        assert_eq!(
            (0..5).map(|r| l.local_size(r)).collect::<Vec<_>>(),
            [3, 3, 2, 3, 2]
        );
        assert_eq!(l.ranks_on(1), [2, 4]);
        assert_eq!(l.describe_host(1), "host 1 `b` (ranks 2,4)");
        assert_eq!(l.describe_host(0), "host 0 `a` (ranks 0,1,3)");
        let c = HostLayout::new(vec![0, 0, 1, 1], vec!["x".into(), "y".into()]).unwrap();
        assert_eq!(c.describe_host(1), "host 1 `y` (ranks 2–3)");
    }

    #[test]
    fn hosts_not_numbered_by_their_first_rank_are_refused() {
        assert!(HostLayout::new(vec![1, 0], vec!["a".into(), "b".into()]).is_none());
        assert!(HostLayout::new(vec![0, 2], vec!["a".into(), "b".into(), "c".into()]).is_none());
        assert!(HostLayout::new(vec![0, 0], vec!["a".into(), "b".into()]).is_none());
        assert!(HostLayout::new(vec![], vec![]).is_some());
    }
}
