//! NCCL without a GPU: loading, version, error strings, unique ids, and a
//! typed error (not a panic or a hang) from communicator creation. CI
//! installs the `nvidia-nccl-cu13` wheel and sets `FERROCOLL_REQUIRE_NCCL=1`
//! so these must load it; elsewhere a missing NCCL is checked to be the
//! typed "not found" error.

use std::time::{Duration, Instant};

use ferrocoll_nccl::{NcclCommunicator, NcclConfig, NcclError, RESULT_CODES, UniqueId};

fn required() -> bool {
    std::env::var("FERROCOLL_REQUIRE_NCCL").is_ok_and(|v| v == "1")
}

/// `true` when NCCL loaded; without it, checks the typed error.
fn loaded() -> bool {
    match nccl_rs_sys::library() {
        Ok(_) => true,
        Err(e) => {
            assert!(!required(), "FERROCOLL_REQUIRE_NCCL=1 but {e}");
            assert!(e.to_string().starts_with("NCCL not found"), "{e}");
            assert!(matches!(
                ferrocoll_nccl::version(),
                Err(NcclError::NotFound(_))
            ));
            assert!(matches!(
                ferrocoll_nccl::unique_id(),
                Err(NcclError::NotFound(_))
            ));
            println!("SKIPPED: {e}");
            false
        }
    }
}

#[test]
fn the_version_is_read_and_matches_the_bindings_major() {
    if !loaded() {
        return;
    }
    let (major, minor, _patch) = ferrocoll_nccl::version().unwrap();
    assert_eq!(major, 2);
    assert!(minor >= 18, "NCCL 2.{minor} is older than we support");
    assert!(nccl_rs_sys::GENERATED_FROM.starts_with("2."));
}

#[test]
fn every_result_code_has_a_description() {
    if !loaded() {
        return;
    }
    for code in RESULT_CODES {
        let s = ferrocoll_nccl::error_string(code).unwrap();
        assert!(!s.is_empty(), "{code:?}");
    }
}

#[test]
fn unique_ids_round_trip_through_bytes() {
    if !loaded() {
        return;
    }
    let id = ferrocoll_nccl::unique_id().unwrap();
    let bytes = id.to_bytes();
    assert_eq!(bytes.len(), 128);
    assert_eq!(UniqueId::from_bytes(&bytes).unwrap().to_bytes(), bytes);
    assert!(UniqueId::from_bytes(&bytes[..5]).is_err());
}

#[test]
fn creating_a_communicator_without_a_gpu_is_a_typed_error() {
    if !loaded() {
        return;
    }
    // SAFETY: only tries to open libcuda.
    if unsafe { cudarc_present() } {
        println!("SKIPPED: this machine has CUDA; the GPU checks cover it");
        return;
    }
    let id = ferrocoll_nccl::unique_id().unwrap();
    let started = Instant::now();
    let config = NcclConfig {
        timeout: Duration::from_secs(10),
        ..NcclConfig::default()
    };
    let err = NcclCommunicator::init(&id, 0, 1, 0, &config)
        .err()
        .expect("no GPU here");
    assert!(started.elapsed() < Duration::from_secs(15));
    let text = err.to_string();
    assert!(
        matches!(err, NcclError::Cuda(_) | NcclError::Nccl { .. }),
        "{text}"
    );
    let results = ferrocoll_nccl::run(&[0, 0], &config, |_| Ok(()));
    match results {
        Err(e) => panic!("unique id worked above: {e}"),
        Ok(rs) => assert!(rs.iter().all(Result::is_err)),
    }
}

/// Whether libcuda can be opened.
unsafe fn cudarc_present() -> bool {
    // SAFETY: forwarded.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

#[test]
fn nccl_comm_init_rank_itself_fails_cleanly_without_a_gpu() {
    if !loaded() {
        return;
    }
    // SAFETY: only tries to open libcuda.
    if unsafe { cudarc_present() } {
        println!("SKIPPED: this machine has CUDA");
        return;
    }
    let lib = nccl_rs_sys::library().unwrap();
    let id = ferrocoll_nccl::unique_id().unwrap();
    let raw = nccl_rs_sys::ncclUniqueId {
        internal: std::array::from_fn(|i| id.to_bytes()[i] as std::ffi::c_char),
    };
    let mut comm: nccl_rs_sys::ncclComm_t = std::ptr::null_mut();
    let f = lib.ncclCommInitRank.as_ref().unwrap();
    // SAFETY: valid out-pointer and a unique id by value, as nccl.h says;
    // without a GPU NCCL must return an error code.
    let r = unsafe { f(&mut comm, 1, raw, 0) };
    assert_ne!(r, nccl_rs_sys::ncclResult_t::ncclSuccess);
    let text = ferrocoll_nccl::error_string(r).unwrap();
    println!("ncclCommInitRank without a GPU: {r:?}: {text}");
}
