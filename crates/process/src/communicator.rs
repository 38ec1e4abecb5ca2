//! `ProcessCommunicator`: one rank of a group whose ranks are processes.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use ferrocoll_core::algorithms::{Algorithm, AlgorithmParams, generate};
use ferrocoll_core::comm::{CommError, block_count};
use ferrocoll_core::cpu::{Reduce, auto_algorithm};
use ferrocoll_core::schedule::layout::Layout;
use ferrocoll_core::verify::{Verified, VerifyOptions, verify};
use ferrocoll_core::{Collective, Rank, ReduceOp};
use ferrocoll_rendezvous::Store;

use crate::config::{ProcessConfig, TransportKind};
use crate::exec::{Call, execute};
use crate::setup::{SetupError, connect};
use crate::transport::Transport;
use crate::wire::Header;

/// One rank of a process group: the [`Communicator`](ferrocoll_core::comm::Communicator)
/// of ranks that are processes, on one host (shared memory) or many (TCP).
///
/// Failure semantics match the in-process executor: every wait is bounded
/// by [`ProcessConfig::timeout`]; a rank that errors tells every peer, a
/// peer whose process dies is noticed (shared memory: its process is gone;
/// TCP: its connection closed), and every pending and later call then
/// returns [`CommError::PeerFailed`]. Inputs of out-of-place calls are
/// never written.
pub struct ProcessCommunicator {
    transport: Box<dyn Transport>,
    config: ProcessConfig,
    rank: Rank,
    n: u32,
    calls: u64,
    /// Point-to-point sends so far, per peer, to number their messages.
    p2p_sent: Vec<u64>,
    p2p_received: Vec<u64>,
    plans: HashMap<(Algorithm, Collective, AlgorithmParams), Arc<Verified>>,
    /// A hash of each schedule run so far (by its address), carried in
    /// message headers so ranks running different plans notice.
    fingerprints: HashMap<usize, u64>,
    /// Rank 0 hosts the store; keep it for the life of the group.
    _store: Store,
}

impl std::fmt::Debug for ProcessCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessCommunicator")
            .field("rank", &self.rank)
            .field("world_size", &self.n)
            .field("transport", &self.config.transport)
            .finish()
    }
}

/// Aborts a process group from another thread of this process.
pub struct AbortHandle {
    abort: Box<dyn Fn(&str) + Send + Sync>,
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortHandle")
    }
}

impl AbortHandle {
    /// Fail this rank: its pending call and every peer's return
    /// [`CommError::PeerFailed`] ("aborted") within one wake-up.
    pub fn abort(&self) {
        (self.abort)("aborted");
    }
}

