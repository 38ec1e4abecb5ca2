//! What the CLI writes for other tools and people to read: `bench -J`
//! and `--csv`, one spelling per flag, and the timeline of example 05.

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

/// `-J` (nccl-tests' flag) records what a later comparison needs, with
/// the job secret masked; the CSV quotes a schedule name holding a comma
/// (`star: reduce at rank 0, then broadcast`), so every record has the
/// header's column count.
#[test]
fn bench_json_records_the_run_and_csv_quotes_names_with_commas() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-interop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, csv) = (dir.join("r.json"), dir.join("r.csv"));
    let schedule = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/schedules/star_all_reduce_3.json"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args([
            "bench", "--ranks", "3", "--algo", schedule, "-b", "1K", "-e", "4K",
        ])
        .args(["-n", "2", "-w", "0", "-J", json.to_str().unwrap()])
        .args(["--csv", csv.to_str().unwrap()])
        .env("FERROCOLL_JOB_SECRET", "hunter2-hunter2-hunter2")
        .env("FERROCOLL_TRACE_BUFFER", "10")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&json).unwrap();
    assert!(!text.contains("hunter2"), "the secret leaked: {text}");
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(report["version"], 2);
    assert!(report["argv"][1] == "bench", "{report}");
    assert_eq!(report["environment"]["FERROCOLL_JOB_SECRET"], "<set>");
    assert_eq!(report["environment"]["FERROCOLL_TRACE_BUFFER"], "10");
    assert_eq!(report["versions"]["ferrocoll"], env!("CARGO_PKG_VERSION"));
    for key in ["name", "os", "cpu", "memory"] {
        assert!(report["host"][key].is_string(), "host.{key}: {report}");
    }
    let (start, end) = (&report["started_unix_s"], &report["ended_unix_s"]);
    assert!(start.as_f64().unwrap() <= end.as_f64().unwrap(), "{report}");
    assert!(
        report["rows"][0]["algorithm"]
            .as_str()
            .unwrap()
            .contains(", then")
    );
    let mut reader = csv::Reader::from_path(&csv).unwrap();
    let columns = reader.headers().unwrap().len();
    assert!(columns >= 25, "{columns} columns");
    let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), 3, "1K, 2K and 4K");
    for r in &records {
        assert_eq!(r.len(), columns, "{r:?}");
        assert!(r[1].contains("reduce at rank 0, then broadcast"), "{r:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// One spelling per flag across subcommands, the old ones hidden but
/// still accepted.
#[test]
fn one_spelling_per_flag_and_the_old_ones_still_work() {
    let help = |cmd: &str| stdout(&ferrocoll(&[cmd, "--help"]));
    let bench = help("bench");
    assert!(
        bench.contains("--warmup-iters") && !bench.contains("--warmup_iters"),
        "{bench}"
    );
    for cmd in ["bench", "sim", "plan"] {
        let h = help(cmd);
        assert!(
            h.contains("--datatype") && !h.contains("--dtype"),
            "{cmd}: {h}"
        );
    }
    assert!(!help("synth").contains("-o,"), "synth's -o is hidden");
    let old = ferrocoll(&[
        "bench",
        "--ranks",
        "2",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1",
        "--warmup_iters",
        "0",
        "--dtype",
        "double",
    ]);
    assert!(
        old.status.success(),
        "{}",
        String::from_utf8_lossy(&old.stderr)
    );
    assert!(stdout(&old).contains("double"));
    let sim = ferrocoll(&[
        "sim", "--topo", "dgx-a100", "--dtype", "half", "-b", "1M", "-e", "1M",
    ]);
    assert!(
        sim.status.success(),
        "{}",
        String::from_utf8_lossy(&sim.stderr)
    );
}

/// `FERROCOLL_TIMELINE` on example 05 (gradient sync overlapped with
/// backward, 2 ranks on threads): a Chrome trace with every rank's
/// collective calls and every gradient bucket, each call nested in its
/// bucket on the progress thread, which Perfetto opens.
#[test]
fn example_05s_timeline_has_each_ranks_calls_and_buckets() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ferrocoll"));
    let example = bin
        .with_file_name("examples")
        .join("05_overlap_gradient_sync");
    assert!(
        example.exists(),
        "{} is missing: `cargo test` builds the examples (run it without --test)",
        example.display()
    );
    let trace =
        std::env::temp_dir().join(format!("ferrocoll-timeline-{}.json", std::process::id()));
    let out = Command::new(&example)
        .arg("2")
        .env("FERROCOLL_EXAMPLE_STEPS", "2")
        .env("FERROCOLL_TIMELINE", &trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let spans = |name: &str, rank: &str| -> Vec<&serde_json::Value> {
        events
            .iter()
            .filter(|e| e["name"] == name && e["ph"] == "B" && e["args"]["rank"] == rank)
            .collect()
    };
    for rank in ["0", "1"] {
        let buckets = spans("bucket", rank);
        let indexes: std::collections::BTreeSet<&str> = buckets
            .iter()
            .filter_map(|e| e["args"]["index"].as_str())
            .collect();
        assert_eq!(indexes.len(), 16, "rank {rank}: {indexes:?}");
        let calls = spans("collective", rank);
        assert!(calls.len() >= 16, "rank {rank}: {} calls", calls.len());
        assert!(calls.iter().all(|e| e["ts"].as_f64().is_some()));
    }
    // A bucket's all-reduce runs inside the bucket's span on the progress thread.
    let nested = events.windows(2).any(|w| {
        w[0]["name"] == "bucket"
            && w[0]["ph"] == "B"
            && w[1]["name"] == "collective"
            && w[1]["ph"] == "B"
            && w[0]["tid"] == w[1]["tid"]
    });
    assert!(nested, "no call nested in its bucket");
    let _ = std::fs::remove_file(trace);
}

/// The NCCL-form overrides refuse a bad token before anything runs, each
/// naming the variable and the token.
#[test]
fn a_bad_algorithm_or_protocol_override_is_refused_naming_the_token() {
    for (var, value, token) in [
        ("FERROCOLL_ALGO", "allreduce:nvls", "nvls"),
        ("FERROCOLL_PROTO", "LL128", "LL128"),
        ("FERROCOLL_PROTO", "^simple,LL", "allows no protocol"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
            .args(["bench", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"])
            .env(var, value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {err}");
        assert!(
            err.contains(var) && err.contains(token),
            "{var}={value}: {err}"
        );
    }
}
