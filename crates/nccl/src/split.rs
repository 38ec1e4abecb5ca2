//! `split` on NCCL: `ncclCommSplit`, non-blocking like initialisation, the
//! new communicator's rank and size read back from NCCL.

use nccl_rs_sys::{NCCL_SPLIT_NOCOLOR, library, ncclComm_t};

use crate::communicator::NcclCommunicator;
use crate::{NcclError, call, check};

/// NCCL's color for `color` (`None`: this rank takes no part).
pub(crate) fn nccl_color(color: Option<u32>) -> Result<i32, NcclError> {
    match color {
        None => Ok(NCCL_SPLIT_NOCOLOR),
        Some(c) => i32::try_from(c).map_err(|_| {
            NcclError::Invalid(format!(
                "split color {c} is past NCCL's largest ({})",
                i32::MAX
            ))
        }),
    }
}

/// NCCL's key for `key` (ranks are ordered by it, then by rank).
pub(crate) fn nccl_key(key: u32) -> Result<i32, NcclError> {
    i32::try_from(key)
        .map_err(|_| NcclError::Invalid(format!("split key {key} is past NCCL's largest")))
}

impl NcclCommunicator {
    /// Split this communicator (every rank calls it, as `ncclCommSplit`
    /// requires): ranks with the same `color` form a new one, ordered by
    /// `key` then rank; `None` takes part and gets none. The new
    /// communicator has its own stream on this rank's GPU and is
    /// independent of this one.
    pub fn split_nccl(
        &mut self,
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<NcclCommunicator>, NcclError> {
        let (color, key) = (nccl_color(color)?, nccl_key(key)?);
        self.live()?;
        let lib = library()?;
        self.context().bind_to_thread()?;
        // Everything that can fail without NCCL comes first, so a split
        // that succeeds is never left without an owner.
        let stream = self.context().new_stream()?;
        let mut cfg = crate::communicator::blank_config();
        cfg.blocking = 0;
        // Its own resources: independent of the parent, as documented.
        cfg.splitShare = 0;
        let mut new: ncclComm_t = std::ptr::null_mut();
        // SAFETY: a live communicator; valid out-pointer and config.
        let r = unsafe {
            call!(
                lib,
                ncclCommSplit(self.raw(), color, key, &mut new, &mut cfg)
            )
        };
        let split = if r == nccl_rs_sys::ncclResult_t::ncclInProgress {
            Ok(())
        } else {
            check(r).map_err(|e| self.fail(e))
        }
        // The parent settles too: the split is a collective on it, and NCCL
        // writes the new handle when it completes.
        .and_then(|()| self.settle("split"));
        if let Err(e) = split {
            abandon(new);
            return Err(e);
        }
        if new.is_null() {
            return Ok(None);
        }
        let mut child = NcclCommunicator::adopt(
            new,
            self.context().clone(),
            stream,
            self.timeout(),
            self.group_flag(),
        );
        // From here the child owns `new`: a failure aborts it (settle) and
        // its drop cleans up.
        child.settle("split (new communicator)")?;
        child.read_shape()?;
        Ok(Some(child))
    }
}

/// Abort a communicator no `NcclCommunicator` owns yet (a split that
/// failed after NCCL made it).
fn abandon(comm: ncclComm_t) {
    if comm.is_null() {
        return;
    }
    if let Ok(lib) = library()
        && let Ok(f) = lib.ncclCommAbort.as_ref()
    {
        // SAFETY: a communicator NCCL handed out and nobody else holds.
        let r = unsafe { f(comm) };
        if r != nccl_rs_sys::ncclResult_t::ncclSuccess {
            tracing::warn!("ncclCommAbort of a failed split: {r:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colors_and_keys_map_to_nccls_ints() {
        assert_eq!(nccl_color(None).unwrap(), NCCL_SPLIT_NOCOLOR);
        assert_eq!(nccl_color(Some(3)).unwrap(), 3);
        assert!(nccl_color(Some(u32::MAX)).is_err());
        assert_eq!(nccl_key(7).unwrap(), 7);
        assert!(nccl_key(1 << 31).is_err());
    }
}
