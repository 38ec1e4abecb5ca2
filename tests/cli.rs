//! The `ferrocoll` binary end to end: exit codes and what it prints.

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

#[test]
fn verify_sweeps_every_algorithm_and_collective() {
    let out = ferrocoll(&[
        "verify", "--algo", "all", "--op", "all", "--ranks", "1..9", "--root", "2",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("ok    ring             all-reduce"), "{text}");
    assert!(text.contains("skip  tree             all-gather"), "{text}");
    assert!(text.contains("broadcast(root=2)"), "{text}");
    assert!(text.contains("0 failed"), "{text}");
}

#[test]
fn a_hand_written_schedule_file_verifies() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/schedules/star_all_reduce_3.json"
    );
    let out = ferrocoll(&["verify", "--algo", path]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(stdout(&out).contains("1 ok, 0 failed"));
}

#[test]
fn flags_a_schedule_file_does_not_match_are_refused_not_ignored() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/schedules/star_all_reduce_3.json"
    );
    for (flags, names) in [
        (&["--ranks", "3", "--op", "all-gather"][..], "--op"),
        (&["--ranks", "4"][..], "--ranks"),
        (&["--root", "1"][..], "--root"),
    ] {
        let mut args = vec!["verify", "--algo", path];
        args.extend_from_slice(flags);
        let out = ferrocoll(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}: {}", stdout(&out));
        assert!(err.contains(names) && err.contains("3 ranks"), "{err}");
    }
    // Flags that match the file are fine.
    let out = ferrocoll(&[
        "verify",
        "--algo",
        path,
        "--ranks",
        "3",
        "--op",
        "all-reduce",
    ]);
    assert!(out.status.success(), "{}", stdout(&out));
}

/// The example star all-reduce, broken: rank 2 no longer sends its input
/// to rank 0 but copies it locally instead.
fn unproven_star() -> String {
    let good = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/schedules/star_all_reduce_3.json"
    ))
    .unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&good).unwrap();
    json["ranks"][2]["channels"][0][0] = serde_json::json!({
        "read": { "buffer": "input", "chunk": 0 },
        "write": { "buffer": "output", "chunk": 0 }
    });
    json.to_string()
}

