//! Whether every block of every rank on a GPU can be resident at once.
//!
//! The interpreter's blocks spin on flags other blocks raise: a block
//! that waits for the SM a spinning block holds never runs, and the call
//! times out. Ranks sharing a GPU (threads of one process in one context)
//! therefore need all their channels resident together; a group that
//! cannot have that is refused when it is opened, not when it hangs.

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
        // H200: 132 SMs; 2 interpreter blocks per SM.
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
