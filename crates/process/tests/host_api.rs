//! The host API across processes: started calls with `Work` handles, a
//! 2 × 3 grid split into rows and columns used at the same time (each a
//! process group of its own), gather / scatter / the `-v` collectives,
//! batched point-to-point, DDP-style gradient sync, and a rank that dies
//! while others hold outstanding handles. Over shared memory and TCP.

mod common;

use std::time::Duration;

use ferrocoll_core::ReduceOp;
use ferrocoll_core::comm::{AsyncCommunicator, CommError, Communicator, CommunicatorExt, Planning};
use ferrocoll_core::grad_sync::GradientSync;
use ferrocoll_process::{ProcessConfig, TransportKind};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Everything a training loop does, checked on one rank of a `rows × cols` grid.
fn grid(comm: ferrocoll_process::ProcessCommunicator, cols: u32) -> Result<(), CommError> {
    let mut comm = comm;
    let (rank, n) = (comm.rank(), comm.world_size());
    let (row, col) = (rank / cols, rank % cols);
    let row_comm = comm.split(Some(row), col)?.expect("a color");
    let col_comm = comm.split(Some(1000 + col), row)?.expect("a color");
    assert!(comm.split(None, 0)?.is_none());
    assert_eq!((row_comm.rank(), row_comm.world_size()), (col, cols));
    assert_eq!((col_comm.rank(), col_comm.world_size()), (row, n / cols));
    println!(
        "rank {rank}: row on {} hosts, column on {} hosts",
        row_comm.layout().hosts(),
        col_comm.layout().hosts()
    );
    let mut rows = AsyncCommunicator::new(row_comm)?;
    let mut cols_comm = AsyncCommunicator::new(col_comm)?;
    let r = u64::from(rank);
    // Rows and columns at the same time, the parent alongside.
    let along_row = rows.iall_reduce(vec![r; 70_001], ReduceOp::Sum);
    let along_col = cols_comm.iall_reduce(vec![r; 70_001], ReduceOp::Sum);
    let mut all = [r];
    comm.all_reduce_in_place(&mut all, ReduceOp::Sum)?;
    let row_sum: u64 = (0..u64::from(cols))
        .map(|c| u64::from(row * cols) + c)
        .sum();
    let col_sum: u64 = (0..u64::from(n / cols))
        .map(|k| k * u64::from(cols) + u64::from(col))
        .sum();
    assert_eq!(along_row.wait()?[70_000], row_sum);
    assert_eq!(along_col.wait()?[70_000], col_sum);
    assert_eq!(all[0], u64::from(n) * u64::from(n - 1) / 2);

    // Gather / scatter on the parent, uneven all-gather on the row.
    let mut gathered = vec![0u32; if rank == 0 { 3 * n as usize } else { 0 }];
    comm.gather(&[rank; 3], &mut gathered, 0)?;
    let mut back = [0u32; 3];
    comm.scatter(&gathered, &mut back, 0)?;
    assert_eq!(back, [rank; 3]);
    let counts: Vec<usize> = (0..cols as usize).map(|c| c * 2 + 1).collect();
    let mine = vec![rank as i64; counts[col as usize]];
    let row_all = vec![0i64; counts.iter().sum()];
    let (_, row_all) = rows
        .start((mine, row_all), move |c, (m, o)| {
            c.all_gather_v(m, o, &counts)
        })
        .wait()?;
    assert_eq!(row_all[0], i64::from(row * cols));
    assert_eq!(*row_all.last().unwrap(), i64::from(row * cols + cols - 1));

    // All-to-all-v: rank i sends i + j + 1 elements to rank j.
    let sends: Vec<usize> = (0..n).map(|j| (rank + j + 1) as usize).collect();
    let recvs: Vec<usize> = (0..n).map(|i| (i + rank + 1) as usize).collect();
    let input: Vec<f32> = sends
        .iter()
        .enumerate()
        .flat_map(|(j, &c)| std::iter::repeat_n((rank * 10 + j as u32) as f32, c))
        .collect();
    let mut output = vec![0.0f32; recvs.iter().sum()];
    comm.all_to_all_v(&input, &sends, &mut output, &recvs)?;
    let want: Vec<f32> = (0..n)
        .flat_map(|i| std::iter::repeat_n((i * 10 + rank) as f32, (i + rank + 1) as usize))
        .collect();
    assert_eq!(output, want);

    // A ring exchange both ways in one batch, and a disagreement.
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let mut parent = AsyncCommunicator::new(comm)?;
    let (_, got) = parent
        .batch_isend_irecv(
            vec![(vec![rank; 5], next), (vec![rank; 2], prev)],
            vec![(vec![0u32; 5], prev), (vec![0u32; 2], next)],
        )
        .wait()?;
    assert_eq!(got[0].0, vec![prev; 5]);
    assert_eq!(got[1].0, vec![next; 2]);
    // isend / irecv between neighbours, in an order that needs no batch.
    let partner = rank ^ 1;
    if partner < n {
        let got = if rank % 2 == 0 {
            parent.isend(vec![rank as i32 + 7; 9], partner).wait()?;
            parent.irecv(vec![0i32; 9], partner).wait()?
        } else {
            let got = parent.irecv(vec![0i32; 9], partner).wait()?;
            parent.isend(vec![rank as i32 + 7; 9], partner).wait()?;
            got
        };
        assert_eq!(got, vec![partner as i32 + 7; 9]);
    }
    let root = if rank == 1 { 1 } else { 0 };
    let e = parent
        .start((), move |c, _| {
            c.gather(
                &[1u8],
                &mut vec![0u8; if rank == root { n as usize } else { 0 }],
                root,
            )
        })
        .wait()
        .unwrap_err();
    assert!(
        matches!(e.error, CommError::Disagreement { .. }),
        "{}",
        e.error
    );

    // DDP-style sync on the columns (the data-parallel axis).
    let lens = [1000usize, 3, 40_000, 7];
    let mut sync = GradientSync::<f32, _>::new(cols_comm, &lens, 4096).map_err(unsupported)?;
    for (p, &len) in lens.iter().enumerate().rev() {
        sync.mark_ready(p, &vec![r as f32; len])
            .map_err(unsupported)?;
    }
    sync.finish().map_err(unsupported)?;
    let avg = col_sum as f32 / (n / cols) as f32;
    assert!(
        lens.iter()
            .enumerate()
            .all(|(p, _)| sync.gradient(p).unwrap().iter().all(|&g| g == avg))
    );
    parent.ibarrier().wait()?;
    Ok(())
}

