//! The one call path: a backend chosen at run time behind `dyn
//! Communicator`, type-erased calls checked once for every backend (typed
//! errors that leave the group usable), and a call that has no plan.

use ferrocoll_core::comm::{
    Call, CommError, Communicator, CommunicatorExt, HostSlice, Planning, send_recv_by_pairs,
};
use ferrocoll_core::cpu::{self, CpuConfig};
use ferrocoll_core::plan::PlanError;
use ferrocoll_core::{Algorithm, Collective, DataType, ReduceOp};

/// Everything a training loop does, through a trait object.
fn train_step(comm: &mut dyn Communicator) -> Result<f32, CommError> {
    let mut grad = vec![comm.rank() as f32 + 1.0; 1001];
    comm.all_reduce_in_place(&mut grad, ReduceOp::Avg)?;
    let mut gathered = vec![0.0f32; 3 * 2];
    comm.all_gather(&[comm.rank() as f32; 2], &mut gathered)?;
    comm.barrier()?;
    Ok(grad[1000] + gathered[5])
}

#[test]
fn a_backend_chosen_at_run_time_runs_every_call() {
    let results = cpu::run(3, &CpuConfig::default(), |comm| {
        let mut boxed: Box<dyn Communicator + '_> = Box::new(comm);
        let a = train_step(boxed.as_mut())?;
        // `Box<dyn Communicator>` is a communicator too.
        let mut x = [1u32; 4];
        boxed.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        Ok((a, x[0]))
    });
    for r in results {
        // mean of 1, 2, 3 is 2; the last gathered element is rank 2's.
        assert_eq!(r.unwrap(), (4.0, 3));
    }
}

#[test]
fn type_erased_calls_are_checked_once_for_every_backend() {
    let results = cpu::run(2, &CpuConfig::default(), |comm| {
        // Input f32, output i32: refused before anything moves.
        let input = [1.0f32; 4];
        let mut output = [0i32; 4];
        let call = Call::collective(
            Collective::AllReduce,
            ReduceOp::Sum,
            Some(HostSlice::from(&input[..])),
            (&mut output[..]).into(),
        );
        let e = comm.execute(call).unwrap_err();
        assert!(
            matches!(
                e,
                CommError::DtypeMismatch {
                    input: DataType::F32,
                    output: DataType::I32
                }
            ),
            "{e}"
        );
        // All-to-all has no in-place form.
        let mut buf = [0u8; 4];
        let call = Call::collective(
            Collective::AllToAll,
            ReduceOp::Sum,
            None,
            (&mut buf[..]).into(),
        );
        assert!(matches!(
            comm.execute(call),
            Err(CommError::InPlaceUnsupported { .. })
        ));
        // A root outside the group.
        let call = Call::collective(
            Collective::Broadcast { root: 5 },
            ReduceOp::Sum,
            None,
            (&mut buf[..]).into(),
        );
        assert!(matches!(
            comm.execute(call),
            Err(CommError::RankOutOfRange { rank: 5, .. })
        ));
        // The group is still usable; a typed slice comes back as it went in.
        let slice = HostSlice::from(&input[..]);
        assert_eq!(slice.typed::<f32>(), Some(&input[..]));
        assert_eq!(slice.typed::<i32>(), None);
        let mut ok = [comm.rank() as i64; 3];
        comm.all_reduce_in_place(&mut ok, ReduceOp::Max)?;
        Ok(ok[0])
    });
    for r in results {
        assert_eq!(r.unwrap(), 1);
    }
}

#[test]
fn a_call_too_large_to_plan_is_a_typed_error_on_every_rank() {
    // One-element chunks over 4 Mi elements: more instructions than a plan holds.
    let config = CpuConfig {
        planning: Planning {
            algorithm: Some(Algorithm::Ring),
            max_chunk_bytes: Some(1),
            ..CpuConfig::default().planning
        },
        ..CpuConfig::default()
    };
    let results = cpu::run(2, &config, |comm| {
        let mut x = vec![0.0f32; 1 << 22];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
    });
    // The rank that plans it first reports it; it fails the group (a rank
    // whose own call differs would otherwise wait for it), so the others
    // report it too, or that rank's failure naming it. Nobody waits.
    let too_large =
        |r: &Result<(), CommError>| matches!(r, Err(CommError::Plan(PlanError::TooLarge { .. })));
    assert!(results.iter().any(too_large), "{results:?}");
    for r in &results {
        let named = matches!(r, Err(CommError::PeerFailed { reason, .. }) if reason.contains("plan too large"));
        assert!(too_large(r) || named, "{r:?}");
    }
}

#[test]
fn the_traffic_counters_see_every_message() {
    let config = CpuConfig {
        planning: Planning {
            algorithm: Some(Algorithm::Ring),
            ..CpuConfig::default().planning
        },
        ..CpuConfig::default()
    };
    let results = cpu::run(4, &config, |comm| {
        let mut x = vec![1.0f64; 4000];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        // Send to the next rank, receive from the previous one, in pairs.
        let mut got = [0u8; 10];
        send_recv_by_pairs(comm, (&[1u8; 10][..]).into(), (&mut got[..]).into())?;
        assert_eq!(got, [1; 10]);
        comm.barrier()?;
        Ok(comm.link_traffic())
    });
    let traffic = results.into_iter().next().unwrap().unwrap();
    // Ring all-reduce: 2(n−1) blocks of 32 000 bytes over the ring's links,
    // plus one 10-byte point-to-point message per rank.
    let ring: u64 = traffic
        .iter()
        .filter(|l| l.link.channel == 0)
        .map(|l| l.bytes)
        .sum();
    let p2p: Vec<_> = traffic
        .iter()
        .filter(|l| l.link.channel == u32::MAX)
        .collect();
    assert_eq!(ring, 2 * 3 * 32_000);
    assert_eq!(p2p.len(), 4);
    assert!(p2p.iter().all(|l| l.messages == 1 && l.bytes == 10));
}

/// In place on one rank, out of place on the other: a mismatch on both,
/// for a planned call (`plan=` in the description) and a one-shot one.
#[test]
fn ranks_that_disagree_on_in_place_are_a_mismatch_not_a_hang() {
    for (count, marker) in [(100_000, "plan="), (1000, "protocol=one-shot")] {
        let config = CpuConfig {
            planning: Planning {
                timeout: std::time::Duration::from_secs(20),
                ..CpuConfig::default().planning
            },
            ..CpuConfig::default()
        };
        let started = std::time::Instant::now();
        let results = cpu::run(2, &config, |comm| {
            let mut buf = vec![1.0f32; count];
            if comm.rank() == 0 {
                comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
            } else {
                let input = buf.clone();
                comm.all_reduce(&input, &mut buf, ReduceOp::Sum)
            }
        });
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        assert!(results.iter().all(Result::is_err), "{results:?}");
        assert!(
            results.iter().all(
                |r| matches!(r, Err(CommError::Mismatch { got, expected, .. })
                if got.contains("in_place") && expected.contains(marker))
            ),
            "{results:?}"
        );
    }
}
