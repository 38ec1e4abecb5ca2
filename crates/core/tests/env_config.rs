//! The one configuration layer: `CpuConfig::default()` honours the
//! `FERROCOLL_*` variables (it once ignored them, so the README's snippet
//! waited 60 s whatever `FERROCOLL_TIMEOUT_MS` said). Its own test binary:
//! it changes this process's environment.

use std::time::Duration;

use ferrocoll_core::Algorithm;
use ferrocoll_core::cpu::CpuConfig;

#[test]
fn default_and_from_env_apply_the_environment_and_builtin_ignores_it() {
    // SAFETY: the only test in this binary, so no other thread reads the
    // environment while it changes.
    unsafe {
        std::env::set_var("FERROCOLL_TIMEOUT_MS", "1234");
        std::env::set_var("FERROCOLL_ALGO", "ring");
    }
    let d = CpuConfig::default();
    assert_eq!(d.planning.timeout, Duration::from_millis(1234));
    assert_eq!(d.planning.algorithm, Some(Algorithm::Ring));
    assert_eq!(CpuConfig::from_env().unwrap(), d);
    assert_eq!(
        CpuConfig::builtin().planning.timeout,
        ferrocoll_core::comm::DEFAULT_TIMEOUT
    );
    // SAFETY: as above.
    unsafe { std::env::set_var("FERROCOLL_TIMEOUT_MS", "soon") };
    let e = CpuConfig::from_env().unwrap_err();
    assert!(e.to_string().contains("FERROCOLL_TIMEOUT_MS"), "{e}");
    // Default cannot fail: the bad value is logged and ignored.
    assert_eq!(
        CpuConfig::default().planning.timeout,
        ferrocoll_core::comm::DEFAULT_TIMEOUT
    );
}
