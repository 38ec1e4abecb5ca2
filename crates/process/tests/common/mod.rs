//! Runs a test's ranks as real processes: the test binary starts copies of
//! itself, each running one ignored "child" test with its rank in the
//! environment, and meets them through a rendezvous store it hosts.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferrocoll_core::comm::Planning;
use ferrocoll_core::conformance::Case;
use ferrocoll_core::{Collective, DataType, ReduceOp};
use ferrocoll_process::{ProcessCommunicator, ProcessConfig, TransportKind};
use ferrocoll_rendezvous::{Server, Store};

/// What a child reads to know its part.
pub struct ChildEnv {
    pub rank: u32,
    pub world_size: u32,
    pub transport: TransportKind,
    pub scenario: String,
    pub store: String,
}

/// The child's settings, or `None` when this is not a child run.
pub fn child_env() -> Option<ChildEnv> {
    let var = |k: &str| std::env::var(k).ok();
    Some(ChildEnv {
        rank: var("FERROCOLL_TEST_RANK")?.parse().ok()?,
        world_size: var("FERROCOLL_TEST_WORLD")?.parse().ok()?,
        transport: var("FERROCOLL_TEST_TRANSPORT")?.parse().ok()?,
        scenario: var("FERROCOLL_TEST_SCENARIO")?,
        store: var("FERROCOLL_TEST_STORE")?,
    })
}

/// The host this rank pretends to be on: item `rank` of the
/// comma-separated `FERROCOLL_TEST_HOSTS` (ranks with different host ids
/// count as different hosts, so one machine emulates several).
pub fn emulated_host(rank: u32) -> Option<String> {
    let hosts = std::env::var("FERROCOLL_TEST_HOSTS").ok()?;
    hosts.split(',').nth(rank as usize).map(str::to_owned)
}

/// Join the parent's store and form the group.
pub fn connect(env: &ChildEnv, config: ProcessConfig) -> ProcessCommunicator {
    // The parent hosts the store, so every child joins as a client (any
    // rank but 0 does).
    let store = Store::join(&env.store, 1, Duration::from_secs(30)).expect("join the store");
    ProcessCommunicator::connect(
        store,
        env.rank,
        env.world_size,
        &ProcessConfig {
            transport: env.transport,
            host_id: emulated_host(env.rank).or(config.host_id.clone()),
            ..config
        },
    )
    .expect("form the group")
}

/// A child's settings and its group, formed with the built-in settings
/// and `timeout`; `None` when this is not a child run.
pub fn child_group(timeout: Duration) -> Option<(ChildEnv, ProcessCommunicator)> {
    let env = child_env()?;
    let config = ProcessConfig {
        planning: Planning {
            timeout,
            ..ProcessConfig::builtin().planning
        },
        ..ProcessConfig::builtin()
    };
    let comm = connect(&env, config);
    Some((env, comm))
}

/// A finished child: exit code and everything it printed.
#[derive(Debug)]
pub struct Finished {
    pub rank: u32,
    pub code: Option<i32>,
    pub output: String,
    /// When it exited, measured from the start.
    pub at: Duration,
}

