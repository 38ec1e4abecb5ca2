//! `ferrocoll topo`, `sim` and `estimate` end to end.

mod common;

use common::Scratch;
use std::process::{Command, Output};

fn ferrocoll(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn fixture(path: &str) -> String {
    format!(
        "{}/crates/topo/tests/fixtures/{path}",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn topo_prints_the_smi_matrix_bandwidths_rings_and_bottlenecks() {
    let out = ferrocoll(&["topo", "--preset", "dgx-h100"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    let row0 = text.lines().find(|l| l.starts_with("GPU0 ")).unwrap();
    assert_eq!(row0.split_whitespace().nth(2), Some("NV18"), "{row0}");
    assert!(text.contains("Predicted unidirectional bandwidth matrix"));
    assert!(text.contains("Predicted latency matrix"));
    assert!(text.contains("# ring search: 1 ring(s)"), "{text}");
    assert!(text.contains("bottleneck GPU"), "{text}");
}

#[test]
fn topo_reads_smi_text_and_nccl_xml() {
    let out = ferrocoll(&["topo", "--smi", &fixture("smi/dgx1v.txt")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let row0 = text.lines().find(|l| l.starts_with("GPU0 ")).unwrap();
    let cells: Vec<&str> = row0.split_whitespace().collect();
    assert_eq!(
        &cells[1..9],
        ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
    );
    let out = ferrocoll(&["topo", "--nccl-xml", &fixture("nccl_xml/dgx_a100.xml")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("NV12"));
    let out = ferrocoll(&["topo", "--smi", &fixture("smi/bad_code.txt")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("nvidia-smi topo -m, line"),
        "{}",
        stderr(&out)
    );
    for broken in ["unclosed", "mismatched", "bad_attribute"] {
        let out = ferrocoll(&[
            "topo",
            "--nccl-xml",
            &fixture(&format!("nccl_xml/{broken}.xml")),
        ]);
        assert_eq!(out.status.code(), Some(2), "{broken}");
        let err = stderr(&out);
        assert!(
            err.contains("line") && !err.contains("panicked"),
            "{broken}: {err}"
        );
    }
}

#[test]
fn topo_json_loads_back_and_draws() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("seed.json");
    let out = ferrocoll(&["topo", "--preset", "seed-8gpu-mesh", "--json"]);
    assert!(out.status.success());
    std::fs::write(&json, &out.stdout).unwrap();
    let svg = dir.join("seed.svg");
    let out = ferrocoll(&[
        "topo",
        "--file",
        json.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    let out = ferrocoll(&["topo", "--file", json.to_str().unwrap(), "--dot"]);
    assert!(stdout(&out).starts_with("graph \"seed-8gpu-mesh\""));
    std::fs::write(
        &json,
        "{\"format\": \"ferrocoll-topology\", \"version\": 9}",
    )
    .unwrap();
    let out = ferrocoll(&["topo", "--file", json.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("version"), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn discovery_without_a_driver_is_a_clean_error() {
    let out = ferrocoll(&["topo", "--discover"]);
    if out.status.success() {
        // A machine with NVIDIA GPUs: the matrix must be there.
        assert!(stdout(&out).contains("GPU0"));
    } else {
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).contains("NVML"), "{}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"));
    }
}

/// Parse `sim --algo all` rows: (size, algorithm label, time, starred).
fn sim_rows(text: &str) -> Vec<(usize, String, f64, bool)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let starred = f.contains(&"*");
            let algo = f[5].to_owned();
            // time is the first number after the label (and the star).
            let t = f[6..].iter().find_map(|x| x.parse::<f64>().ok()).unwrap();
            (f[0].parse().unwrap(), algo, t, starred)
        })
        .collect()
}

#[test]
fn sim_all_stars_the_fastest_and_its_crossovers_agree() {
    for topo in ["dgx-h100", "pcie4-8gpu-2numa"] {
        let out = ferrocoll(&[
            "sim", "--topo", topo, "--algo", "all", "-b", "4K", "-e", "256M", "-f", "4",
        ]);
        let text = stdout(&out);
        assert!(out.status.success(), "{}", stderr(&out));
        let rows = sim_rows(&text);
        let mut sizes: Vec<usize> = rows.iter().map(|r| r.0).collect();
        sizes.dedup();
        let mut winners = Vec::new();
        for s in &sizes {
            let at: Vec<_> = rows.iter().filter(|r| r.0 == *s).collect();
            let fastest = at.iter().map(|r| r.2).fold(f64::INFINITY, f64::min);
            let starred: Vec<_> = at.iter().filter(|r| r.3).collect();
            assert_eq!(starred.len(), 1, "{topo} {s}: {text}");
            // The choice is the fastest up to the selector's tie margin.
            assert!(starred[0].2 <= fastest * 1.03 + 0.01, "{topo} {s}: {text}");
            winners.push(starred[0].1.clone());
        }
        // Every printed crossover is a change of the choice, and every
        // change is printed.
        let changes = winners.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(text.matches("# crossover:").count(), changes, "{text}");
        // Latency-bound at 4 KiB, bandwidth-bound at 256 MiB.
        assert_ne!(winners[0], "ring", "{topo}: {text}");
        assert!(
            text.lines()
                .any(|l| l.contains("268435456") && l.contains('*'))
        );
    }
}

#[test]
fn sim_runs_a_schedule_file_and_names_the_bottleneck() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/schedules/star_all_reduce_3.json"
    );
    let out = ferrocoll(&[
        "sim",
        "--topo",
        "pcie4-4gpu",
        "--ranks",
        "3",
        "--algo",
        path,
        "-b",
        "1M",
        "-e",
        "1M",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    // One channel gathering three inputs at the root: its block's loads
    // and stores, or a PCIe link, decide.
    assert!(
        text.contains("PCIe4 x16") || text.contains("channel 0 (its SM's loads and stores)"),
        "{text}"
    );
    let out = ferrocoll(&["sim", "--topo", "pcie4-4gpu", "--ranks", "9"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("devices"), "{}", stderr(&out));
}

#[test]
fn sim_marks_steady_rows_and_refuses_an_unknown_model() {
    let run = |model: &str| {
        let out = ferrocoll(&[
            "sim",
            "--topo",
            "dgx1-v100",
            "--algo",
            "ring",
            "-b",
            "1M",
            "-e",
            "1M",
            "--model",
            model,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        (sim_rows(&text)[0].2, text)
    };
    let (steady, text) = run("steady");
    assert!(
        text.contains(" ~ ") && text.contains("# ~ marks the steady-state estimate"),
        "{text}"
    );
    let (detailed, text) = run("detailed");
    assert!(!text.contains("# ~ marks"), "{text}");
    // A ring on the DGX-1V: every stream of a link is busy at once, so
    // the two models agree (docs/topology.md).
    assert!(
        (steady / detailed - 1.0).abs() < 0.03,
        "{steady} vs {detailed}"
    );
    let out = ferrocoll(&["sim", "--topo", "dgx1-v100", "--model", "exact"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("auto, detailed or steady"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn estimate_reproduces_the_seed_articles_arithmetic() {
    // 10 GB of gradients: PCIe 4.0 about 0.3 s, NVLink 3 about 0.03 s
    // (the seed's one-link arithmetic); the simulator adds the all-reduce's
    // 2(n-1)/n factor and the protocol efficiency, so it lands within a
    // small multiple of those, and the NVLink machine is ~10x faster.
    let time = |topo: &str| {
        let out = ferrocoll(&[
            "estimate",
            "--topo",
            topo,
            "--grad-bytes",
            "10GB",
            "--compute-ms",
            "100",
        ]);
        let text = stdout(&out);
        assert!(out.status.success(), "{}", stderr(&out));
        let line = text
            .lines()
            .find(|l| l.starts_with("sync time"))
            .unwrap()
            .to_owned();
        let ms: f64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert!(text.contains("communication"), "{text}");
        ms
    };
    let pcie = time("pcie4-8gpu-2numa");
    let nvlink = time("dgx-a100");
    assert!((300.0..1500.0).contains(&pcie), "{pcie} ms");
    assert!((30.0..150.0).contains(&nvlink), "{nvlink} ms");
    assert!(pcie / nvlink > 5.0, "{pcie} / {nvlink}");
}

#[test]
fn the_cuda_backends_without_a_gpu_are_a_clear_error() {
    for backend in ["cuda", "cuda-v2"] {
        let out = ferrocoll(&[
            "bench",
            "--backend",
            backend,
            "--ranks",
            "2",
            "--channels",
            "2",
            "-b",
            "1K",
            "-e",
            "1K",
        ]);
        if out.status.success() {
            // A machine with a GPU: the bench ran and checked its results.
            assert!(
                stdout(&out).contains("Out of bounds values : 0 OK"),
                "{}",
                stdout(&out)
            );
            assert!(stdout(&out).contains("channels 2"), "{}", stdout(&out));
            continue;
        }
        assert_eq!(out.status.code(), Some(2), "{backend}");
        let err = stderr(&out);
        assert!(err.contains("CUDA backend unavailable"), "{backend}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let out = ferrocoll(&["topo", "--preset", "dgx-h100", "--probe"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unavailable"), "{}", stderr(&out));
    // Channels past what a plan may use are refused by the parser.
    for bad in ["0", "65"] {
        let out = ferrocoll(&["bench", "--channels", bad]);
        assert_eq!(out.status.code(), Some(2), "--channels {bad}");
    }
    // The LL threshold belongs to the CUDA executor alone.
    let out = ferrocoll(&["bench", "--ll-max-bytes", "4K"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--backend cuda"), "{}", stderr(&out));
}

/// The throughput bound beside each algorithm, for the whole machine and
/// for the GPUs a scheduler might hand out (issue 18's DGX-1V figures).
#[test]
fn topo_and_sim_print_the_throughput_bound_of_the_members() {
    let out = ferrocoll(&["topo", "--preset", "dgx1-v100"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    let row = |text: &str, label: &str| -> Vec<String> {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("#   {label} ")))
            .unwrap_or_else(|| panic!("no `{label}` row: {text}"));
        line.split_whitespace()
            .rev()
            .take(4)
            .map(str::to_owned)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect()
    };
    // all-gather, reduce-scatter, all-reduce, any all-reduce.
    assert_eq!(
        row(&text, "NVLink only"),
        ["120.0", "120.0", "120.0", "210.0"]
    );
    assert!(text.contains("of the bound"), "{text}");
    let out = ferrocoll(&["topo", "--preset", "dgx1-v100", "--gpus", "0-5"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        row(&text, "NVLink only, members alone")[0],
        "60.0",
        "{text}"
    );
    assert_eq!(
        row(&text, "NVLink only, other devices relaying")[0],
        "120.0",
        "{text}"
    );
    assert!(text.contains("on 6 ranks"), "{text}");
    let out = ferrocoll(&[
        "sim",
        "--topo",
        "dgx1-v100",
        "--gpus",
        "0-5",
        "-b",
        "64M",
        "-e",
        "64M",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains("# best at 67108864 B:") && text.contains("of NVLink's"),
        "{text}"
    );
    for bad in ["0,9", "1,1", "x", "3-1"] {
        let out = ferrocoll(&["topo", "--preset", "dgx1-v100", "--gpus", bad]);
        assert!(!out.status.success(), "--gpus {bad}");
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }
}

/// `synth` packs the DGX-1V's six NVLink rings (the bound, where the
/// greedy search stopped at two), proves the schedule, writes it, and the
/// file then runs through `sim` and `verify`.
#[test]
fn synth_writes_a_proven_ring_packing_that_reaches_the_bound() {
    let dir = Scratch::new("synth");
    let file = dir.file("dgx1.json");
    let path = file.as_str();
    let out = ferrocoll(&["synth", "--topo", "dgx1-v100", "-o", path, "--size", "256M"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("rings: 6 packed, 120.0 GB/s"), "{text}");
    assert!(text.contains("of NVLink's"), "{text}");
    let out = ferrocoll(&["verify", "--algo", path]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let out = ferrocoll(&[
        "sim",
        "--topo",
        "dgx1-v100",
        "--algo",
        path,
        "-b",
        "64M",
        "-e",
        "64M",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("synth-rings-dgx1-v100x6"),
        "{}",
        stdout(&out)
    );
    let out = ferrocoll(&[
        "synth",
        "--topo",
        "dgx1-v100",
        "--op",
        "all-to-all",
        "-o",
        path,
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("rings cannot run"),
        "{}",
        stderr(&out)
    );
}

/// On GPUs 0-4 of a DGX-1V no NVLink ring exists: `synth` writes its
/// tree packing, which the simulator puts near the NVLink bound where the
/// rings stay at 0.6 of it, and the file runs through `verify` and `sim`.
#[test]
fn synth_writes_trees_where_no_nvlink_ring_exists() {
    let dir = Scratch::new("synth-trees");
    let file = dir.file("trees.json");
    let path = file.as_str();
    let out = ferrocoll(&[
        "synth",
        "--topo",
        "dgx1-v100",
        "--gpus",
        "0-4",
        "-o",
        path,
        "--size",
        "256M",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("# wrote synth-trees-"), "{text}");
    let out = ferrocoll(&["verify", "--algo", path]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let out = ferrocoll(&[
        "sim",
        "--topo",
        "dgx1-v100",
        "--gpus",
        "0-4",
        "--algo",
        path,
        "-b",
        "16M",
        "-e",
        "16M",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("synth-trees-"), "{}", stdout(&out));
    let out = ferrocoll(&[
        "synth",
        "--topo",
        "dgx1-v100",
        "--op",
        "broadcast",
        "--kind",
        "trees",
        "-o",
        path,
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no tree packing"), "{}", stderr(&out));
}

/// Across two machines `synth --kind hierarchical` writes the
/// hierarchical all-reduce, which runs on the CPU executor; on one machine,
/// or for another collective, it says why not.
#[test]
fn synth_writes_the_hierarchical_all_reduce_across_machines() {
    let dir = Scratch::new("synth-hier");
    let file = dir.file("hier.json");
    let path = file.as_str();
    let synth = |topo: &str, gpus: &str, op: &str| {
        ferrocoll(&[
            "synth",
            "--topo",
            topo,
            "--gpus",
            gpus,
            "--op",
            op,
            "--kind",
            "hierarchical",
            "-o",
            path,
            "--size",
            "64M",
        ])
    };
    let out = synth("dgx-a100x2", "0,1,8,9", "all-reduce");
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("hierarchical: 2 machines of 2"), "{text}");
    assert!(text.contains("# wrote synth-hierarchical-"), "{text}");
    let out = ferrocoll(&[
        "bench", "--algo", path, "--ranks", "4", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2",
        "-w", "1",
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("Out of bounds values : 0 OK"),
        "{}",
        stdout(&out)
    );
    let zero = ferrocoll(&[
        "synth",
        "--topo",
        "dgx-a100x2",
        "--kind",
        "hierarchical",
        "--size",
        "0",
        "-o",
        path,
    ]);
    assert!(!zero.status.success());
    assert!(stderr(&zero).contains("--size"), "{}", stderr(&zero));
    for (topo, gpus, op) in [
        ("dgx-a100", "0-3", "all-reduce"),
        ("dgx-a100x2", "0,1,8", "all-reduce"),
        ("dgx-a100x2", "0,1,8,9", "all-gather"),
    ] {
        let out = synth(topo, gpus, op);
        assert!(!out.status.success(), "{topo} {gpus} {op}");
        assert!(stderr(&out).contains("no hierarchical"), "{}", stderr(&out));
    }
}
