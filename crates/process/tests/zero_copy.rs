//! Zero copy across processes: the conformance kit's matrix over shared
//! memory with every buffer in the group's shared heap (values travel as
//! heap offsets and peers read them in place), and again with private
//! buffers in a group that has a heap (copied through the slots) — each
//! rank a real process, checking its own output against the serial
//! reference. Also: the heap hands out and takes back buffers, refuses
//! what does not fit, and a group without a heap says so.

mod common;

use std::time::Duration;

use ferrocoll_core::comm::{
    AsyncCommunicator, Call, CommError, Communicator, CommunicatorExt, Planning,
};
use ferrocoll_core::conformance::{
    Case, KitElement, case_inputs, check_output, check_rank, in_place_buffer, poisoned_output,
};
use ferrocoll_core::grad_sync::GradientSync;
use ferrocoll_core::{Collective, ReduceOp};
use ferrocoll_process::{ProcessCommunicator, ProcessConfig, TransportKind};

/// Run `case` on this rank with its buffers in the shared heap.
fn check_rank_in_heap(comm: &mut ProcessCommunicator, case: &Case) -> Result<(), String> {
    ferrocoll_core::with_element_type!(case.dtype, T => check_in_heap::<T>(comm, case))
}

fn check_in_heap<T: KitElement>(comm: &mut ProcessCommunicator, case: &Case) -> Result<(), String> {
    let r = comm.rank();
    let inputs = case_inputs::<T>(case);
    let fail = |e: CommError| format!("{case:?}: rank {r}: {e}");
    let shared = |comm: &ProcessCommunicator, from: &[T]| {
        let mut b = comm.shared_buffer::<T>(from.len()).map_err(fail)?;
        b.copy_from_slice(from);
        Ok::<_, String>(b)
    };
    let (c, count) = (case.collective, case.count);
    let out: Vec<T> = if case.in_place {
        let placed = in_place_buffer(c, r, count, &inputs[r as usize], poisoned_output(case));
        let mut buf = shared(comm, &placed)?;
        comm.execute(Call::collective(c, case.op, None, (&mut buf[..]).into()))
            .map_err(fail)?;
        if c == Collective::ReduceScatter {
            buf[r as usize * count..(r as usize + 1) * count].to_vec()
        } else {
            buf.to_vec()
        }
    } else {
        let input = shared(comm, &inputs[r as usize])?;
        let mut output = shared(comm, &poisoned_output::<T>(case))?;
        let call = Call::collective(
            c,
            case.op,
            Some((&input[..]).into()),
            (&mut output[..]).into(),
        );
        comm.execute(call).map_err(fail)?;
        output.to_vec()
    };
    check_output(case, r, &inputs, &out)
}

