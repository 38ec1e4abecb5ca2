//! Whether every block of every rank on a GPU can be resident at once.
//!
//! The interpreter's blocks spin on flags other blocks raise: a block
//! that waits for the SM a spinning block holds never runs, and the call
//! times out. Ranks sharing a GPU (threads of one process in one context)
//! therefore need all their channels resident together; a group that
//! cannot have that is refused when it is opened, not when it hangs.
//!
//! The capacity counts the interpreter alone: the launch bounds promise
//! one block of 512 threads per SM, so other work on the GPU (another
//! process, the caller's kernels on other streams, NCCL) can delay a
//! rank's blocks but not starve them for good once that work ends. Work
//! that itself spins forever on the GPU (another persistent kernel) is
//! outside what this check can see; the calls' timeout then names the
//! rank that did not arrive.

use crate::error::CudaError;

/// Check that `blocks` (the group's channels on this device, summed over
/// its ranks) fit the `capacity` of resident blocks (blocks per SM × SMs).
pub fn check(device: usize, blocks: u64, capacity: u64) -> Result<(), CudaError> {
    if blocks <= capacity {
        return Ok(());
    }
    Err(CudaError::NotResident {
        device,
        blocks,
        capacity,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_whose_blocks_cannot_all_be_resident_are_refused() {
        // A capacity of 264 resident blocks: eight ranks of 32 channels
        // fit, one block more does not.
        assert!(check(0, 8 * 32, 264).is_ok());
        assert!(check(0, 264, 264).is_ok());
        let e = check(3, 265, 264).unwrap_err();
        assert_eq!(
            e,
            CudaError::NotResident {
                device: 3,
                blocks: 265,
                capacity: 264
            }
        );
        assert!(e.to_string().contains("265"), "{e}");
        // A kernel that cannot run at all (no block fits an SM).
        assert!(check(0, 1, 0).is_err());
    }
}
