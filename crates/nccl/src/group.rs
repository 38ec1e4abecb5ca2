//! One NCCL communicator's ranks as threads of this process (the bench
//! and the conformance kit on one machine's GPUs): a failing rank tells
//! the others through a shared flag, so none waits out its timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use crate::NcclError;
use crate::communicator::{NcclCommunicator, NcclConfig, unique_id};

/// Run `f` on `devices.len()` ranks of a new NCCL communicator in this
/// process, one thread per rank (rank `r` on `devices[r]`).
pub fn run<R, F>(
    devices: &[usize],
    config: &NcclConfig,
    f: F,
) -> Result<Vec<Result<R, CommError>>, NcclError>
where
    R: Send,
    F: Fn(&mut NcclCommunicator) -> Result<R, CommError> + Sync,
{
    let configs = shared_gpu_configs(devices, config)?;
    let id = unique_id()?;
    let n = devices.len() as u32;
    let failed = Arc::new(AtomicBool::new(false));
    let f = &f;
    Ok(std::thread::scope(|scope| {
        let handles: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, &device)| {
                let failed = failed.clone();
                let config = &configs[rank];
                scope.spawn(move || {
                    let mut comm = NcclCommunicator::init_in(
                        &id,
                        rank as Rank,
                        n,
                        device,
                        config,
                        failed.clone(),
                    )
                    .map_err(|e| {
                        failed.store(true, Ordering::Release);
                        CommError::from(e)
                    })?;
                    let out = f(&mut comm);
                    if out.is_err() {
                        failed.store(true, Ordering::Release);
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(CommError::backend(
                        "nccl",
                        NcclError::Invalid("a rank thread panicked".into()),
                    ))
                })
            })
            .collect()
    }))
}

/// The NCCL release that first runs several ranks on one GPU (with
/// `NCCL_MULTI_RANK_GPU_ENABLE=1`); older ones refuse or hang.
pub const MULTI_RANK_GPU_VERSION: (u32, u32, u32) = (2, 30, 0);

/// Each rank's settings. Ranks sharing a GPU need an NCCL that supports
/// it (a typed error otherwise, before any rank starts), and their blocks
/// must all fit on it at once: unless set, each takes at most the GPU's
/// SMs over its ranks.
fn shared_gpu_configs(
    devices: &[usize],
    config: &NcclConfig,
) -> Result<Vec<NcclConfig>, NcclError> {
    let on = |d: usize| devices.iter().filter(|&&x| x == d).count() as u32;
    // Without a driver every rank fails to start, with the reason.
    if devices.iter().all(|&d| on(d) == 1) || !ferrocoll_device::driver_present() {
        return Ok(vec![config.clone(); devices.len()]);
    }
    let have = crate::version()?;
    check_shared_gpu_version(have)?;
    devices
        .iter()
        .map(|&d| {
            let sms = cudarc::driver::CudaContext::new(d)
                .and_then(|c| {
                    c.attribute(
                        cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                    )
                })
                .map_err(NcclError::from)?;
            let share = (sms.max(1) as u32 / on(d)).max(1);
            Ok(NcclConfig {
                max_ctas: Some(config.max_ctas.map_or(share, |m| m.min(share))),
                min_ctas: config.min_ctas.map(|m| m.min(share)),
                ..config.clone()
            })
        })
        .collect()
}

/// `Err` for an NCCL too old to run several ranks on one GPU.
fn check_shared_gpu_version(have: (u32, u32, u32)) -> Result<(), NcclError> {
    if have >= MULTI_RANK_GPU_VERSION {
        return Ok(());
    }
    let (a, b, c) = MULTI_RANK_GPU_VERSION;
    Err(NcclError::Invalid(format!(
        "NCCL {}.{}.{} runs one rank per GPU; several ranks on one GPU need NCCL {a}.{b}.{c} or newer (with NCCL_MULTI_RANK_GPU_ENABLE=1)",
        have.0, have.1, have.2
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_ranks_on_one_gpu_need_a_recent_nccl() {
        assert!(check_shared_gpu_version((2, 30, 0)).is_ok());
        assert!(check_shared_gpu_version((3, 0, 1)).is_ok());
        let e = check_shared_gpu_version((2, 27, 7))
            .unwrap_err()
            .to_string();
        assert!(e.contains("2.27.7") && e.contains("2.30.0"), "{e}");
        // One rank per GPU asks nothing of the version.
        let c = NcclConfig::default();
        assert_eq!(
            shared_gpu_configs(&[0, 1, 2], &c).unwrap(),
            vec![c.clone(); 3]
        );
    }
}