/// Every rank's end, for an assertion's message.
pub fn show(finished: &[Finished]) -> String {
    finished
        .iter()
        .map(|f| {
            format!(
                "--- rank {} exit {:?} at {:?}\n{}",
                f.rank, f.code, f.at, f.output
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Running children.
pub struct Ranks {
    pub children: Vec<Child>,
    pub lines: mpsc::Receiver<(u32, String)>,
    pub started: Instant,
    _server: Server,
}

/// Start `n` children running `test` with `scenario`.
pub fn spawn(test: &str, scenario: &str, n: u32, transport: TransportKind) -> Ranks {
    let ranks: Vec<u32> = (0..n).collect();
    spawn_some(test, scenario, &ranks, n, transport, &[])
}

/// Start children for `ranks` only, of a group of `world` ranks, with
/// extra environment variables.
pub fn spawn_some(
    test: &str,
    scenario: &str,
    ranks: &[u32],
    world: u32,
    transport: TransportKind,
    env: &[(&str, &str)],
) -> Ranks {
    let server = Server::start("127.0.0.1:0".parse().unwrap()).expect("host the store");
    let (tx, lines) = mpsc::channel();
    let children = ranks
        .iter()
        .map(|&rank| {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args([
                    test,
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("FERROCOLL_TEST_RANK", rank.to_string())
                .env("FERROCOLL_TEST_WORLD", world.to_string())
                .env("FERROCOLL_TEST_TRANSPORT", transport.to_string())
                .env("FERROCOLL_TEST_SCENARIO", scenario)
                .env("FERROCOLL_TEST_STORE", server.addr().to_string())
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a rank");
            for stream in [
                Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
                Box::new(child.stderr.take().unwrap()),
            ] {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(stream).lines().map_while(Result::ok) {
                        let _ = tx.send((rank, line));
                    }
                });
            }
            child
        })
        .collect();
    Ranks {
        children,
        lines,
        started: Instant::now(),
        _server: server,
    }
}

impl Ranks {
    /// Wait for the first line containing `text`, up to `limit`.
    pub fn wait_for_line(&self, text: &str, limit: Duration, log: &mut Vec<(u32, String)>) -> bool {
        let deadline = Instant::now() + limit;
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            let hit = line.1.contains(text);
            log.push(line);
            if hit {
                return true;
            }
        }
        false
    }

    /// Wait for every child, killing all after `limit`; returns each one's
    /// end and output.
    pub fn finish(mut self, limit: Duration, mut log: Vec<(u32, String)>) -> Vec<Finished> {
        let deadline = self.started + limit;
        let mut ended: Vec<Option<(Option<i32>, Duration)>> = vec![None; self.children.len()];
        while ended.iter().any(Option::is_none) {
            for (r, child) in self.children.iter_mut().enumerate() {
                if ended[r].is_none()
                    && let Some(status) = child.try_wait().unwrap()
                {
                    ended[r] = Some((status.code(), self.started.elapsed()));
                }
            }
            if Instant::now() >= deadline {
                for (r, child) in self.children.iter_mut().enumerate() {
                    if ended[r].is_none() {
                        let _ = child.kill();
                        let _ = child.wait();
                        ended[r] = Some((None, self.started.elapsed()));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // Let the readers drain what the children printed last.
        std::thread::sleep(Duration::from_millis(50));
        log.extend(self.lines.try_iter());
        ended
            .into_iter()
            .enumerate()
            .map(|(r, e)| {
                let (code, at) = e.unwrap();
                let output = log
                    .iter()
                    .filter(|(rank, _)| *rank == r as u32)
                    .map(|(_, l)| l.as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                Finished {
                    rank: r as u32,
                    code,
                    output,
                    at,
                }
            })
            .collect()
    }
}

/// Panic with every rank's output unless all exited with code 0.
pub fn assert_all_ok(finished: &[Finished]) {
    if finished.iter().any(|f| f.code != Some(0)) {
        for f in finished {
            eprintln!("--- rank {} (exit {:?}) ---\n{}", f.rank, f.code, f.output);
        }
        panic!("a rank failed");
    }
}

const DTYPES: [DataType; 10] = [
    DataType::F32,
    DataType::I32,
    DataType::Bf16,
    DataType::U8,
    DataType::F64,
    DataType::I8,
    DataType::F16,
    DataType::U32,
    DataType::I64,
    DataType::U64,
];
const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Max,
    ReduceOp::Avg,
    ReduceOp::Prod,
    ReduceOp::Min,
];

/// The conformance kit's reduced matrix for `n` processes, the same in
/// every process: every collective × algorithm, awkward lengths, in place
/// and out of place, dtypes and ops in turn, then point to point.
pub fn kit_cases(n: u32) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut i = 0usize;
    for (algorithm, kind) in ferrocoll_core::algorithms::applicable() {
        let collective = kind.with_root(n - 1);
        for count in [0, 1, 7, 1000, 20_011] {
            for in_place in [false, true] {
                if in_place && collective.in_place_alias(0).is_none() {
                    continue;
                }
                i += 1;
                cases.push(Case {
                    collective,
                    algorithm: Some(algorithm),
                    world_size: n,
                    count,
                    dtype: DTYPES[i % DTYPES.len()],
                    op: OPS[(i / DTYPES.len()) % OPS.len()],
                    in_place,
                    seed: i as u64,
                });
            }
        }
    }
    // Point to point, which no algorithm generates.
    for (k, count) in [0usize, 5, 70_001].into_iter().enumerate() {
        cases.push(Case {
            collective: Collective::SendRecv,
            algorithm: None,
            world_size: n,
            count,
            dtype: DTYPES[k],
            op: ReduceOp::Sum,
            in_place: false,
            seed: 1000 + k as u64,
        });
    }
    cases
}
