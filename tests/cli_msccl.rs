//! MSCCL XML through the binary: MSCCLang programs proven and run, our
//! schedules written out and read back, and a broken program's violation
//! named by gpu, threadblock and step.

mod common;

use common::Scratch;
use std::process::{Command, Output};

fn ferrocoll(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn fixture(name: &str) -> String {
    format!(
        "{}/crates/core/tests/fixtures/msccl/{name}.xml",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// Every row checked, none wrong.
fn checked_clean(out: &Output) {
    let t = text(out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
}

#[test]
fn msccl_tools_programs_run_on_the_bench_with_no_wrong_value() {
    for (name, ranks) in [
        ("allreduce_a100_ring_4_1_1_Simple", "4"),
        ("hierarchical_allreduce_2_2_1", "4"),
        ("allreduce_recursive_doubling_halving_4_1", "4"),
        ("allgather_ring_8_1_1", "8"),
        ("alltoall_allpairs_8_1", "8"),
    ] {
        let file = fixture(name);
        let out = ferrocoll(&[
            "bench", "--algo", &file, "--ranks", ranks, "-b", "1K", "-e", "1M", "-f", "32", "-c",
            "1", "-n", "2", "-w", "1",
        ]);
        checked_clean(&out);
    }
}

#[test]
fn a_broken_program_is_named_by_gpu_threadblock_and_step() {
    let dir = Scratch::new("msccl-broken");
    let good = std::fs::read_to_string(fixture("allreduce_a100_ring_4_1_1_Simple")).unwrap();
    // GPU 1's rrcs reduces the chunk it should not.
    let line = good
        .lines()
        .enumerate()
        .skip_while(|(_, l)| !l.contains("gpu id=\"1\""))
        .find(|(_, l)| l.contains("type=\"rrcs\""))
        .map(|(i, _)| i)
        .unwrap();
    let broken: Vec<String> = good
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == line {
                l.replace("srcoff=\"2\"", "srcoff=\"3\"")
            } else {
                l.to_owned()
            }
        })
        .collect();
    let path = dir.file("broken.xml");
    std::fs::write(&path, broken.join("\n")).unwrap();
    let out = ferrocoll(&["verify", "--algo", &path]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains(&format!("from gpu 1 tb 0 step 3 (line {})", line + 1)),
        "{t}"
    );
    let out = ferrocoll(&[
        "bench", "--algo", &path, "--ranks", "4", "-b", "1K", "-e", "1K",
    ]);
    assert!(!out.status.success(), "{}", text(&out));

    let out = ferrocoll(&["verify", "--algo", &fixture("allreduce_a100_allpairs_4_1")]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("step type `re` (local reduce) is not supported"),
        "{t}"
    );
}

#[test]
fn our_schedules_go_out_as_msccl_xml_and_come_back_proven() {
    let dir = Scratch::new("msccl-out");
    let out = ferrocoll(&[
        "schedule",
        "--algo",
        "ring",
        "--op",
        "reduce-scatter",
        "--ranks",
        "5",
        "--channels",
        "2",
        "--msccl-xml",
    ]);
    let xml = text(&out);
    assert!(out.status.success(), "{xml}");
    for attr in [
        "name=",
        "proto=",
        "nchannels=\"2\"",
        "nchunksperloop=",
        "ngpus=\"5\"",
        "coll=\"reduce_scatter\"",
        "inplace=\"0\"",
        "i_chunks=",
        "o_chunks=",
        "s_chunks=",
        "send=",
        "recv=",
        "chan=",
        "srcbuf=",
        "srcoff=",
        "dstbuf=",
        "dstoff=",
        "cnt=",
        "depid=",
        "deps=",
        "hasdep=",
    ] {
        assert!(xml.contains(attr), "{attr} missing:\n{xml}");
    }
    let path = dir.file("rs.xml");
    std::fs::write(&path, &xml).unwrap();
    let out = ferrocoll(&["verify", "--algo", &path]);
    assert!(out.status.success(), "{}", text(&out));
    let out = ferrocoll(&[
        "bench", "--algo", &path, "--ranks", "5", "-b", "1K", "-e", "64K", "-c", "1", "-n", "1",
        "-w", "0",
    ]);
    checked_clean(&out);

    let out = ferrocoll(&[
        "schedule",
        "--algo",
        "tree",
        "--op",
        "all-reduce",
        "--ranks",
        "4",
        "--msccl-xml",
    ]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("cannot write MSCCL XML: rank"), "{t}");
}

/// `synth -o F.xml` writes the DGX-1V ring packing and a tree packing as
/// MSCCL XML, which read back proven and run.
#[test]
fn synth_writes_msccl_xml() {
    let dir = Scratch::new("msccl-synth");
    let path = dir.file("dgx1.xml");
    let out = ferrocoll(&[
        "synth",
        "--topo",
        "dgx1-v100",
        "-o",
        &path,
        "--size",
        "256M",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let xml = std::fs::read_to_string(&path).unwrap();
    assert!(xml.starts_with("<algo "), "{xml}");
    let out = ferrocoll(&["verify", "--algo", &path]);
    assert!(out.status.success(), "{}", text(&out));
    let out = ferrocoll(&[
        "bench", "--algo", &path, "--ranks", "8", "-b", "4K", "-e", "64K", "-c", "1", "-n", "1",
        "-w", "0",
    ]);
    checked_clean(&out);
    // Trees reduce from two children in one step: parts, one peer each.
    let trees = dir.file("trees.xml");
    let out = ferrocoll(&[
        "synth",
        "--topo",
        "dgx1-v100",
        "--gpus",
        "0,1,2,4",
        "--kind",
        "trees",
        "-o",
        &trees,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = ferrocoll(&["verify", "--algo", &trees]);
    assert!(out.status.success(), "{}", text(&out));
    let out = ferrocoll(&[
        "bench", "--algo", &trees, "--ranks", "4", "-b", "1K", "-e", "64K", "-c", "1", "-n", "1",
        "-w", "0",
    ]);
    checked_clean(&out);
}
