//! `FERROCOLL_LOG` in a library user's program: one call to
//! `ferrocoll::log::init()` shows the chosen algorithm and why (before, a
//! program of one's own printed nothing whatever the variable said).

use std::process::Command;

use ferrocoll::ReduceOp;
use ferrocoll::comm::CommunicatorExt;
use ferrocoll::cpu::{self, CpuConfig};

/// Run as a child: a user's `main` with logging turned on.
#[test]
#[ignore = "the child half of `debug_logging_names_each_calls_algorithm`, which runs this binary again with `child_program --exact --ignored` and FERROCOLL_LOG set; alone it does nothing"]
fn child_program() {
    if std::env::var_os("FERROCOLL_LOG_CHILD").is_none() {
        return;
    }
    assert!(
        ferrocoll::log::init(),
        "the first init installs a subscriber"
    );
    assert!(!ferrocoll::log::init(), "a second init changes nothing");
    let results = cpu::run(2, &CpuConfig::builtin(), |comm| {
        // 4 KiB takes the one-shot protocol, 1 MiB a schedule.
        let mut small = vec![1.0f32; 1 << 10];
        comm.all_reduce_in_place(&mut small, ReduceOp::Sum)?;
        let mut large = vec![1.0f32; 1 << 18];
        comm.all_reduce_in_place(&mut large, ReduceOp::Sum)
    });
    assert!(results.iter().all(Result::is_ok));
}

#[test]
fn debug_logging_names_each_calls_algorithm() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["child_program", "--exact", "--ignored", "--nocapture"])
        .env("FERROCOLL_LOG_CHILD", "1")
        .env("FERROCOLL_LOG", "debug")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("algorithm=") && err.contains("all-reduce"),
        "{err}"
    );
    assert!(err.contains("protocol=one-shot"), "{err}");
    assert!(
        !err.contains('\x1b'),
        "no terminal colours in a pipe: {err}"
    );
}
