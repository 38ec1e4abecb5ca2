use std::sync::Arc;

use super::*;
use crate::algorithms::{AlgorithmParams, applicable, generate};
use crate::conformance::{SplitMix64, check_schedule_on_threads};
use crate::types::{Collective, CollectiveKind, DataType, ReduceOp};
use crate::verify::{VerifyOptions, verify};

/// MSCCLang programs of msccl-tools, as its examples print them (see
/// the fixtures' README for the commands).
const PROGRAMS: [(&str, &str); 7] = [
    (
        "allgather_ring_8_1_1",
        include_str!("../../../tests/fixtures/msccl/allgather_ring_8_1_1.xml"),
    ),
    (
        "allreduce_a100_allpairs_4_1",
        include_str!("../../../tests/fixtures/msccl/allreduce_a100_allpairs_4_1.xml"),
    ),
    (
        "allreduce_a100_ring_4_1_1_Simple",
        include_str!("../../../tests/fixtures/msccl/allreduce_a100_ring_4_1_1_Simple.xml"),
    ),
    (
        "allreduce_a100_ring_8_2_2_LL128",
        include_str!("../../../tests/fixtures/msccl/allreduce_a100_ring_8_2_2_LL128.xml"),
    ),
    (
        "allreduce_recursive_doubling_halving_4_1",
        include_str!("../../../tests/fixtures/msccl/allreduce_recursive_doubling_halving_4_1.xml"),
    ),
    (
        "alltoall_allpairs_8_1",
        include_str!("../../../tests/fixtures/msccl/alltoall_allpairs_8_1.xml"),
    ),
    (
        "hierarchical_allreduce_2_2_1",
        include_str!("../../../tests/fixtures/msccl/hierarchical_allreduce_2_2_1.xml"),
    ),
];

fn kinds() -> Vec<(DataType, ReduceOp)> {
    vec![
        (DataType::F32, ReduceOp::Sum),
        (DataType::I32, ReduceOp::Max),
        (DataType::U8, ReduceOp::Sum),
    ]
}

