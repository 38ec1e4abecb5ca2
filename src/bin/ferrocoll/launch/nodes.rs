//! Launching across hosts: one `ferrocoll launch --nnodes M --node-rank K
//! --nproc-per-node L --rdzv-endpoint HOST:PORT` per host.
//!
//! The launchers meet in a store of their own at the endpoint (node 0's
//! launcher hosts it), authenticated with the job secret every node was
//! given, before any rank runs. Node 0 compares every node's card and
//! publishes one verdict: the ranks' store (`MASTER_ADDR`, a free
//! `MASTER_PORT` beside the endpoint, which rank 0 hosts) and the job id,
//! or why the job is refused (a node rank claimed twice, a node that says
//! another `--nnodes` or `--nproc-per-node`, a node rank that never came).
//!
//! While the ranks run, each launcher beats in the store and watches the
//! others ([`Cluster`]): a node whose job failed, or whose launcher went
//! silent, fails every other node's job at once. Node 0 keeps the store
//! up until every node has ended.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrocoll::rendezvous::{JobSecret, Store};

/// The most nodes one job spans.
const MAX_NODES: u32 = 4096;

/// How often a launcher beats and looks at the others.
const BEAT: Duration = Duration::from_millis(200);

/// A launcher silent this long is gone (its host lost power, its link is
/// down, or it was killed): about ten beats.
pub(super) const SILENCE: Duration = Duration::from_secs(2);

/// The job's shape across hosts, as each launcher was told.
#[derive(Debug, Clone)]
pub(crate) struct NodeSpec {
    pub nnodes: u32,
    pub node_rank: u32,
    pub nproc_per_node: u32,
    /// `HOST:PORT` of node 0's launcher store.
    pub endpoint: String,
}

impl NodeSpec {
    /// Check the flags, before anything starts.
    pub fn check(&self) -> Result<(), String> {
        if self.nnodes == 0 || self.nnodes > MAX_NODES {
            return Err(format!("--nnodes must be between 1 and {MAX_NODES}"));
        }
        if self.node_rank >= self.nnodes {
            return Err(format!(
                "--node-rank {} is out of range for --nnodes {} (node ranks count from 0)",
                self.node_rank, self.nnodes
            ));
        }
        if self.endpoint_addr().is_none() {
            return Err(format!(
                "--rdzv-endpoint `{}` is not HOST:PORT with a port from 1 to 65535",
                self.endpoint
            ));
        }
        Ok(())
    }

    fn endpoint_addr(&self) -> Option<SocketAddr> {
        let addr = self.endpoint.to_socket_addrs().ok()?.next()?;
        (addr.port() != 0).then_some(addr)
    }

    /// The world's size.
    pub fn world_size(&self) -> u32 {
        self.nnodes * self.nproc_per_node
    }

    /// This node's card: what node 0 compares.
    fn card(&self, host: &str) -> String {
        format!(
            "nnodes={} nproc_per_node={} host={host}",
            self.nnodes, self.nproc_per_node
        )
    }
}

/// What node 0 decided for the job.
pub(crate) struct Verdict {
    /// `MASTER_ADDR` and `MASTER_PORT` of the ranks' store.
    pub master: (String, u16),
    /// The job id every node's ranks get.
    pub job_id: String,
    /// The launchers' store (on node 0, its server), kept for [`Cluster`].
    pub store: Store,
}

/// Meet the other launchers and agree, or say why not; `job_id` is this
/// node's proposal (node 0's wins).
pub(crate) fn meet(
    spec: &NodeSpec,
    secret: &JobSecret,
    job_id: &str,
    timeout: Duration,
) -> Result<Verdict, String> {
    let hostname = ferrocoll::host::name();
    let role = if spec.node_rank == 0 { 0 } else { 1 };
    let mut store = Store::join_with(&spec.endpoint, role, timeout, Some(secret))
        .map_err(|e| format!("node {}: meeting the other launchers: {e}", spec.node_rank))?;
    let k = spec.node_rank;
    let claims = store
        .add(&format!("launch/claim/{k}"), 1)
        .map_err(|e| e.to_string())?;
    if claims > 1 {
        let why = format!("node rank {k} was claimed twice (the second by host `{hostname}`)");
        let _ = store.set("launch/verdict", format!("refused {why}").as_bytes());
        return Err(why);
    }
    store
        .set(&format!("launch/node/{k}"), spec.card(&hostname).as_bytes())
        .map_err(|e| e.to_string())?;
    if k == 0 {
        decide(&mut store, spec, job_id, timeout)?;
    }
    let verdict = wait_for(&mut store, "launch/verdict", timeout)
        .map_err(|e| format!("waiting for node 0's verdict: {e}"))?;
    let verdict = String::from_utf8_lossy(&verdict).into_owned();
    let mut words = verdict.splitn(4, ' ');
    match (words.next(), words.next(), words.next(), words.next()) {
        (Some("ok"), Some(addr), Some(port), Some(id)) => {
            let port = port
                .parse()
                .map_err(|_| format!("bad verdict `{verdict}`"))?;
            Ok(Verdict {
                master: (addr.to_owned(), port),
                job_id: id.to_owned(),
                store,
            })
        }
        _ => Err(verdict
            .strip_prefix("refused ")
            .unwrap_or(&verdict)
            .to_owned()),
    }
}

