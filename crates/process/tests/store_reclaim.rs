//! A store that forms many groups (a `split` per training step) does not
//! fill: each group's setup keys are removed once every member is past
//! them. Ranks are threads of this test, meeting at a store with room
//! for a few groups' keys only.

use std::time::Duration;

use ferrocoll_core::ReduceOp;
use ferrocoll_core::comm::{CommunicatorExt, Planning};
use ferrocoll_process::{ProcessCommunicator, ProcessConfig, TransportKind};
use ferrocoll_rendezvous::{Limits, Server, ServerOptions, Store};

fn many_splits(transport: TransportKind) {
    // About two groups' worth of keys: before, the fourth split or so
    // found the store full (the default caps gave ~18,700 splits).
    let limits = Limits {
        max_keys: 48,
        ..Limits::default()
    };
    let options = ServerOptions {
        secret: None,
        limits,
    };
    let server = Server::start_with("127.0.0.1:0".parse().unwrap(), options).unwrap();
    let addr = server.addr().to_string();
    let t = Duration::from_secs(20);
    let config = ProcessConfig {
        transport,
        planning: Planning {
            timeout: t,
            ..ProcessConfig::default().planning
        },
        ..ProcessConfig::default()
    };
    let splits = 60;
    let done: Vec<u32> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u32)
            .map(|r| {
                let (addr, config) = (&addr, &config);
                s.spawn(move || {
                    let store = Store::join_with(addr, 1, t, None).unwrap();
                    let mut comm = ProcessCommunicator::connect(store, r, 2, config).unwrap();
                    let mut formed = 0;
                    for step in 0..splits {
                        let mut sub = comm
                            .split(Some(step % 2), r)
                            .unwrap_or_else(|e| panic!("split {step}: {e}"))
                            .expect("a color");
                        let mut x = [1u32];
                        sub.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                        assert_eq!(x[0], 2);
                        formed += 1;
                    }
                    formed
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(done, vec![splits; 2]);
}

#[test]
fn many_splits_over_shm_do_not_fill_the_store() {
    many_splits(TransportKind::Shm);
}

#[test]
fn many_splits_over_tcp_do_not_fill_the_store() {
    many_splits(TransportKind::Tcp);
}