/// A call's schedule, the chunk size its chooser asked for, and why it was chosen.
type Planned = (Arc<Verified>, Option<usize>, Cow<'static, str>);

/// Which point-to-point channel a transport reserves (past every schedule channel).
fn p2p_channel(t: &dyn Transport) -> u32 {
    t.max_channel().unwrap_or(u32::MAX)
}

impl ProcessCommunicator {
    /// Form a group through `store` (see [`ferrocoll_rendezvous::Store::join`]):
    /// every one of `world_size` processes calls this with its own `rank`
    /// and the same `config`.
    pub fn connect(
        mut store: Store,
        rank: Rank,
        world_size: u32,
        config: &ProcessConfig,
    ) -> Result<Self, SetupError> {
        let transport = connect(&mut store, rank, world_size, config)?;
        Ok(ProcessCommunicator {
            transport,
            config: config.clone(),
            rank,
            n: world_size,
            calls: 0,
            p2p_sent: vec![0; world_size as usize],
            p2p_received: vec![0; world_size as usize],
            plans: HashMap::new(),
            fingerprints: HashMap::new(),
            _store: store,
        })
    }

    /// Force (or, with `None`, stop forcing) the algorithm of later calls.
    /// Every rank must make the same change before the same call; a rank
    /// that does not is caught by the first message's header
    /// ([`CommError::Mismatch`] names both schedules).
    pub fn set_algorithm(&mut self, algorithm: Option<Algorithm>) {
        self.config.algorithm = algorithm;
    }

    /// The transport in use.
    pub fn transport(&self) -> TransportKind {
        self.config.transport
    }

    /// A handle another thread can abort the group with.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            abort: self.transport.aborter(),
        }
    }

    /// Abort the group now (see [`AbortHandle::abort`]).
    pub fn abort(&mut self) {
        self.transport.fail(self.rank, "aborted");
    }

    fn comm_rank(&self) -> Rank {
        self.rank
    }

    fn comm_size(&self) -> u32 {
        self.n
    }

    fn check_peer(&self, peer: Rank) -> Result<(), CommError> {
        ferrocoll_core::comm::check_peer(peer, self.rank, self.n)
    }

    /// Fail the group on an error this rank found, so no peer waits for it.
    fn fail_on<R>(&mut self, result: Result<R, CommError>) -> Result<R, CommError> {
        if let Err(e) = &result
            && !matches!(
                e,
                CommError::BufferSize { .. }
                    | CommError::RankOutOfRange { .. }
                    | CommError::SelfPeer { .. }
            )
        {
            match e {
                CommError::PeerFailed { rank, reason } => self.transport.fail(*rank, reason),
                other => self.transport.fail(self.rank, &other.to_string()),
            }
        }
        result
    }

    fn plan(&mut self, collective: Collective, bytes: usize) -> Result<Planned, CommError> {
        let n = self.n;
        if let Some(custom) = &self.config.schedule {
            let s = custom.schedule();
            if s.collective == collective && s.world_size == n {
                return Ok((custom.clone(), None, "the configured schedule".into()));
            }
        }
        let ferrocoll_core::choose::Choice {
            algorithm,
            params,
            max_chunk_bytes: chunk,
            why,
        } = ferrocoll_core::choose::decide(
            self.config.algorithm,
            self.config.chooser.as_ref(),
            self.config.channels,
            collective,
            n,
            bytes,
            || auto_algorithm(collective.kind(), n, bytes),
        );
        let why = Cow::Owned(why);
        self.planned(algorithm, collective, params)
            .map(|v| (v, chunk, why))
    }

    fn planned(
        &mut self,
        algorithm: Algorithm,
        collective: Collective,
        params: AlgorithmParams,
    ) -> Result<Arc<Verified>, CommError> {
        let key = (algorithm, collective, params);
        if let Some(v) = self.plans.get(&key) {
            return Ok(v.clone());
        }
        let schedule = generate(algorithm, collective, self.n, &key.2)?;
        let verified = Arc::new(verify(schedule, &VerifyOptions::default()).map_err(Box::new)?);
        self.plans.insert(key, verified.clone());
        Ok(verified)
    }

    /// A hash of `v`'s whole schedule, computed once per plan.
    fn fingerprint(&mut self, v: &Arc<Verified>) -> u64 {
        use std::hash::{Hash, Hasher};
        *self
            .fingerprints
            .entry(Arc::as_ptr(v) as usize)
            .or_insert_with(|| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                v.schedule().to_json().hash(&mut h);
                h.finish()
            })
    }

    fn host_call<T: Reduce>(
        &mut self,
        collective: Collective,
        input: Option<&[T]>,
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        ferrocoll_core::comm::check_root(collective, self.n)?;
        let count = block_count(
            collective,
            self.n as usize,
            input.map(<[T]>::len),
            output.len(),
        )?;
        // A loss noticed during an earlier call fails this one; record it
        // as this rank's failure too, so peers hear of it from us.
        let result = self
            .transport
            .check()
            .and_then(|()| self.run_collective(collective, count, input, output, op, None));
        self.fail_on(result)
    }

    fn run_collective<T: Reduce>(
        &mut self,
        collective: Collective,
        count: usize,
        input: Option<&[T]>,
        output: &mut [T],
        op: ReduceOp,
        forced: Option<Algorithm>,
    ) -> Result<(), CommError> {
        let call = self.calls;
        self.calls += 1;
        let size = std::mem::size_of::<T>();
        let in_place = input.is_none();
        let blocks = collective
            .input_blocks(self.n)
            .max(collective.output_blocks(self.n)) as usize;
        let (verified, chunk, why) = match forced {
            Some(a) => (
                self.planned(a, collective, AlgorithmParams::default())?,
                None,
                Cow::Borrowed("internal"),
            ),
            None => self.plan(collective, count * size * blocks)?,
        };
        let schedule = verified.schedule();
        if in_place && !verified.supports_in_place() {
            return Err(CommError::InPlaceUnsupported {
                collective: format!("{collective} with schedule `{}`", schedule.name),
            });
        }
        if let Some(max) = self.transport.max_channel()
            && schedule.channel_count() as u32 > max
        {
            return Err(CommError::Backend {
                message: format!(
                    "schedule `{}` uses {} channels; this group was set up for {max} (raise ProcessConfig::max_channels)",
                    schedule.name,
                    schedule.channel_count()
                ),
            });
        }
        // Cut chunks so the widest step's message fits one message.
        let limit = self.config.max_message_bytes.max(size) / schedule.widest_step() as usize;
        let layout = Layout::with_max_chunk_bytes(
            count,
            schedule.chunks_per_block,
            size,
            chunk.unwrap_or(limit).min(limit).max(size),
        );
        // The plan's hash and segment count come before the schedule's
        // name, so they survive when a long name is cut to fit the header.
        let fingerprint = self.fingerprint(&verified);
        let signature = format!(
            "{collective} count={count} type={} op={op} plan={fingerprint:016x}/{} schedule={}",
            T::DATA_TYPE,
            layout.segments(),
            schedule.name
        );
        tracing::debug!(
            rank = self.rank,
            call,
            transport = %self.config.transport,
            "{collective} {} B {}: algorithm={} channels={} chunks/block={} segments={} in_place={in_place} ({why})",
            count * size * blocks,
            T::DATA_TYPE,
            schedule.name,
            schedule.channel_count(),
            schedule.chunks_per_block,
            layout.segments(),
        );
        let scratch_len = schedule.scratch_len(count);
        let mut scratch: Vec<T> = Vec::with_capacity(scratch_len);
        let out = output.as_mut_ptr() as usize;
        let (input_base, output_base) = match input {
            Some(i) => (i.as_ptr() as usize, out),
            None => (out, out),
        };
        let started = Instant::now();
        let exec = Call {
            schedule,
            rank: self.rank,
            in_place,
            layout,
            op,
            bases: [input_base, output_base, scratch.as_mut_ptr() as usize],
            call,
            signature: &signature,
            timeout: self.config.timeout,
        };
        execute::<T>(self.transport.as_mut(), &exec)?;
        tracing::trace!(
            rank = self.rank,
            call,
            elapsed_us = started.elapsed().as_micros() as u64,
            "done"
        );
        if op == ReduceOp::Avg && collective.reduces() {
            let n = self.n;
            let result: Option<&mut [T]> = match collective {
                Collective::Reduce { root } if root != self.rank => None,
                Collective::ReduceScatter if in_place => {
                    let r = self.rank as usize;
                    Some(&mut output[r * count..(r + 1) * count])
                }
                _ => Some(&mut output[..count]),
            };
            for x in result.into_iter().flatten() {
                *x = x.divide(n);
            }
        }
        Ok(())
    }

    /// Wait until `ready` holds, bounded by the timeout, by peer failure
    /// and by `peer` leaving the group.
    fn wait_until(
        &mut self,
        peer: Rank,
        what: impl Fn() -> String,
        mut ready: impl FnMut(&mut dyn Transport) -> Result<bool, CommError>,
    ) -> Result<(), CommError> {
        let deadline = Instant::now() + self.config.timeout;
        loop {
            let seen = self.transport.ticket();
            if ready(self.transport.as_mut())? {
                return Ok(());
            }
            self.transport.check()?;
            if self.transport.departed(peer) {
                return Err(CommError::PeerFailed {
                    rank: peer,
                    reason: format!(
                        "left the group (its communicator was dropped) while this rank waited for {}",
                        what()
                    ),
                });
            }
            if Instant::now() >= deadline {
                return Err(CommError::Timeout {
                    rank: self.rank,
                    timeout: self.config.timeout,
                    what: what(),
                });
            }
            self.transport.wait(seen, deadline);
        }
    }

    fn fragment(&self) -> usize {
        self.transport
            .max_message()
            .unwrap_or(self.config.max_message_bytes)
            .max(8)
            / 8
            * 8
    }

    fn host_send<T: Reduce>(&mut self, data: &[T], peer: Rank) -> Result<(), CommError> {
        self.check_peer(peer)?;
        let result = self
            .transport
            .check()
            .and_then(|()| self.send_inner(data, peer));
        self.fail_on(result)
    }

    fn send_inner<T: Reduce>(&mut self, data: &[T], peer: Rank) -> Result<(), CommError> {
        let channel = p2p_channel(self.transport.as_ref());
        let bytes = std::mem::size_of_val(data);
        // SAFETY: viewing initialised elements as bytes.
        let raw = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, bytes) };
        let number = self.p2p_sent[peer as usize];
        self.p2p_sent[peer as usize] += 1;
        let signature = format!("send #{number} type={}", T::DATA_TYPE);
        let fragment = self.fragment();
        let pieces: Vec<&[u8]> = if raw.is_empty() {
            vec![raw]
        } else {
            raw.chunks(fragment).collect()
        };
        for piece in pieces {
            let mut room = None;
            self.wait_until(
                peer,
                || format!("room on the link to rank {peer}"),
                |t| {
                    room = t.reserve(peer, channel, piece.len())?;
                    Ok(room.is_some())
                },
            )?;
            let room = room.expect("waited for room");
            // SAFETY: the reserved room holds `piece.len()` bytes and is ours until committed.
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), room, piece.len()) };
            // The header's call field carries the whole send's size, so the
            // receiver can name a length mismatch exactly.
            let header = Header::new(bytes as u64, piece.len(), &signature);
            self.transport.commit(peer, channel, &header)?;
        }
        // Like the other executors: return once the peer has received it.
        self.wait_until(
            peer,
            || format!("rank {peer} to receive a send"),
            |t| Ok(t.unconsumed(peer, channel) == 0),
        )
    }

    fn host_recv<T: Reduce>(&mut self, buffer: &mut [T], peer: Rank) -> Result<(), CommError> {
        self.check_peer(peer)?;
        let result = self
            .transport
            .check()
            .and_then(|()| self.recv_inner(buffer, peer));
        self.fail_on(result)
    }

    fn recv_inner<T: Reduce>(&mut self, buffer: &mut [T], peer: Rank) -> Result<(), CommError> {
        let channel = p2p_channel(self.transport.as_ref());
        let wanted = std::mem::size_of_val(buffer);
        let number = self.p2p_received[peer as usize];
        self.p2p_received[peer as usize] += 1;
        let signature = format!("send #{number} type={}", T::DATA_TYPE);
        let out = buffer.as_mut_ptr() as *mut u8;
        let mut at = 0usize;
        loop {
            let mut message = None;
            self.wait_until(
                peer,
                || format!("a send from rank {peer}"),
                |t| {
                    message = t.peek(peer, channel)?;
                    Ok(message.is_some())
                },
            )?;
            let m = message.expect("waited for a message");
            let header = self
                .transport
                .peek_header(peer, channel)
                .expect("peeked above");
            if header.signature() != Header::new(0, 0, &signature).signature() {
                return Err(CommError::Mismatch {
                    call: number,
                    rank: self.rank,
                    other: peer,
                    expected: header.signature().to_owned(),
                    got: format!("recv #{number} type={}", T::DATA_TYPE),
                });
            }
            if m.call as usize != wanted || at + m.len > wanted {
                let e = CommError::BufferSize {
                    what: "recv buffer (bytes)",
                    got: wanted,
                    needed: m.call as usize,
                };
                // The send cannot complete: fail the group (this rank is
                // the culprit) so the sender does not wait out its timeout.
                self.transport.fail(self.rank, &e.to_string());
                return Err(e);
            }
            // SAFETY: the message holds `m.len` bytes until released, and
            // `out + at .. + m.len` lies inside `buffer` (checked above).
            unsafe { std::ptr::copy_nonoverlapping(m.payload, out.add(at), m.len) };
            at += m.len;
            self.transport.release(peer, channel)?;
            if at == wanted {
                return Ok(());
            }
        }
    }

    fn host_barrier(&mut self) -> Result<(), CommError> {
        let mut token = [1u8];
        let result = self.transport.check().and_then(|()| {
            self.run_collective(
                Collective::AllReduce,
                1,
                None,
                &mut token,
                ReduceOp::Max,
                Some(Algorithm::Direct),
            )
        });
        self.fail_on(result)
    }
}

ferrocoll_core::communicator_via_host_call!(ProcessCommunicator);

impl Drop for ProcessCommunicator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Dropped while unwinding: the program did not finish its calls,
            // so peers must hear of a failure, not a clean exit.
            self.transport.fail(self.rank, "panicked");
        } else {
            self.transport.depart();
        }
    }
}
