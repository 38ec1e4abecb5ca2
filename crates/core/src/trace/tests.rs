//! The recorder's ring and dumps, and what `merge` makes of them.

use std::time::Duration;

use super::merge::{self, RankAt};
use super::*;
use crate::comm::{CommError, Communicator, CommunicatorExt};
use crate::cpu::{self, CpuConfig};
use crate::settings::TraceSettings;
use crate::types::{CallShape, Collective, DataType, ReduceOp};

fn shape(count: usize) -> CallShape {
    CallShape {
        collective: Collective::AllReduce,
        count,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        in_place: false,
        purpose: Default::default(),
    }
}

fn identity(rank: u32) -> Identity {
    Identity {
        group: "g".into(),
        rank,
        world_size: 3,
        executor: "test",
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrocoll-trace-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn the_ring_keeps_the_last_calls_and_how_each_ended() {
    let r = FlightRecorder::with(identity(0), 3, None);
    for call in 0..5 {
        r.begin(call, Some(&shape(10 + call as usize)));
        r.planned(call, "ring", Some(0xabc));
        let result = if call == 4 {
            Err(CommError::Timeout {
                rank: 0,
                timeout: Duration::from_secs(1),
                what: "rank 1's message".into(),
            })
        } else {
            Ok(())
        };
        r.end(call, &result);
    }
    let calls = r.calls();
    assert_eq!(calls.iter().map(|c| c.call).collect::<Vec<_>>(), [2, 3, 4]);
    assert_eq!(calls[0].state, CallState::Done);
    assert_eq!(calls[0].plan.as_deref(), Some("0000000000000abc"));
    assert!(matches!(&calls[2].state, CallState::Failed(why) if why.contains("rank 1's message")));
    assert!(calls[2].ended_us.unwrap() >= calls[2].started_us);
    let off = FlightRecorder::with(identity(0), 0, None);
    off.begin(0, None);
    assert!(off.calls().is_empty());
}

#[test]
fn a_failure_and_a_drop_write_an_atomic_dump_named_by_host_group_and_rank() {
    let dir = temp_dir("dump");
    let r = FlightRecorder::with(identity(2), 10, Some(dir.clone()));
    r.begin(0, None);
    r.end(0, &Err(CommError::EmptyGroup));
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}: no temporary file is left");
    let name = files[0].to_string_lossy().into_owned();
    assert!(name.ends_with(".g.r2.json"), "{name}");
    let dump: Dump = serde_json::from_slice(&std::fs::read(dir.join(&name)).unwrap()).unwrap();
    assert!(dump.reason.contains("call #0 failed"), "{}", dump.reason);
    assert_eq!(dump.calls[0].collective, "barrier");
    r.begin(1, Some(&shape(5)));
    drop(r);
    let dump: Dump = serde_json::from_slice(&std::fs::read(dir.join(&name)).unwrap()).unwrap();
    assert_eq!(dump.calls.len(), 2);
    assert_eq!(dump.calls[1].state, CallState::Running);
    let _ = std::fs::remove_dir_all(&dir);
}

fn dump(rank: u32, calls: &[(u64, usize, CallState)]) -> Dump {
    Dump {
        format: FORMAT.into(),
        host: "h".into(),
        pid: 1,
        group: "g".into(),
        rank,
        world_size: 4,
        executor: "test".into(),
        reason: "test".into(),
        written_us: 10,
        dropped: 0,
        calls: calls
            .iter()
            .map(|(call, count, state)| CallRecord {
                call: *call,
                collective: "all-reduce".into(),
                dtype: "f32".into(),
                count: *count,
                op: "sum".into(),
                in_place: false,
                algorithm: Some("ring".into()),
                plan: None,
                queued_us: None,
                started_us: *call,
                ended_us: None,
                state: state.clone(),
            })
            .collect(),
        queued: Vec::new(),
    }
}

#[test]
fn merge_names_who_never_started_who_is_inside_who_failed_and_who_is_silent() {
    use CallState::*;
    let failed = Failed("timed out waiting for rank 1".into());
    let report = merge::merge(vec![
        dump(0, &[(6, 8, Done), (7, 8, failed.clone())]),
        dump(2, &[(6, 8, Done)]),
        dump(3, &[(6, 8, Done), (7, 8, Running)]),
    ]);
    let g = &report[0];
    let stuck = g.stuck.as_ref().unwrap();
    assert_eq!(stuck.call, 7);
    assert_eq!(
        stuck.ranks,
        [
            (0, RankAt::Failed("timed out waiting for rank 1".into())),
            (1, RankAt::NoDump),
            (2, RankAt::NeverStarted(Some(6))),
            (3, RankAt::Running),
        ]
    );
    let text = g.to_string();
    assert!(text.contains("rank 1: WROTE NO DUMP"), "{text}");
    assert!(
        text.contains("rank 2: NEVER STARTED it (its last call was #6)"),
        "{text}"
    );
    assert!(g.disagreements.is_empty());
    // Rank 3 dumped from inside the call: alive, waiting. The absent
    // ranks come first; only without them is a rank inside a suspect.
    assert_eq!(stuck.suspects(), [1, 2]);
    assert!(text.contains("suspects: rank 1, rank 2 ("), "{text}");
    let inside = merge::merge(vec![
        dump(0, &[(7, 8, failed.clone())]),
        dump(1, &[(7, 8, Running)]),
        dump(2, &[(7, 8, Done)]),
        dump(3, &[(7, 8, Running)]),
    ]);
    assert_eq!(inside[0].stuck.as_ref().unwrap().suspects(), [1, 3]);
}

#[test]
fn merge_lists_calls_ranks_describe_differently_and_keeps_each_ranks_newest_dump() {
    use CallState::*;
    let mut old = dump(1, &[(0, 8, Running)]);
    old.written_us = 1;
    let report = merge::merge(vec![
        dump(0, &[(0, 8, Done), (1, 8, Done)]),
        dump(1, &[(0, 8, Done), (1, 9, Done)]),
        old,
    ]);
    let g = &report[0];
    assert_eq!(g.disagreements.len(), 1);
    assert_eq!(g.disagreements[0].call, 1);
    assert_eq!(g.dumps[&1].calls.len(), 2, "the newer dump of rank 1");
    assert!(g.to_string().contains("is not the same call on every rank"));
}

#[test]
fn a_directory_without_dumps_is_an_error_and_strangers_are_skipped() {
    let dir = temp_dir("merge");
    std::fs::create_dir_all(&dir).unwrap();
    assert!(matches!(
        merge::read_dir(&dir),
        Err(merge::MergeError::Empty(_))
    ));
    std::fs::write(dir.join("other.json"), b"{\"a\": 1}").unwrap();
    std::fs::write(
        dir.join("r0.json"),
        serde_json::to_vec(&dump(0, &[])).unwrap(),
    )
    .unwrap();
    let report = merge::read_dir(&dir).unwrap();
    assert_eq!(report.skipped.len(), 1);
    assert!(report.to_string().contains("skipped"), "{report}");
    assert!(merge::read_dir(&dir.join("missing")).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// One rank of four threads skips the last call and leaves: the others
/// fail it, and the merged dumps say rank 2 never started it.
#[test]
fn threads_a_rank_that_skips_a_call_is_named_by_the_trace() {
    let dir = temp_dir("threads");
    let config = CpuConfig {
        trace: Some(TraceSettings {
            capacity: 100,
            dir: Some(dir.clone()),
            summary: false,
        }),
        ..CpuConfig::builtin()
    };
    let results = cpu::run(4, &config, |comm| {
        let rank = comm.rank();
        for call in 0..4 {
            if call == 3 && rank == 2 {
                return Ok(());
            }
            let mut x = vec![1.0f32; 1000 + call];
            comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        }
        Ok(())
    });
    assert!(results[0].is_err() && results[2].is_ok(), "{results:?}");
    let report = merge::read_dir(&dir).unwrap();
    let g = &report.groups[0];
    assert_eq!(g.dumps.len(), 4, "{report}");
    let stuck = g.stuck.as_ref().expect("a call not every rank finished");
    assert_eq!(stuck.call, 3, "{report}");
    assert_eq!(
        stuck.ranks[2],
        (2, RankAt::NeverStarted(Some(2))),
        "{report}"
    );
    assert!(
        stuck.what.contains("all-reduce f32 x1003"),
        "{}",
        stuck.what
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_summary_groups_finished_calls_by_collective_and_size() {
    let r = FlightRecorder::with(identity(0), 100, None);
    for call in 0..5 {
        r.begin(call, Some(&shape(if call < 4 { 1000 } else { 10 })));
        r.end(call, &Ok(()));
    }
    r.begin(5, Some(&shape(1000)));
    r.end(5, &Err(CommError::EmptyGroup));
    r.begin(6, None);
    r.end(6, &Ok(()));
    let rows = r.summary();
    assert_eq!(
        rows.len(),
        2,
        "{rows:?}: failed calls and barriers are left out"
    );
    let big = rows.iter().max_by_key(|row| row.bytes).unwrap();
    assert_eq!((big.collective.as_str(), big.calls), ("all-reduce", 4));
    assert!(big.p50_us <= big.p90_us && big.p90_us <= big.max_us);
    let text = render_summary(&rows);
    assert!(
        text.contains("busbw p50") && text.contains("all-reduce"),
        "{text}"
    );
}

/// A dump that claims a group of four billion ranks is skipped, not
/// believed: the report lists every rank of a group, and building that
/// list aborted `ferrocoll trace` on the allocation.
#[test]
fn a_dump_claiming_a_huge_group_is_skipped_not_believed() {
    let dir = temp_dir("huge");
    std::fs::create_dir_all(&dir).unwrap();
    let mut huge = dump(1, &[(0, 8, CallState::Running)]);
    huge.world_size = u32::MAX;
    std::fs::write(dir.join("huge.json"), serde_json::to_vec(&huge).unwrap()).unwrap();
    std::fs::write(
        dir.join("r0.json"),
        serde_json::to_vec(&dump(0, &[])).unwrap(),
    )
    .unwrap();
    let report = merge::read_dir(&dir).unwrap();
    assert_eq!(report.skipped.len(), 1, "{report}");
    assert!(report.to_string().contains("groups of at most"), "{report}");
    assert!(merge::merge(vec![huge]).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The one dump written into `dir`.
fn only_dump(dir: &std::path::Path) -> Dump {
    let file = std::fs::read_dir(dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap()
}

/// A call waits in an `AsyncCommunicator`'s queue ("queued") until its
/// progress thread starts it; the started call keeps when it was queued,
/// and a job the recorder was not told about attaches nothing.
#[test]
fn queued_calls_are_listed_until_started_and_keep_when_they_were_queued() {
    let dir = temp_dir("queue");
    let r = FlightRecorder::with(identity(1), 10, Some(dir.clone()));
    let q = r.queue();
    let (a, b) = (q.queued("first".into()), q.queued("second".into()));
    q.started(Some(a));
    r.begin(0, Some(&shape(4)));
    r.end(0, &Err(CommError::EmptyGroup));
    let dump = only_dump(&dir);
    let whats: Vec<&str> = dump.queued.iter().map(|q| q.what.as_str()).collect();
    assert_eq!(whats, ["second"]);
    assert!(
        dump.calls[0]
            .queued_us
            .is_some_and(|t| t <= dump.calls[0].started_us)
    );
    q.started(None);
    r.begin(1, None);
    q.started(Some(b));
    assert!(
        r.calls()[1].queued_us.is_none(),
        "an unrecorded job attaches nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Through the real path: three all-reduces started on one rank whose
/// peer never calls. The first times out and its dump lists the two
/// behind it as queued, described; `ferrocoll trace` says so.
#[test]
fn an_async_ranks_dump_lists_the_calls_queued_behind_a_stuck_one() {
    use crate::comm::AsyncCommunicator;
    let dir = temp_dir("async");
    let mut config = CpuConfig::builtin();
    config.planning.timeout = Duration::from_millis(300);
    config.trace = Some(TraceSettings {
        capacity: 100,
        dir: Some(dir.clone()),
        summary: false,
    });
    let comms = cpu::group(2, &config).unwrap();
    let done = std::sync::Barrier::new(2);
    let dump = std::thread::scope(|s| {
        let mut ranks = comms.into_iter();
        let (zero, one) = (ranks.next().unwrap(), ranks.next().unwrap());
        s.spawn(|| {
            let _one = one;
            done.wait();
        });
        let mut comm = AsyncCommunicator::new(zero).unwrap();
        let works: Vec<_> = (0..3)
            .map(|_| comm.iall_reduce(vec![1.0f32; 16], ReduceOp::Sum))
            .collect();
        for w in works {
            assert!(w.wait().is_err());
        }
        let dump = only_dump(&dir);
        done.wait();
        dump
    });
    assert!(dump.reason.contains("call #0 failed"), "{}", dump.reason);
    let whats: Vec<&str> = dump.queued.iter().map(|q| q.what.as_str()).collect();
    assert_eq!(whats, ["all-reduce f32 x16 sum in place"; 2]);
    assert!(dump.calls[0].queued_us.is_some());
    let report = merge::merge(vec![dump]);
    let text = report[0].to_string();
    assert!(
        text.contains("2 call(s) queued behind it, not started"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