#[test]
#[ignore = "one rank of the multi-process tests in this file: they start copies of this binary running it with FERROCOLL_TEST_RANK set; alone it does nothing"]
fn child() {
    let Some(env) = common::child_env() else {
        return;
    };
    if env.scenario == "one-shot" {
        let mut comm = common::connect(
            &env,
            ProcessConfig {
                planning: Planning {
                    timeout: Duration::from_secs(30),
                    ..ProcessConfig::default().planning
                },
                ..ProcessConfig::default()
            },
        );
        let mut ran = 0;
        for case in common::kit_cases(env.world_size) {
            // The executor's own choice: small calls go one-shot.
            comm.set_algorithm(None);
            if let Err(e) = check_rank(&mut comm, &case) {
                panic!("{e}");
            }
            ran += 1;
        }
        assert!(
            comm.one_shot_calls() > 20,
            "{} one-shot calls",
            comm.one_shot_calls()
        );
        println!("rank {} passed {ran} cases", env.rank);
        return;
    }
    if env.scenario == "heap-large" {
        large_in_heap(&env);
        return;
    }
    if env.scenario == "heap-mixed" {
        heap_mixed(&env);
        return;
    }
    if env.scenario == "buckets-in-heap" {
        buckets_in_heap(&env);
        return;
    }
    if env.scenario == "no-heap" {
        let mut comm = common::connect(&env, ProcessConfig::default());
        let e = comm.shared_buffer::<f32>(10).unwrap_err();
        assert!(matches!(e, CommError::Unsupported { .. }), "{e}");
        let mut x = vec![1.0f32; 100_000];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(
            comm.messages_by_reference(),
            0,
            "private buffers are copied"
        );
        let async_comm = AsyncCommunicator::new(comm).unwrap();
        let sync = GradientSync::<f32, _>::new(async_comm, &[1000, 3], 4096).unwrap();
        assert_eq!(sync.lent_buckets(), 0, "no heap, nothing lent");
        println!("rank {} passed", env.rank);
        return;
    }
    let config = ProcessConfig {
        // Small messages: short buffers still cross many segments, and
        // calls on the heap's plan (chunks past the slot) several too.
        max_message_bytes: 4096,
        shared_heap_bytes: 8 << 20,
        planning: Planning {
            timeout: Duration::from_secs(30),
            max_chunk_bytes: Some(16 << 10),
            ..ProcessConfig::default().planning
        },
        ..ProcessConfig::default()
    };
    let mut comm = common::connect(&env, config);
    let mut ran = 0;
    for case in common::kit_cases(env.world_size) {
        comm.set_algorithm(case.algorithm);
        let in_heap = env.scenario == "heap" || env.scenario == "heap-hosts";
        let checked = if in_heap && case.collective != Collective::SendRecv {
            check_rank_in_heap(&mut comm, &case)
        } else {
            check_rank(&mut comm, &case)
        };
        if let Err(e) = checked {
            panic!("{e}");
        }
        ran += 1;
    }
    if env.scenario == "private" {
        // Private memory is never lent: every value was copied.
        assert_eq!(
            comm.messages_by_reference(),
            0,
            "private buffers are copied"
        );
        assert_eq!(comm.heap_plan_calls(), 0, "private buffers fit slots");
    } else if env.scenario == "heap-hosts" {
        // Peers on the other host cannot read this one's heap: no call
        // runs the plan that sends everything by reference, but values
        // for peers of this host still went by reference.
        assert_eq!(comm.layout().hosts(), 2);
        assert_eq!(comm.heap_plan_calls(), 0, "the heap's plan spans hosts");
        assert!(
            comm.messages_by_reference() > 20,
            "{} messages by reference",
            comm.messages_by_reference()
        );
    } else {
        assert!(
            comm.heap_plan_calls() > 20,
            "{} calls on the heap's plan",
            comm.heap_plan_calls()
        );
        // Most of those values could go by reference, and did: the paths
        // under test were taken.
        assert!(
            comm.messages_by_reference() > 100,
            "{} messages by reference",
            comm.messages_by_reference()
        );
    }
    heap_bookkeeping(&mut comm);
    println!("rank {} passed {ran} cases", env.rank);
}

/// Buffers come back to the heap; what does not fit is `Capacity`; a
/// heap buffer owned by a call works like any other.
fn heap_bookkeeping(comm: &mut ProcessCommunicator) {
    for _ in 0..3 {
        let big = comm
            .shared_buffer::<u8>(6 << 20)
            .expect("freed buffers come back");
        assert!(big.iter().all(|&b| b == 0), "handed out zeroed");
    }
    let e = comm.shared_buffer::<f64>(2 << 20).unwrap_err();
    assert!(matches!(e, CommError::Capacity { .. }), "{e}");
    let mut x = comm.shared_buffer::<i64>(1000).unwrap();
    x.fill(i64::from(comm.rank()) + 1);
    comm.all_reduce_in_place(&mut x[..], ReduceOp::Sum).unwrap();
    let n = i64::from(comm.world_size());
    assert!(x.iter().all(|&v| v == n * (n + 1) / 2));
}