/// Node 0: wait for every card, compare, publish the verdict.
fn decide(
    store: &mut Store,
    spec: &NodeSpec,
    job_id: &str,
    timeout: Duration,
) -> Result<(), String> {
    let until = Instant::now() + timeout;
    let mine = spec.card("");
    let mine = mine.rsplit_once(" host=").map_or(mine.as_str(), |(m, _)| m);
    let mut missing: Vec<u32> = (0..spec.nnodes).collect();
    while !missing.is_empty() {
        // A duplicate node rank refuses the job itself.
        if let Ok(Some(v)) = store.get("launch/verdict") {
            return Err(String::from_utf8_lossy(&v)
                .trim_start_matches("refused ")
                .to_owned());
        }
        let mut still = Vec::new();
        for k in missing {
            match store
                .get(&format!("launch/node/{k}"))
                .map_err(|e| e.to_string())?
            {
                Some(card) => {
                    let card = String::from_utf8_lossy(&card).into_owned();
                    let (theirs, host) = card.rsplit_once(" host=").unwrap_or((&card, "?"));
                    if theirs != mine {
                        let why = format!(
                            "node {k} (host `{host}`) was started with {theirs}, node 0 with {mine}"
                        );
                        let _ = store.set("launch/verdict", format!("refused {why}").as_bytes());
                        return Err(why);
                    }
                }
                None => still.push(k),
            }
        }
        missing = still;
        if !missing.is_empty() && Instant::now() >= until {
            let why = format!(
                "node ranks {missing:?} of {} never arrived at {} within {timeout:?}",
                spec.nnodes, spec.endpoint
            );
            let _ = store.set("launch/verdict", format!("refused {why}").as_bytes());
            return Err(why);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (addr, port) = master_port(spec)?;
    store
        .set(
            "launch/verdict",
            format!("ok {addr} {port} {job_id}").as_bytes(),
        )
        .map_err(|e| e.to_string())
}

/// The ranks' store: the endpoint's host, a port free there now.
fn master_port(spec: &NodeSpec) -> Result<(String, u16), String> {
    let endpoint = spec.endpoint_addr().ok_or("bad --rdzv-endpoint")?;
    let free = TcpListener::bind(SocketAddr::new(endpoint.ip(), 0))
        .and_then(|l| l.local_addr())
        .map_err(|e| {
            format!(
                "no free port on {} for the ranks' store: {e}",
                endpoint.ip()
            )
        })?;
    Ok((endpoint.ip().to_string(), free.port()))
}

fn wait_for(store: &mut Store, key: &str, timeout: Duration) -> Result<Vec<u8>, String> {
    let until = Instant::now() + timeout;
    loop {
        if let Some(v) = store.get(key).map_err(|e| e.to_string())? {
            return Ok(v);
        }
        if Instant::now() >= until {
            return Err(format!("`{key}` did not come within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The other nodes, watched from a thread while this node's ranks run.
pub(crate) struct Cluster {
    shared: Arc<Shared>,
    node_rank: u32,
}

struct Shared {
    /// Why the job failed elsewhere, once it did.
    elsewhere: Mutex<Option<String>>,
    /// What this node has to say: its failure, or that it ended.
    said: Mutex<Option<Said>>,
    /// The watcher has said it and (node 0) seen every node end.
    done: AtomicBool,
}

#[derive(Clone)]
enum Said {
    Failed(String),
    Ended,
}

impl Cluster {
    /// Start watching over a connection of its own whose requests give up
    /// after [`SILENCE`] (node 0's host may be the one that went silent);
    /// `keep` is the meeting's store, which on node 0 hosts the server.
    pub fn watch(spec: &NodeSpec, secret: &JobSecret, keep: Store) -> Result<Cluster, String> {
        let store = Store::join_with(&spec.endpoint, 1, SILENCE, Some(secret))
            .map_err(|e| format!("watching the other nodes: {e}"))?;
        let shared = Arc::new(Shared {
            elsewhere: Mutex::new(None),
            said: Mutex::new(None),
            done: AtomicBool::new(false),
        });
        let watched = shared.clone();
        let (k, nnodes) = (spec.node_rank, spec.nnodes);
        std::thread::Builder::new()
            .name("ferrocoll-nodes".into())
            .spawn(move || {
                let _server = keep;
                watch(store, k, nnodes, &watched);
            })
            .map_err(|e| format!("cannot start the thread watching the other nodes: {e}"))?;
        Ok(Cluster {
            shared,
            node_rank: spec.node_rank,
        })
    }

    /// Why the job failed on another node, once it did.
    pub fn failed_elsewhere(&self) -> Option<String> {
        self.shared.elsewhere.lock().ok()?.clone()
    }

    /// This node's job failed: tell the others (once).
    pub fn report_failure(&self, why: &str) {
        self.say(Said::Failed(format!("node {}: {why}", self.node_rank)));
    }

    fn say(&self, what: Said) {
        if let Ok(mut said) = self.shared.said.lock()
            && said.is_none()
        {
            *said = Some(what);
        }
    }

    /// This node's ranks have all ended: say so and, on node 0 (whose
    /// store the others use), wait until every node has ended or gone
    /// silent, or a signal comes.
    pub fn finish(self) {
        self.say(Said::Ended);
        while !self.shared.done.load(Ordering::Acquire) && super::signals::received().is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The watcher: beat, publish what this node said, read the others.
fn watch(mut store: Store, k: u32, nnodes: u32, shared: &Shared) {
    let mut last: Vec<(i64, Instant)> = vec![(-1, Instant::now()); nnodes as usize];
    let mut published = false;
    loop {
        let said = shared.said.lock().ok().and_then(|s| s.clone());
        let elsewhere = match turn(&mut store, k, said.as_ref(), &mut published, &mut last) {
            Ok(found) => found,
            // The store is node 0's launcher: gone while this node still
            // runs means node 0 is.
            Err(e) if published => {
                tracing::debug!("the launchers' store is gone after this node ended: {e}");
                break;
            }
            Err(e) => {
                // Nothing more can be said or learned: the store is gone.
                note(
                    shared,
                    format!("node 0's launcher (the rendezvous) is gone or silent: {e}"),
                );
                break;
            }
        };
        if let Some(why) = elsewhere {
            note(shared, why);
        }
        // Node 0 keeps the store up until every node has ended or is gone.
        if published && (k != 0 || all_ended(&mut store, nnodes, &last)) {
            break;
        }
        std::thread::sleep(BEAT);
    }
    shared.done.store(true, Ordering::Release);
}

/// Keep the first reason the job failed elsewhere.
fn note(shared: &Shared, why: String) {
    if let Ok(mut e) = shared.elsewhere.lock()
        && e.is_none()
    {
        *e = Some(why);
    }
}

/// One look: beat, publish, and return why the job failed elsewhere.
fn turn(
    store: &mut Store,
    k: u32,
    said: Option<&Said>,
    published: &mut bool,
    last: &mut [(i64, Instant)],
) -> Result<Option<String>, ferrocoll::rendezvous::StoreError> {
    store.add(&format!("launch/beat/{k}"), 1)?;
    if !*published {
        match said {
            Some(Said::Failed(why)) => {
                if store.get("launch/failed")?.is_none() {
                    store.set("launch/failed", why.as_bytes())?;
                }
                store.set(&format!("launch/ended/{k}"), b"failed")?;
                *published = true;
            }
            Some(Said::Ended) => {
                store.set(&format!("launch/ended/{k}"), b"ok")?;
                *published = true;
            }
            None => {}
        }
    }
    if let Some(why) = store.get("launch/failed")? {
        let why = String::from_utf8_lossy(&why).into_owned();
        if !why.starts_with(&format!("node {k}:")) {
            return Ok(Some(why));
        }
    }
    for (node, seen) in last.iter_mut().enumerate() {
        if node as u32 == k || store.get(&format!("launch/ended/{node}"))?.is_some() {
            continue;
        }
        let beats = store.add(&format!("launch/beat/{node}"), 0)?;
        if beats != seen.0 {
            *seen = (beats, Instant::now());
        } else if seen.1.elapsed() >= SILENCE {
            return Ok(Some(format!(
                "node {node}'s launcher has been silent for {:.1} s (host down, link down or launcher killed)",
                seen.1.elapsed().as_secs_f64()
            )));
        }
    }
    Ok(None)
}

/// Whether every node ended or went silent.
fn all_ended(store: &mut Store, nnodes: u32, last: &[(i64, Instant)]) -> bool {
    (0..nnodes).all(|n| {
        matches!(store.get(&format!("launch/ended/{n}")), Ok(Some(_)))
            || last[n as usize].1.elapsed() >= SILENCE
    })
}
