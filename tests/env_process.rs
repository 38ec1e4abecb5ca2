//! `process_communicator_from_env` honours `FERROCOLL_TIMEOUT_MS` even
//! when the caller passes a config with the built-in timeout: it
//! once ignored the variable, so the README's snippet waited a minute for
//! a rank that never came whatever the variable said. Its own test
//! binary: it changes this process's environment.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use ferrocoll::process::ProcessConfig;

#[test]
fn the_timeout_variable_bounds_a_group_whose_peer_never_comes() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // SAFETY: the only test in this binary, so no other thread reads the
    // environment while it changes.
    unsafe {
        std::env::set_var("RANK", "0");
        std::env::set_var("WORLD_SIZE", "2");
        std::env::set_var("MASTER_ADDR", "127.0.0.1");
        std::env::set_var("MASTER_PORT", port.to_string());
        std::env::set_var("FERROCOLL_TIMEOUT_MS", "300");
    }
    assert_eq!(
        ProcessConfig::default().planning.timeout,
        Duration::from_millis(300)
    );
    let started = Instant::now();
    let err = ferrocoll::env::process_communicator_from_env(&ProcessConfig::builtin())
        .expect_err("rank 1 never starts");
    // Far below the built-in 10 minutes: the variable, not the config, set it.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}: {err}",
        started.elapsed()
    );
    assert!(err.to_string().contains("300ms"), "{err}");
}
