//! The bookkeeping of `split(color, key)` every backend shares: which
//! ranks end up together, and in what order.
//!
//! Every rank of the parent calls split; the colors and keys are exchanged
//! through one all-gather on the parent (a call like any other, so all
//! ranks agree on it before anything else happens). Ranks of one color form
//! a new group, ordered by key and then by parent rank, as in
//! `MPI_Comm_split` and `ncclCommSplit`; a rank with no color (`None`)
//! takes part in the exchange and gets no communicator.

use super::Communicator;
use super::error::CommError;
use crate::types::{Purpose, Rank};

/// This rank's place in the group its color forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The color shared by the group.
    pub color: u32,
    /// The members' ranks in the parent, in their new rank order.
    pub members: Vec<Rank>,
    /// This rank's rank in the new group.
    pub rank: Rank,
}

/// Exchange `(color, key)` with every rank of `comm` and return this rank's
/// membership (`None` for no color).
pub fn exchange<C: Communicator + ?Sized>(
    comm: &mut C,
    color: Option<u32>,
    key: u32,
) -> Result<Option<Membership>, CommError> {
    let n = comm.world_size() as usize;
    let mine = [color.map_or(0, |c| u64::from(c) + 1), u64::from(key)];
    let mut all = vec![0u64; 2 * n];
    super::call::exchange(comm, Purpose::Split, &mine, &mut all)?;
    let choices: Vec<(Option<u32>, u32)> = all
        .chunks_exact(2)
        .map(|c| ((c[0] != 0).then(|| (c[0] - 1) as u32), c[1] as u32))
        .collect();
    let mine = membership(&choices, comm.rank());
    if let Some(m) = &mine {
        tracing::debug!(
            rank = comm.rank(),
            color = m.color,
            new_rank = m.rank,
            members = ?m.members,
            "split"
        );
    }
    Ok(mine)
}

/// A backend's own split result as the trait returns it.
pub fn boxed<C: Communicator + Send + 'static>(
    comm: Option<C>,
) -> Option<Box<dyn Communicator + Send>> {
    comm.map(|c| Box::new(c) as Box<dyn Communicator + Send>)
}

/// `rank`'s membership given every rank's `(color, key)`.
pub fn membership(choices: &[(Option<u32>, u32)], rank: Rank) -> Option<Membership> {
    let color = choices[rank as usize].0?;
    let mut members: Vec<(u32, Rank)> = choices
        .iter()
        .enumerate()
        .filter(|(_, (c, _))| *c == Some(color))
        .map(|(r, (_, key))| (*key, r as Rank))
        .collect();
    members.sort_unstable();
    let members: Vec<Rank> = members.into_iter().map(|(_, r)| r).collect();
    let rank = members.iter().position(|&r| r == rank)? as Rank;
    Some(Membership {
        color,
        members,
        rank,
    })
}

#[cfg(test)]
mod tests {
    use super::membership;

    #[test]
    fn members_are_ordered_by_key_then_parent_rank() {
        let choices = [
            (Some(1), 5),
            (Some(0), 0),
            (Some(1), 0),
            (None, 0),
            (Some(1), 5),
        ];
        let m = membership(&choices, 4).unwrap();
        assert_eq!(m.members, vec![2, 0, 4]);
        assert_eq!(m.rank, 2);
        assert_eq!(m.color, 1);
        assert_eq!(membership(&choices, 1).unwrap().members, vec![1]);
        assert!(membership(&choices, 3).is_none());
    }
}