#[test]
#[ignore = "one rank of the multi-process tests in this file: they start copies of this binary running it with FERROCOLL_TEST_RANK set; alone it does nothing"]
fn child() {
    let Some(env) = common::child_env() else {
        return;
    };
    let comm = common::connect(
        &env,
        ProcessConfig {
            max_message_bytes: 8192,
            planning: Planning {
                timeout: TIMEOUT,
                ..ProcessConfig::default().planning
            },
            ..ProcessConfig::default()
        },
    );
    let rank = env.rank;
    match env.scenario.as_str() {
        "auto-hosts" => {
            auto_across_hosts(comm);
            println!("rank {rank} passed");
        }
        "grid" => {
            grid(comm, 3).unwrap();
            println!("rank {rank} passed");
        }
        "dies" => {
            let mut comm = AsyncCommunicator::new(comm).unwrap();
            comm.iall_reduce(vec![1.0f32; 1000], ReduceOp::Sum)
                .wait()
                .unwrap();
            if rank == 2 {
                // Leave the others time to finish reading this call: an
                // exit resets TCP connections, and data still in flight to
                // a peer would be lost with it (that call is not the one
                // under test).
                std::thread::sleep(Duration::from_millis(300));
                println!("rank 2 exits");
                std::process::exit(3);
            }
            let works: Vec<_> = (0..3)
                .map(|_| comm.iall_reduce(vec![1.0f32; 100_000], ReduceOp::Sum))
                .collect();
            for w in works {
                let failed = w.wait().expect_err("rank 2 is gone");
                assert_eq!(failed.buffers.map(|b| b.len()), Some(100_000));
                println!("rank {rank}: {}", failed.error);
            }
            println!("rank {rank} passed");
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// What `auto` runs on 2 hosts of 2 ranks: all-reduce hierarchical (and
/// correct), other collectives and forced algorithms as before.
fn auto_across_hosts(mut comm: ferrocoll_process::ProcessCommunicator) {
    use ferrocoll_core::types::{CallShape, Collective, DataType};
    let shape = |collective, count| CallShape {
        collective,
        count,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        in_place: false,
        purpose: Default::default(),
    };
    let rank = comm.rank();
    let big = comm
        .explain(&shape(Collective::AllReduce, 1 << 18))
        .unwrap();
    assert!(big.contains("algorithm=hierarchical 2x2"), "{big}");
    assert!(big.contains("spans 2 hosts of 2 ranks"), "{big}");
    let input: Vec<f32> = (0..1 << 18).map(|i| (i % 7) as f32 + rank as f32).collect();
    let mut out = vec![0.0f32; 1 << 18];
    comm.all_reduce(&input, &mut out, ReduceOp::Sum).unwrap();
    for (i, &x) in out.iter().enumerate() {
        assert_eq!(x, 4.0 * (i % 7) as f32 + 6.0, "element {i}");
    }
    let gather = comm
        .explain(&shape(Collective::AllGather, 1 << 16))
        .unwrap();
    assert!(!gather.contains("hierarchical"), "{gather}");
    let small = comm.explain(&shape(Collective::AllReduce, 4)).unwrap();
    assert!(small.contains("one-shot"), "{small}");
    comm.set_algorithm(Some(ferrocoll_core::Algorithm::Ring));
    let ring = comm
        .explain(&shape(Collective::AllReduce, 1 << 18))
        .unwrap();
    assert!(ring.contains("algorithm=ring"), "{ring}");
}

/// `auto` across hosts: all-reduce runs the hierarchical schedule of the
/// group's layout; on one host it does not.
#[test]
fn auto_runs_the_hierarchical_all_reduce_across_hosts_only() {
    let hosts = [("FERROCOLL_TEST_HOSTS", "a,a,b,b")];
    let ranks = common::spawn_some(
        "child",
        "auto-hosts",
        &[0, 1, 2, 3],
        4,
        TransportKind::Auto,
        &hosts,
    );
    let finished = ranks.finish(Duration::from_secs(60), Vec::new());
    common::assert_all_ok(&finished);
    assert!(finished.iter().all(|f| f.output.contains("passed")));
    // One host: the same check fails on its first assertion.
    let ranks = common::spawn("child", "auto-hosts", 4, TransportKind::Auto);
    let finished = ranks.finish(Duration::from_secs(60), Vec::new());
    assert!(
        finished
            .iter()
            .all(|f| f.output.contains("algorithm=direct")
                && !f.output.contains(&format!("rank {} passed", f.rank))),
        "{}",
        common::show(&finished)
    );
}

fn grid_on(transport: TransportKind) {
    grid_across(transport, &[]);
}

fn grid_across(transport: TransportKind, env: &[(&str, &str)]) -> Vec<common::Finished> {
    let ranks = common::spawn_some("child", "grid", &[0, 1, 2, 3, 4, 5], 6, transport, env);
    let finished = ranks.finish(Duration::from_secs(120), Vec::new());
    common::assert_all_ok(&finished);
    assert!(finished.iter().all(|f| f.output.contains("passed")));
    finished
}

/// Splits keep a link per peer: rows span both hosts (shared memory and
/// TCP), column 0 lies on host a (shared memory only), column 1 on both
/// (TCP only).
#[test]
fn a_2_by_3_grid_of_processes_on_two_hosts_splits_into_every_kind_of_group() {
    let hosts = [("FERROCOLL_TEST_HOSTS", "a,a,b,a,b,b")];
    let finished = grid_across(TransportKind::Auto, &hosts);
    let said = |rank: u32, text: &str| {
        finished
            .iter()
            .any(|f| f.rank == rank && f.output.contains(text))
    };
    assert!(said(0, "rank 0: row on 2 hosts, column on 1 hosts"));
    assert!(said(1, "rank 1: row on 2 hosts, column on 2 hosts"));
    assert!(said(5, "rank 5: row on 2 hosts, column on 1 hosts"));
}

#[test]
fn a_2_by_3_grid_of_processes_works_along_rows_and_columns_over_shared_memory() {
    grid_on(TransportKind::Shm);
}

#[test]
fn a_2_by_3_grid_of_processes_works_along_rows_and_columns_over_tcp() {
    grid_on(TransportKind::Tcp);
}

#[test]
fn a_rank_that_dies_fails_every_outstanding_work_of_the_others() {
    for transport in [TransportKind::Shm, TransportKind::Tcp] {
        let ranks = common::spawn("child", "dies", 3, transport);
        let finished = ranks.finish(Duration::from_secs(60), Vec::new());
        for f in &finished {
            if f.rank == 2 {
                assert_eq!(f.code, Some(3), "{}", common::show(&finished));
            } else {
                assert_eq!(f.code, Some(0), "{}", common::show(&finished));
                assert!(f.output.contains("passed"));
                // Noticed, not timed out.
                assert!(f.at < TIMEOUT, "{}", common::show(&finished));
            }
        }
    }
}

/// A gradient-sync error as the communicator error the rank closures return.
fn unsupported(e: impl std::fmt::Display) -> CommError {
    CommError::Unsupported {
        what: e.to_string(),
    }
}