/// Large calls on heap buffers with the default 512 KiB messages, so
/// values stream through the fused kernel into this rank's output and a
/// peer's posted destination at once, in place and out of place; every
/// element checked (integer-valued floats: sums are exact).
fn large_in_heap(env: &common::ChildEnv) {
    let mut comm = common::connect(
        env,
        ProcessConfig {
            shared_heap_bytes: 64 << 20,
            planning: Planning {
                timeout: Duration::from_secs(30),
                ..ProcessConfig::default().planning
            },
            ..ProcessConfig::default()
        },
    );
    let (r, n) = (comm.rank() as usize, comm.world_size() as usize);
    let len = (3 << 20) + 5;
    let want = |i: usize| (n * (i % 1000) + n * (n - 1) / 2) as f32;
    for in_place in [false, true] {
        let mut input = comm.shared_buffer::<f32>(len).unwrap();
        for (i, x) in input.iter_mut().enumerate() {
            *x = (i % 1000 + r) as f32;
        }
        let mut output = comm.shared_buffer::<f32>(len).unwrap();
        if in_place {
            comm.all_reduce_in_place(&mut input[..], ReduceOp::Sum)
                .unwrap();
            output.copy_from_slice(&input);
        } else {
            comm.all_reduce(&input[..], &mut output[..], ReduceOp::Sum)
                .unwrap();
        }
        if let Some(i) = (0..len).find(|&i| output[i] != want(i)) {
            panic!(
                "in place {in_place}: element {i}: {} != {}",
                output[i],
                want(i)
            );
        }
        let mut ints = comm.shared_buffer::<i64>(len).unwrap();
        ints.fill(r as i64 + 1);
        comm.all_reduce_in_place(&mut ints[..], ReduceOp::Sum)
            .unwrap();
        assert!(ints.iter().all(|&v| v == (n * (n + 1) / 2) as i64));
    }
    // Values that differ per rank and element, in place, small blocks and
    // a type without a fused kernel: a peer lends a block and posts the
    // same block for the answer, so a room is a message's very bytes.
    comm.set_algorithm(Some(ferrocoll_core::Algorithm::Direct));
    let count = 4096 + 3 * n;
    let mut x = comm.shared_buffer::<i64>(count).unwrap();
    for round in 0..200i64 {
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as i64) * 7 + (r as i64) * 1000 + round;
        }
        comm.all_reduce_in_place(&mut x[..], ReduceOp::Sum).unwrap();
        let n = n as i64;
        for (i, &v) in x.iter().enumerate() {
            let want = n * (i as i64 * 7 + round) + 1000 * n * (n - 1) / 2;
            assert_eq!(v, want, "round {round} element {i}");
        }
    }
    assert!(comm.messages_by_reference() > 0);
    println!("rank {} passed", env.rank);
}

/// Whether rank `r` places call `i`'s buffers in its heap: a pattern every
/// rank knows, so each can count the calls where all of them did.
fn in_heap(i: usize, r: usize) -> bool {
    (i * 7 + r * 3) % 5 != 0
}

