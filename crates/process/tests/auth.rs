//! A group whose job has a secret: the store and every TCP connection
//! authenticate with it (ranks are threads of this test).

use std::time::Duration;

use ferrocoll_core::ReduceOp;
use ferrocoll_core::comm::{CommunicatorExt, Planning};
use ferrocoll_process::{ProcessCommunicator, ProcessConfig, TransportKind};
use ferrocoll_rendezvous::{JobSecret, Limits, Server, ServerOptions, Store, StoreError};

#[test]
fn a_group_with_a_job_secret_forms_over_tcp_and_strangers_cannot_join_its_store() {
    let secret = JobSecret::new("job-secret-for-this-test").unwrap();
    let options = ServerOptions {
        secret: Some(secret.clone()),
        limits: Limits::default(),
    };
    let server = Server::start_with("127.0.0.1:0".parse().unwrap(), options).unwrap();
    let addr = server.addr().to_string();
    let t = Duration::from_secs(10);
    let e = Store::join_with(&addr, 1, t, None).unwrap_err();
    assert!(matches!(e, StoreError::SecretRequired { .. }), "{e}");
    let config = ProcessConfig {
        transport: TransportKind::Tcp,
        planning: Planning {
            timeout: t,
            ..ProcessConfig::default().planning
        },
        ..ProcessConfig::default()
    };
    let sums: Vec<bool> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3u32)
            .map(|r| {
                let (addr, secret, config) = (&addr, &secret, &config);
                s.spawn(move || {
                    let store = Store::join_with(addr, 1, t, Some(secret)).unwrap();
                    let mut comm = ProcessCommunicator::connect(store, r, 3, config).unwrap();
                    let mut x = vec![i64::from(r) + 1; 10_000];
                    comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                    x.iter().all(|&v| v == 6)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, vec![true; 3]);
}