#[test]
fn a_broken_schedule_file_fails_with_every_violation() {
    let broken = unproven_star();
    let path = std::env::temp_dir().join(format!("ferrocoll-broken-{}.json", std::process::id()));
    std::fs::write(&path, broken).unwrap();
    let out = ferrocoll(&["verify", "--algo", path.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("FAIL"), "{text}");
    assert!(text.contains("rank 0 channel 0 step 0"), "{text}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn printed_json_verifies_again() {
    let out = ferrocoll(&[
        "schedule",
        "--algo",
        "tree",
        "--op",
        "all-reduce",
        "--ranks",
        "6",
        "--json",
    ]);
    assert!(out.status.success());
    let path = std::env::temp_dir().join(format!("ferrocoll-tree-{}.json", std::process::id()));
    std::fs::write(&path, &out.stdout).unwrap();
    let again = ferrocoll(&["verify", "--algo", path.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stdout(&again));
    let _ = std::fs::remove_file(path);
}

#[test]
fn the_grid_shows_every_rank_and_the_legend() {
    let out = ferrocoll(&[
        "schedule",
        "--algo",
        "ring",
        "--op",
        "all-reduce",
        "--ranks",
        "3",
    ]);
    let text = stdout(&out);
    assert!(text.contains("| rank 2"), "{text}");
    assert!(text.contains("<2 +in2 >1"), "{text}");
    assert!(text.starts_with("# ring all-reduce n=3"), "{text}");
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let out = ferrocoll(&[
        "schedule",
        "--algo",
        "tree",
        "--op",
        "all-gather",
        "--ranks",
        "4",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tree cannot run all-gather"), "{err}");

    let out = ferrocoll(&["verify", "--algo", "/nonexistent/x.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read schedule file"));

    let out = ferrocoll(&["verify", "--ranks", "0..4"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[test]
fn bench_prints_the_nccl_tests_table_and_writes_every_report() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, csv, svg) = (dir.join("b.json"), dir.join("b.csv"), dir.join("b.svg"));
    let out = ferrocoll(&[
        "bench",
        "--ranks",
        "3",
        "--algo",
        "all",
        "-b",
        "1K",
        "-e",
        "16K",
        "-f",
        "4",
        "-n",
        "2",
        "-w",
        "1",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    for header in [
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
    ] {
        assert!(text.contains(header), "missing column {header}: {text}");
    }
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
    assert!(text.contains("# Avg bus bandwidth"), "{text}");
    assert!(text.contains("algorithm halving-doubling"), "{text}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4 * 3, "4 algorithms × 3 sizes");
    assert_eq!(rows[0]["out_of_place"]["wrong"], 0);
    // Every row carries the spread of its single calls.
    for row in rows {
        for mode in ["out_of_place", "in_place"] {
            let m = &row[mode];
            let t = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("{mode}.{k}: {row}"));
            assert!(t("time_us_min") <= t("time_us_median"), "{row}");
            assert!(t("time_us_median") <= t("time_us_max"), "{row}");
            assert!(t("time_us_min") > 0.0, "{row}");
        }
    }
    assert!(
        std::fs::read_to_string(&csv)
            .unwrap()
            .starts_with("collective,algorithm,ranks,size")
    );
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    let _ = std::fs::remove_dir_all(dir);
}

/// With `--membw`, a row past the last-level cache is judged against the
/// memory probed between its rounds of calls (`bench/paired.rs`), a row
/// inside it against the sweep's probe; the JSON carries the verdict.
#[test]
fn membw_pairs_rows_past_the_cache_with_probes_between_their_calls() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-paired-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("p.json");
    let out = ferrocoll(&[
        "bench",
        "--ranks",
        "2",
        "-b",
        "64K",
        "-e",
        "64M",
        "-f",
        "1024",
        "-n",
        "3",
        "-w",
        "0",
        "-c",
        "0",
        "--membw",
        "--json",
        json.to_str().unwrap(),
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(dir);
    let llc = ferrocoll::kernels::StoreRule::host().llc_bytes;
    for row in report["rows"].as_array().unwrap() {
        let size = row["size"].as_u64().unwrap();
        for mode in ["out_of_place", "in_place"] {
            let paired = &row[mode]["paired"];
            if size < llc {
                assert!(paired.is_null(), "{size} B fits the cache: {row}");
                continue;
            }
            assert_eq!(paired["rounds"], 3, "one call per round: {row}");
            let r = |k: &str| paired[k].as_f64().unwrap();
            assert!(
                r("ratio_min") <= r("ratio") && r("ratio") <= r("ratio_max"),
                "{row}"
            );
            assert!(r("ratio_min") > 0.0 && r("memory_gbps") > 0.0, "{row}");
        }
    }
    if 64 << 20 >= llc {
        assert!(
            text.contains("each round against the memory probed around it"),
            "{text}"
        );
        assert!(text.contains("x ceiling (paired: "), "{text}");
    }
    assert!(
        text.contains("against the higher probe of the sweep"),
        "{text}"
    );
    // One rank has no ceiling: said, not divided by zero.
    let one = ferrocoll(&[
        "bench", "--ranks", "1", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--membw",
    ]);
    let text = stdout(&one);
    assert!(one.status.success(), "{text}");
    assert!(text.contains("no ceiling at n=1"), "{text}");
    assert!(!text.contains("NaNx") && !text.contains("infx"), "{text}");
}

#[test]
fn bench_refuses_what_it_cannot_do() {
    let out = ferrocoll(&["bench", "--backend", "mpi"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("possible values: cpu, cuda, nccl"), "{err}");
    let out = ferrocoll(&["bench", "--compare", "nccl"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--compare"));
    let out = ferrocoll(&["bench", "-d", "float128"]);
    assert_eq!(out.status.code(), Some(2));
    let out = ferrocoll(&["bench", "--ranks", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ranks must be at least 1"));
    let out = ferrocoll(&["bench", "--ranks", "2", "--op", "broadcast", "-r", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--root 2"));
    let out = ferrocoll(&["bench", "--transport", "shm", "--predict"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--transport"));
    let out = ferrocoll(&["bench", "--from-env"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--backend nccl or cuda"));
    let out = ferrocoll(&["bench", "--backend", "nccl", "--from-env", "--devices", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("drop --devices"));
    let out = ferrocoll(&["launch", "-n", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("between 1 and 1024"));
}

#[test]
fn malformed_or_unproven_schedule_files_are_refused_with_where_and_why() {
    let dir = std::env::temp_dir();
    let syntax = dir.join(format!("ferrocoll-syntax-{}.json", std::process::id()));
    std::fs::write(
        &syntax,
        "{\n  \"format\": \"ferrocoll-schedule\",\n  \"version\": 1,\n  oops\n}",
    )
    .unwrap();
    let out = ferrocoll(&["verify", "--algo", syntax.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("line 4") && !err.contains("panicked"), "{err}");
    // Which file, too: a run may read several.
    assert!(err.contains(syntax.to_str().unwrap()), "{err}");
    let out = ferrocoll(&["bench", "--ranks", "3", "--algo", syntax.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains(syntax.to_str().unwrap()), "{err}");
    let _ = std::fs::remove_file(&syntax);

    // A file that parses but is wrong: bench refuses to run it and says why.
    let broken = dir.join(format!("ferrocoll-unproven-{}.json", std::process::id()));
    std::fs::write(&broken, unproven_star()).unwrap();
    let out = ferrocoll(&["bench", "--ranks", "3", "--algo", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.contains("rank 0 channel 0 step 0") && !err.contains("panicked"),
        "{err}"
    );
    let _ = std::fs::remove_file(&broken);
}

#[test]
fn bench_runs_a_hand_written_schedule_file() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/schedules/star_all_reduce_3.json"
    );
    let out = ferrocoll(&[
        "bench", "--algo", path, "--ranks", "3", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2",
        "-w", "1",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("algorithm from the schedule file"), "{text}");
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
    let out = ferrocoll(&["bench", "--algo", path, "--ranks", "4"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pass --ranks 3"));
}

#[test]
fn plan_prints_a_call_and_the_simulator_reads_it_back() {
    let out = ferrocoll(&[
        "plan",
        "--algo",
        "ring",
        "--op",
        "all-reduce",
        "--ranks",
        "4",
        "--count",
        "1M",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("`ring` all-reduce count=1048576 type=f32 op=sum out of place"),
        "{text}"
    );
    assert!(text.contains("recv_reduce_copy_send"), "{text}");
    assert!(
        text.contains("0->1 channel 0: 6 message(s), 6 MiB"),
        "{text}"
    );

    // JSON out, checked back in by the simulator; an edit breaks the hash.
    let dir = std::env::temp_dir().join(format!("ferrocoll-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.json");
    let out = ferrocoll(&[
        "plan",
        "--algo",
        "tree",
        "--op",
        "broadcast",
        "--root",
        "2",
        "--ranks",
        "5",
        "--count",
        "10",
        "--in-place",
        "--json",
    ]);
    assert!(out.status.success());
    std::fs::write(&path, &out.stdout).unwrap();
    let out = ferrocoll(&[
        "sim",
        "--topo",
        "dgx-a100",
        "--plan",
        path.to_str().unwrap(),
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("`tree` broadcast(root=2) on 5 ranks, 40 B"),
        "{text}"
    );
    let edited = String::from_utf8_lossy(&std::fs::read(&path).unwrap())
        .replace("\"count\": 10", "\"count\": 11");
    std::fs::write(&path, edited).unwrap();
    let out = ferrocoll(&[
        "sim",
        "--topo",
        "dgx-a100",
        "--plan",
        path.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not match its contents"));
    let _ = std::fs::remove_dir_all(dir);

    // One plan at a time, and `auto` says why.
    let out = ferrocoll(&["plan", "--algo", "all"]);
    assert_eq!(out.status.code(), Some(2));
    let out = ferrocoll(&["plan", "--ranks", "3", "--count", "4K"]);
    assert!(stdout(&out).starts_with("# why: "), "{}", stdout(&out));
    let out = ferrocoll(&["verify", "--algo", "auto"]);
    assert_eq!(out.status.code(), Some(2));
}

/// `info` answers on any machine: the build and CPU always, and each of
/// the CUDA driver, NVRTC and NCCL either with its version and file or
/// with why it is missing — never an error exit.
#[test]
fn info_reports_what_is_here_and_what_is_not() {
    let out = ferrocoll(&["info", "--no-measure"]);
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for key in [
        "ferrocoll ",
        "cpu ",
        "cuda driver ",
        "nvrtc ",
        "nccl ",
        "gpus ",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no `{key}` line: {text}"));
        assert!(line.len() > key.len() + 4, "{line}");
    }
    for key in ["cuda driver", "nvrtc", "nccl"] {
        let line = text.lines().find(|l| l.starts_with(key)).unwrap();
        let rest = line[key.len()..].trim_start();
        assert!(
            rest.starts_with("none: ") || rest.contains(" at /") || rest.starts_with("CUDA "),
            "{line}"
        );
    }
}

/// A CUDA driver that lacks functions ferrocoll calls (an old driver, a
/// stub) is named, not a panic: `info` says so and exits 0, `bench`
/// refuses with the reason. The stub is built here (a C compiler; CI has
/// one) and put first on the library path.
#[test]
fn a_driver_missing_functions_is_named_not_a_panic() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-stub-driver-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("stub.c");
    std::fs::write(
        &src,
        "int cuInit(unsigned f) { return 0; }\n\
         int cuDriverGetVersion(int *v) { *v = 13000; return 0; }\n\
         int cuDeviceGetCount(int *n) { *n = 1; return 0; }\n",
    )
    .unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    for name in ["libcuda.so", "libcuda.so.1"] {
        let built = Command::new(&cc)
            .args(["-shared", "-fPIC", "-o"])
            .arg(dir.join(name))
            .arg(&src)
            .status();
        if !built.is_ok_and(|s| s.success()) {
            assert!(
                std::env::var("FERROCOLL_REQUIRE_HOST_KERNEL").is_err(),
                "no C compiler `{cc}` to build the stub driver"
            );
            eprintln!("SKIPPED: no C compiler to build a stub driver");
            return;
        }
    }
    let path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) => format!("{}:{p}", dir.display()),
        Err(_) => dir.display().to_string(),
    };
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
            .args(args)
            .env("LD_LIBRARY_PATH", &path)
            .output()
            .expect("the binary runs")
    };
    let out = run(&["info", "--no-measure"]);
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("cuda driver   none:") && text.contains("libcuda lacks"),
        "{text}"
    );
    assert!(
        text.contains("cuLaunchKernel") || text.contains("..."),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
    let out = run(&[
        "bench",
        "--backend",
        "cuda",
        "--ranks",
        "1",
        "-b",
        "1K",
        "-e",
        "1K",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("libcuda lacks") && !err.contains("panicked"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