#[test]
fn msccl_tools_programs_are_proven_and_run_or_refused_by_name() {
    let mut rng = SplitMix64(41);
    for (name, text) in PROGRAMS {
        let imported = import(text);
        if name.contains("allpairs") && name.starts_with("allreduce") {
            let err = imported.unwrap_err();
            assert!(
                matches!(&err, MscclError::Unsupported { construct, .. } if construct.contains("`re`")),
                "{name}: {err}"
            );
            assert!(
                err.to_string().contains("gpu 0 tb 0 step 2"),
                "{name}: {err}"
            );
            continue;
        }
        let schedule = imported.unwrap_or_else(|e| panic!("{name}: {e}")).schedule;
        let verified =
            verify(schedule, &VerifyOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_schedule_on_threads(Arc::new(verified), &kinds(), &mut rng)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn an_in_place_program_gets_a_copy_into_place_that_every_channel_waits_for() {
    let imported = import(PROGRAMS[2].1).unwrap();
    let s = &imported.schedule;
    assert_eq!(
        (s.collective, s.world_size, s.chunks_per_block),
        (Collective::AllReduce, 4, 4)
    );
    for program in &s.ranks {
        assert_eq!(
            program.channels.len(),
            2,
            "one threadblock and the prologue"
        );
        let first = &program.channels[0][0];
        assert_eq!(
            first.after,
            vec![crate::schedule::StepRef {
                channel: 1,
                step: 0
            }]
        );
        assert_eq!(
            program.channels[1][0],
            Step::new(4).read(Buffer::Input, 0).write(Buffer::Output, 0)
        );
    }
    assert!(
        imported
            .origin
            .describe(0, 1, 0)
            .unwrap()
            .contains("copy into place")
    );
    assert_eq!(
        imported.origin.describe(2, 0, 3).unwrap(),
        "gpu 2 tb 0 step 3 (line 29)"
    );
}

use crate::schedule::Step;
use crate::types::Buffer;

fn sorted_afters(mut s: Schedule) -> Schedule {
    for p in &mut s.ranks {
        for c in &mut p.channels {
            for step in c {
                step.after.sort();
                step.after.dedup();
            }
        }
    }
    s
}

/// Built-in → XML → import: the same schedule where every channel is one
/// threadblock, a proven one computing the same where channels split.
#[test]
fn built_in_schedules_round_trip_through_msccl_xml() {
    let supported = [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllToAll,
    ];
    let mut rng = SplitMix64(7);
    let (mut exact, mut split, mut refused, mut scratch_shared) = (0, 0, Vec::new(), Vec::new());
    for (algorithm, kind) in applicable() {
        if !supported.contains(&kind) {
            continue;
        }
        for n in [1, 2, 3, 4, 5, 8, 13, 16] {
            for channels in [1, 2] {
                let params = AlgorithmParams {
                    channels,
                    ..AlgorithmParams::default()
                };
                let Ok(original) = generate(algorithm, kind.with_root(0), n, &params) else {
                    continue;
                };
                let xml = match original.to_msccl_xml() {
                    Ok(xml) => xml,
                    Err(e) => {
                        assert!(matches!(e, MscclError::Inexpressible { .. }), "{e}");
                        assert_ne!(algorithm, crate::Algorithm::Ring, "{kind:?} n={n}: {e}");
                        refused.push(format!("{algorithm:?} {kind:?} n={n}"));
                        continue;
                    }
                };
                let back = Schedule::from_msccl_xml(&xml)
                    .unwrap_or_else(|e| panic!("{algorithm:?} {kind:?} n={n}: {e}\n{xml}"));
                let tbs = xml.matches("<tb ").count();
                let channels_total: usize = original.ranks.iter().map(|p| p.channels.len()).sum();
                if tbs == channels_total {
                    assert_eq!(
                        sorted_afters(back),
                        sorted_afters(original),
                        "{algorithm:?} {kind:?} n={n} c={channels}"
                    );
                    exact += 1;
                } else {
                    // Threadblocks come back as channels; a scratch chunk
                    // two of them share is refused by the verifier's
                    // one-channel-per-scratch-chunk rule, nothing else.
                    let verified = match verify(back, &VerifyOptions::default()) {
                        Ok(v) => v,
                        Err(e) => {
                            let scratch_only = e
                                .violations
                                .iter()
                                .all(|v| v.to_string().contains("scratch chunks also used"));
                            assert!(scratch_only, "{algorithm:?} {kind:?} n={n}: {e}");
                            scratch_shared
                                .push(format!("{algorithm:?} {kind:?} n={n} c={channels}"));
                            continue;
                        }
                    };
                    if n <= 5 {
                        check_schedule_on_threads(Arc::new(verified), &kinds()[..1], &mut rng)
                            .unwrap();
                    }
                    split += 1;
                }
            }
        }
    }
    assert!(exact >= 4 * 8, "exact round trips: {exact}");
    eprintln!(
        "round trips: {exact} exact, {split} split by peer and proven again, \
         {} split with shared scratch: {scratch_shared:?}; refused: {refused:?}",
        scratch_shared.len()
    );
}

fn err(text: &str) -> String {
    import(text).unwrap_err().to_string()
}

const HEAD: &str = r#"<algo name="t" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" inplace="0">"#;

fn two(tb0: &str, tb1: &str) -> String {
    format!(
        "{HEAD}\n<gpu id=\"0\" i_chunks=\"2\" o_chunks=\"2\" s_chunks=\"0\">{tb0}</gpu>\n<gpu id=\"1\" i_chunks=\"2\" o_chunks=\"2\" s_chunks=\"0\">{tb1}</gpu>\n</algo>"
    )
}

const STEP: &str =
    r#"srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0""#;

#[test]
fn malformed_documents_are_typed_errors_that_say_where() {
    let cases: Vec<(String, &str)> = vec![
        ("<algo".into(), "malformed XML"),
        ("<system/>".into(), "not MSCCL's `<algo>`"),
        (
            two(
                &tb(1, -1, &format!(r#"<step s="0" type="x" {STEP}/>"#)),
                &tb(-1, 0, ""),
            ),
            "not an MSCCL step type",
        ),
        (
            two(
                &tb(1, -1, &format!(r#"<step s="0" type="r" {STEP}/>"#)),
                &tb(-1, 0, ""),
            ),
            "receives from no one",
        ),
        (
            two(
                &tb(1, -1, &format!(r#"<step s="1" type="s" {STEP}/>"#)),
                &tb(-1, 0, ""),
            ),
            "numbered in order",
        ),
        (two(&tb(0, -1, ""), &tb(-1, 0, "")), "names the GPU itself"),
        (
            two(&tb(7, -1, ""), &tb(-1, 0, "")),
            "not -1 or a GPU below 2",
        ),
        (
            two(&tb(1, -1, ""), &tb(-1, -1, "")),
            "no threadblock receives from GPU 0",
        ),
        (
            two(&tb(-1, 1, ""), &tb(-1, -1, "")),
            "no threadblock sends to GPU 0",
        ),
        (
            two(
                &tb(
                    1,
                    -1,
                    r#"<step s="0" type="s" srcbuf="q" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>"#,
                ),
                &tb(-1, 0, ""),
            ),
            "not `i`, `o` or `s`",
        ),
        (
            two(
                &tb(
                    1,
                    -1,
                    r#"<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="3" deps="0" hasdep="0"/>"#,
                ),
                &tb(-1, 0, ""),
            ),
            "threadblock 3 step 0, which does not exist",
        ),
        (
            two(
                &tb(
                    1,
                    -1,
                    r#"<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="0" deps="0" hasdep="0"/>"#,
                ),
                &tb(-1, 0, ""),
            ),
            "depends on itself",
        ),
        (
            two(
                &tb(
                    1,
                    -1,
                    r#"<step s="0" type="s" srcbuf="i" srcoff="-4" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>"#,
                ),
                &tb(-1, 0, ""),
            ),
            "attribute `srcoff`",
        ),
        (
            two(
                &tb(
                    1,
                    -1,
                    r#"<step s="0" type="s" srcbuf="i" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>"#,
                ),
                &tb(-1, 0, ""),
            ),
            "`srcoff` is missing",
        ),
    ];
    expect(cases);
}

fn expect(cases: Vec<(String, &str)>) {
    for (text, want) in cases {
        let got = err(&text);
        assert!(got.contains(want), "want `{want}` in: {got}\n{text}");
    }
}

fn tb(send: i32, recv: i32, steps: &str) -> String {
    format!(r#"<tb id="0" send="{send}" recv="{recv}" chan="0">{steps}</tb>"#)
}

#[test]
fn unsupported_and_contradicting_documents_are_typed_errors() {
    let cases: Vec<(String, &str)> = vec![
        (
            two(&tb(1, -1, ""), &tb(-1, 0, "")).replace("coll=\"allreduce\"", "coll=\"broadcast\""),
            "coll=\"broadcast\" is not supported",
        ),
        (
            two(&tb(1, -1, ""), &tb(-1, 0, ""))
                .replace("coll=\"allreduce\"", "coll=\"reduce_scatter\"")
                .replace("inplace=\"0\"", "inplace=\"1\""),
            "inplace=\"1\" for coll=\"reduce_scatter\"",
        ),
        (
            two(&tb(1, -1, ""), &tb(-1, 0, "")).replace("ngpus=\"2\"", "ngpus=\"4000000000\""),
            "`ngpus` is 4000000000 with 2",
        ),
        (
            two(&tb(1, -1, ""), &tb(-1, 0, "")).replace("<gpu id=\"1\"", "<gpu id=\"0\""),
            "GPU 0 appears twice",
        ),
        (
            two(&tb(1, -1, ""), &tb(-1, 0, "")).replace(
                "i_chunks=\"2\" o_chunks=\"2\"",
                "i_chunks=\"0\" o_chunks=\"0\"",
            ),
            "no buffer",
        ),
        (
            two(
                &format!(
                    "{}{}",
                    tb(1, -1, ""),
                    tb(1, -1, "").replace("id=\"0\"", "id=\"1\"")
                ),
                &tb(-1, 0, ""),
            ),
            "both send to GPU 1 on channel 0",
        ),
    ];
    expect(cases);
}

/// Cut, flipped and rewritten documents: an error or a schedule, never a
/// panic or a runaway allocation.
#[test]
fn mangled_programs_never_panic() {
    let mut rng = SplitMix64(3);
    let values = [
        "-1",
        "0",
        "4294967295",
        "4294967296",
        "-9",
        "x",
        "",
        "99999999999",
    ];
    for (_, text) in PROGRAMS {
        for _ in 0..150 {
            let mut t = text.to_owned();
            match rng.next_u64() % 3 {
                0 => t.truncate((rng.next_u64() as usize) % t.len()),
                1 => {
                    let quotes: Vec<usize> = t.match_indices("=\"").map(|(i, _)| i + 2).collect();
                    let at = quotes[(rng.next_u64() as usize) % quotes.len()];
                    let end = at + t[at..].find('"').unwrap();
                    let v = values[(rng.next_u64() as usize) % values.len()];
                    t.replace_range(at..end, v);
                }
                _ => {
                    let lines: Vec<&str> = t.lines().collect();
                    let drop = (rng.next_u64() as usize) % lines.len();
                    t = lines
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| *i != drop)
                        .map(|(_, l)| *l)
                        .collect::<Vec<_>>()
                        .join("\n");
                }
            }
            if let Ok(i) = import(&t) {
                let _ = verify(i.schedule, &VerifyOptions::default());
            }
        }
    }
}

#[test]
fn schedules_msccl_cannot_express_are_refused_with_the_step() {
    let tree = generate(
        crate::Algorithm::Tree,
        Collective::AllReduce,
        4,
        &AlgorithmParams::default(),
    )
    .unwrap();
    let e = tree.to_msccl_xml().unwrap_err();
    assert!(matches!(e, MscclError::Inexpressible { .. }), "{e}");
    assert!(e.to_string().contains("rank "), "{e}");
    let bcast = generate(
        crate::Algorithm::Ring,
        Collective::Broadcast { root: 0 },
        4,
        &AlgorithmParams::default(),
    )
    .unwrap();
    assert!(
        bcast
            .to_msccl_xml()
            .unwrap_err()
            .to_string()
            .contains("no root")
    );
}

/// A chain of 200 000 nops, each waiting on the one before: resolved
/// without recursion, so without overflowing the stack.
#[test]
fn a_deep_chain_of_nops_resolves() {
    let n = 200_000;
    let mut tb0 = String::from(r#"<tb id="0" send="1" recv="-1" chan="0">"#);
    tb0.push_str(&format!(
        r#"<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="2" depid="1" deps="{}" hasdep="0"/>"#,
        n - 1
    ));
    tb0.push_str("</tb>");
    let mut tb1 = String::from(r#"<tb id="1" send="-1" recv="-1" chan="0">"#);
    for s in 0..n {
        let dep = if s == 0 { (-1, -1) } else { (1, s - 1) };
        tb1.push_str(&format!(
            r#"<step s="{s}" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="{}" deps="{}" hasdep="0"/>"#,
            dep.0, dep.1
        ));
    }
    tb1.push_str("</tb>");
    let rx = tb(
        -1,
        0,
        r#"<step s="0" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="2" depid="-1" deps="-1" hasdep="0"/>"#,
    );
    let text = two(&format!("{tb0}{tb1}"), &rx);
    let imported = import(&text).unwrap();
    assert_eq!(imported.schedule.ranks[0].channels[0][0].after, vec![]);
}

/// Hostile shapes a reviewer found, each once quadratic or a panic.
#[test]
fn hostile_shapes_stay_linear_and_typed() {
    // One GPU with many empty threadblocks and many bare GPUs, in place:
    // each rank's prologue sits after its own channels only.
    let (gpus, tbs) = (1000, 1000);
    let mut text = format!(
        r#"<algo name="t" nchannels="1" nchunksperloop="1" ngpus="{gpus}" coll="allreduce" inplace="1"><gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0">"#
    );
    for t in 0..tbs {
        text.push_str(&format!(r#"<tb id="{t}" send="-1" recv="-1" chan="0"/>"#));
    }
    text.push_str("</gpu>");
    for g in 1..gpus {
        text.push_str(&format!(
            r#"<gpu id="{g}" i_chunks="1" o_chunks="1" s_chunks="0"/>"#
        ));
    }
    text.push_str("</algo>");
    let s = import(&text).unwrap().schedule;
    assert_eq!(s.ranks[0].channels.len(), tbs + 1);
    assert_eq!(s.ranks[1].channels.len(), 1);

    // Ids that disagree force the joined numbering; a GPU's channels stay
    // as many as its threadblocks, not its position among the GPUs.
    let mut text = String::from(
        r#"<algo name="t" ngpus="1000" coll="allreduce" inplace="0"><gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0"><tb id="0" send="1" recv="-1" chan="0"/></gpu><gpu id="1" i_chunks="1" o_chunks="1" s_chunks="0"><tb id="0" send="-1" recv="-1" chan="0"/><tb id="1" send="-1" recv="0" chan="0"/></gpu>"#,
    );
    for g in 2..1000 {
        text.push_str(&format!(
            r#"<gpu id="{g}" i_chunks="1" o_chunks="1" s_chunks="0"><tb id="0" send="-1" recv="-1" chan="0"/></gpu>"#
        ));
    }
    text.push_str("</algo>");
    let s = import(&text).unwrap().schedule;
    assert_eq!(s.ranks[999].channels.len(), 1);
    assert_eq!(s.ranks[1].channels.len(), 2);

    // Offsets past u32 in an in-place all-gather: refused by the
    // verifier, never an overflow.
    let text = r#"<algo name="t" ngpus="3" coll="allgather" inplace="1">
        <gpu id="0" i_chunks="4294967295" o_chunks="0" s_chunks="0"/>
        <gpu id="1" i_chunks="4294967295" o_chunks="0" s_chunks="0"/>
        <gpu id="2" i_chunks="4294967295" o_chunks="0" s_chunks="0"/></algo>"#;
    let s = import(text).unwrap().schedule;
    assert!(verify(s, &VerifyOptions::default()).is_err());

    // Every send waiting on the end of one long run of nops: the walk is
    // budgeted, so it ends in a typed error, not minutes of work.
    let n = 20_000;
    let mut tb0 = String::from(r#"<tb id="0" send="1" recv="-1" chan="0">"#);
    for s in 0..n {
        tb0.push_str(&format!(
            r#"<step s="{s}" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="1" deps="{}" hasdep="0"/>"#,
            n - 1
        ));
    }
    tb0.push_str("</tb>");
    let mut tb1 = String::from(r#"<tb id="1" send="-1" recv="-1" chan="0">"#);
    for s in 0..n {
        tb1.push_str(&format!(
            r#"<step s="{s}" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="-1" deps="-1" hasdep="0"/>"#
        ));
    }
    tb1.push_str("</tb>");
    let e = err(&two(&format!("{tb0}{tb1}"), &tb(-1, 0, "")));
    assert!(e.contains("chains of nops"), "{e}");

    // A copy that writes over what the next send reads stays two steps.
    let steps = r#"<step s="0" type="cpy" srcbuf="o" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/><step s="1" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>"#;
    let s = import(&two(&tb(1, -1, steps), &tb(-1, 0, "")))
        .unwrap()
        .schedule;
    assert_eq!(s.ranks[0].channels[0].len(), 1, "disjoint: one step");
    let overlapping = steps
        .replace(r#"dstoff="1" cnt="1""#, r#"dstoff="1" cnt="2""#)
        .replace(
            r#"srcoff="0" dstbuf="o" dstoff="0" cnt="1""#,
            r#"srcoff="0" dstbuf="o" dstoff="0" cnt="2""#,
        );
    let s = import(&two(&tb(1, -1, &overlapping), &tb(-1, 0, "")))
        .unwrap()
        .schedule;
    assert_eq!(s.ranks[0].channels[0].len(), 2, "overlapping: two steps");
}

/// A million attributes on one element parse in linear time.
#[test]
fn many_attributes_are_checked_for_duplicates_in_linear_time() {
    let attrs: String = (0..200_000).map(|i| format!(" a{i}=\"\"")).collect();
    let root = crate::xml::parse_document(&format!("<algo{attrs}/>")).unwrap();
    assert_eq!(root.attrs.len(), 200_000);
    let dup = crate::xml::parse_document("<algo a=\"1\" b=\"2\" a=\"3\"/>").unwrap_err();
    assert!(dup.to_string().contains("appears twice"), "{dup}");
}

/// Rank 0 sends on one step and receives on the next, rank 1 does both in
/// one: rank 0's channel stays one threadblock, so the file reads back.
#[test]
fn a_channel_with_one_peer_each_way_stays_one_threadblock() {
    let mut s = generate(
        crate::Algorithm::Ring,
        Collective::AllReduce,
        2,
        &AlgorithmParams::default(),
    )
    .unwrap();
    s.ranks[0].channels[0] = vec![
        Step::new(s.chunks_per_block).read(Buffer::Input, 0).send(1),
        Step::new(s.chunks_per_block)
            .recv(1)
            .write(Buffer::Output, 0),
    ];
    s.ranks[1].channels[0] = vec![
        Step::new(s.chunks_per_block)
            .recv(0)
            .read(Buffer::Input, 0)
            .write(Buffer::Output, 0)
            .send(0),
    ];
    let verified = verify(s.clone(), &VerifyOptions::default()).unwrap();
    let xml = verified.schedule().to_msccl_xml().unwrap();
    assert_eq!(xml.matches("<tb ").count(), 2, "{xml}");
    assert_eq!(
        sorted_afters(Schedule::from_msccl_xml(&xml).unwrap()),
        sorted_afters(s)
    );

    // Not verified: an `after` past the end is refused, not indexed.
    let mut bad = verified.schedule().clone();
    bad.ranks[0].channels[0][1]
        .after
        .push(crate::schedule::StepRef {
            channel: 5,
            step: 0,
        });
    let e = bad.to_msccl_xml().unwrap_err();
    assert!(e.to_string().contains("export a verified schedule"), "{e}");
}