/// Calls whose buffers lie in the heap on some ranks and not others, in a
/// pattern, with barriers between: every call exact, and the heap's plan
/// (chunks past the slot) run exactly when every rank's buffers were in
/// its heap — including when a peer that finished early already announced
/// the next call (broadcast and reduce let ranks finish before others).
fn heap_mixed(env: &common::ChildEnv) {
    let mut comm = common::connect(
        env,
        ProcessConfig {
            max_message_bytes: 4096,
            shared_heap_bytes: 8 << 20,
            planning: Planning {
                timeout: Duration::from_secs(30),
                algorithm: Some(ferrocoll_core::Algorithm::Direct),
                ..ProcessConfig::default().planning
            },
            ..ProcessConfig::default()
        },
    );
    let (r, n) = (comm.rank() as usize, comm.world_size() as usize);
    let count = 6000 + 3 * n;
    let calls = 60;
    for i in 0..calls {
        let (mut input, mut output) = if in_heap(i, r) {
            let a = comm.shared_buffer::<i64>(count).unwrap();
            let b = comm.shared_buffer::<i64>(count).unwrap();
            (Buffers::Heap(a), Buffers::Heap(b))
        } else {
            (Buffers::Own(vec![0; count]), Buffers::Own(vec![0; count]))
        };
        for (k, x) in input.slice().iter_mut().enumerate() {
            *x = (k + 10 * r + i) as i64;
        }
        let (collective, root) = match i % 3 {
            0 => (Collective::AllReduce, 0),
            1 => (
                Collective::Broadcast {
                    root: (i % n) as u32,
                },
                i % n,
            ),
            _ => (
                Collective::Reduce {
                    root: ((i + 1) % n) as u32,
                },
                (i + 1) % n,
            ),
        };
        let call = Call::collective(
            collective,
            ReduceOp::Sum,
            Some((&input.slice()[..]).into()),
            (&mut output.slice()[..]).into(),
        );
        comm.execute(call).unwrap();
        let sum = |k: usize| (n * (k + i) + 10 * n * (n - 1) / 2) as i64;
        let want = |k: usize| match collective {
            Collective::Broadcast { .. } => Some((k + 10 * root + i) as i64),
            Collective::Reduce { .. } if r != root => None,
            _ => Some(sum(k)),
        };
        for (k, &got) in output.slice().iter().enumerate() {
            if let Some(w) = want(k) {
                assert_eq!(got, w, "call {i} ({collective}) element {k}");
            }
        }
        if i % 4 == 3 {
            comm.barrier().unwrap();
        }
    }
    let everyone = (0..calls)
        .filter(|&i| (0..n).all(|r| in_heap(i, r)))
        .count();
    assert!(everyone > 0 && everyone < calls, "the pattern mixes");
    assert_eq!(comm.heap_plan_calls(), everyone as u64);
    println!("rank {r} passed");
}

/// A call's buffer, in the shared heap or private.
enum Buffers {
    Heap(ferrocoll_process::SharedBuffer<i64>),
    Own(Vec<i64>),
}

impl Buffers {
    fn slice(&mut self) -> &mut [i64] {
        match self {
            Buffers::Heap(b) => &mut b[..],
            Buffers::Own(v) => v,
        }
    }
}

/// DDP-style sync over processes with a heap too small for every bucket:
/// the buckets that fit are lent by the heap, so their all-reduces send
/// references and run on the heap's plan; the rest stay private. Every
/// step's averages exact either way.
fn buckets_in_heap(env: &common::ChildEnv) {
    let comm = common::connect(
        env,
        ProcessConfig {
            // Small slots: a bucket's baseline plan has many segments, so
            // the heap's plan differs from it and runs.
            max_message_bytes: 4096,
            shared_heap_bytes: 256 << 10,
            planning: Planning {
                timeout: Duration::from_secs(30),
                ..ProcessConfig::default().planning
            },
            ..ProcessConfig::default()
        },
    );
    let (r, n) = (comm.rank() as usize, comm.world_size() as usize);
    let lens = [20_000usize, 3, 30_000, 7, 25_000, 11];
    let async_comm = AsyncCommunicator::new(comm).unwrap();
    let mut sync = GradientSync::<f32, _>::new(async_comm, &lens, 64 << 10).unwrap();
    let lent = sync.lent_buckets();
    let buckets = sync.buckets().len();
    assert!(
        0 < lent && lent < buckets,
        "{lent} of {buckets} buckets lent"
    );
    let value = |p: usize, i: usize, step: usize| (i % 13 + p + step) as f32;
    for step in 0..3 {
        for p in (0..lens.len()).rev() {
            for (i, g) in sync
                .gradient_to_overwrite(p)
                .unwrap()
                .iter_mut()
                .enumerate()
            {
                *g = (r + 1) as f32 * value(p, i, step);
            }
            sync.mark_ready_in_place(p).unwrap();
        }
        sync.finish().unwrap();
        // The mean of 1..=n times each value.
        let mean = (n + 1) as f32 / 2.0;
        for (p, &len) in lens.iter().enumerate() {
            let got = sync.gradient(p).unwrap();
            if let Some(i) = (0..len).find(|&i| got[i] != mean * value(p, i, step)) {
                panic!("step {step} param {p} element {i}: {}", got[i]);
            }
        }
    }
    assert_eq!(sync.lent_buckets(), lent, "lent buckets come back");
    let (by_reference, heap_plan) = sync
        .communicator()
        .start((0, 0), |c, out| {
            *out = (c.messages_by_reference(), c.heap_plan_calls());
            Ok(())
        })
        .wait()
        .unwrap();
    assert!(by_reference > 0, "lent buckets travel by reference");
    // Buckets too small for more than one segment, or small enough to go
    // one-shot, keep their plan; the large lent ones take the heap's.
    assert!(
        0 < heap_plan && heap_plan <= 3 * lent as u64,
        "{heap_plan} calls on the heap's plan, {lent} buckets lent"
    );
    println!("rank {} passed", env.rank);
}

fn run(scenario: &str, n: u32) {
    run_over(scenario, n, TransportKind::Shm);
}

fn run_over(scenario: &str, n: u32, transport: TransportKind) {
    run_on(scenario, n, transport, &[]);
}

fn run_on(scenario: &str, n: u32, transport: TransportKind, env: &[(&str, &str)]) {
    let all: Vec<u32> = (0..n).collect();
    let ranks = common::spawn_some("child", scenario, &all, n, transport, env);
    let finished = ranks.finish(Duration::from_secs(240), Vec::new());
    common::assert_all_ok(&finished);
    for f in &finished {
        assert!(f.output.contains("passed"), "{}", f.output);
    }
}

#[test]
fn every_collective_passes_the_kit_with_buffers_in_the_shared_heap() {
    run("heap", 4);
}

/// Two emulated hosts: shared memory (and its heap) inside each, TCP
/// between them, in one group.
#[test]
fn every_collective_passes_the_kit_in_the_heap_of_a_group_on_two_hosts() {
    let hosts = [("FERROCOLL_TEST_HOSTS", "a,a,b,b")];
    run_on("heap-hosts", 4, TransportKind::Auto, &hosts);
}

/// One-shot calls publish through the segment inside a host and the
/// announcement across.
#[test]
fn small_calls_take_the_one_shot_protocol_on_two_hosts() {
    let hosts = [("FERROCOLL_TEST_HOSTS", "a,b,b,a")];
    run_on("one-shot", 4, TransportKind::Auto, &hosts);
}

#[test]
fn every_collective_passes_the_kit_on_private_buffers_beside_a_heap() {
    run("private", 3);
}

#[test]
fn small_calls_take_the_one_shot_protocol_across_processes() {
    run("one-shot", 4);
}

/// Over TCP the announcement of a one-shot call carries the input.
#[test]
fn small_calls_take_the_one_shot_protocol_over_tcp() {
    run_over("one-shot", 3, TransportKind::Tcp);
    run_over("one-shot", 4, TransportKind::Tcp);
}

#[test]
fn large_calls_on_heap_buffers_are_exact_in_place_and_not() {
    run("heap-large", 2);
    run("heap-large", 4);
}

#[test]
fn the_heap_plan_runs_exactly_when_every_rank_placed_its_buffers_in_the_heap() {
    run("heap-mixed", 3);
    run("heap-mixed", 2);
}

#[test]
fn gradient_buckets_go_in_the_heap_as_far_as_it_has_room() {
    run("buckets-in-heap", 3);
}

#[test]
fn a_group_without_a_heap_says_so() {
    run("no-heap", 2);
}
