//! `CpuCommunicator`: the [`Communicator`] of one rank of a CPU group, and
//! the launchers that create a group.

use std::borrow::Cow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use super::executor::{Call, execute};
use super::group::{Group, Msg};
use super::kernels::Reduce;
use super::plan::{Plan, PlanKey};
use super::{CpuConfig, auto_algorithm};
use crate::algorithms::generate;
use crate::comm::{CommError, Communicator};
use crate::schedule::layout::Layout;
use crate::types::{Collective, Rank, ReduceOp};
use crate::verify::{VerifyOptions, verify};

/// Channel id reserved for point-to-point send/recv (schedules never reach it).
const P2P_CHANNEL: u32 = u32::MAX;

/// One rank of a CPU group. Create a group with [`group`] or [`run`].
pub struct CpuCommunicator {
    group: Arc<Group>,
    config: Arc<CpuConfig>,
    rank: Rank,
    calls: u64,
}

/// `n` communicators sharing one group, one per thread you start
/// ([`CommError::EmptyGroup`] for `n == 0`).
pub fn group(n: u32, config: &CpuConfig) -> Result<Vec<CpuCommunicator>, CommError> {
    if n == 0 {
        return Err(CommError::EmptyGroup);
    }
    let slots = config
        .slots_per_link
        .max(crate::verify::DEFAULT_SLOTS_PER_LINK) as usize;
    let group = Arc::new(Group::new(n, slots));
    let config = Arc::new(config.clone());
    Ok((0..n)
        .map(|rank| CpuCommunicator {
            group: group.clone(),
            config: config.clone(),
            rank,
            calls: 0,
        })
        .collect())
}

/// Run `f` on `n` threads, one communicator each, and collect what each
/// returns. A rank whose `f` errors or panics fails the group, so the
/// others return errors rather than wait for it. For `n == 0` the one
/// result is [`CommError::EmptyGroup`].
pub fn run<R, F>(n: u32, config: &CpuConfig, f: F) -> Vec<Result<R, CommError>>
where
    R: Send,
    F: Fn(&mut CpuCommunicator) -> Result<R, CommError> + Sync,
{
    let f = &f;
    let comms = match group(n, config) {
        Ok(comms) => comms,
        Err(e) => return vec![Err(e)],
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                scope.spawn(move || {
                    let (group, rank) = (comm.group.clone(), comm.rank);
                    match catch_unwind(AssertUnwindSafe(|| f(&mut comm))) {
                        Ok(Ok(value)) => Ok(value),
                        Ok(Err(e)) => {
                            group.fail(rank, &e);
                            Err(e)
                        }
                        Err(panic) => {
                            let what = panic
                                .downcast_ref::<&str>()
                                .map(|s| s.to_string())
                                .or_else(|| panic.downcast_ref::<String>().cloned())
                                .unwrap_or_else(|| "unknown panic".to_owned());
                            let e = CommError::PeerFailed {
                                rank,
                                reason: format!("panicked: {what}"),
                            };
                            group.fail(rank, &format!("panicked: {what}"));
                            Err(e)
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("panics are caught inside the thread"))
            .collect()
    })
}

fn check_len(what: &'static str, got: usize, needed: usize) -> Result<(), CommError> {
    if got == needed {
        Ok(())
    } else {
        Err(CommError::BufferSize { what, got, needed })
    }
}

/// Aborts a CPU group from anywhere — another thread, a watchdog — while
/// its ranks may be blocked in calls.
#[derive(Clone)]
pub struct AbortHandle {
    group: Arc<Group>,
    rank: Rank,
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortHandle")
            .field("rank", &self.rank)
            .finish()
    }
}

impl AbortHandle {
    /// Fail the group: every pending and later call of every rank returns
    /// [`CommError::PeerFailed`] naming this rank ("aborted"), within one
    /// wake-up — nobody waits out the timeout. The group stays poisoned.
    pub fn abort(&self) {
        self.group.fail(self.rank, &"aborted");
    }
}

impl CpuCommunicator {
    /// A handle that aborts this communicator's group.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            group: self.group.clone(),
            rank: self.rank,
        }
    }

    /// Abort the group now (see [`AbortHandle::abort`]).
    pub fn abort(&mut self) {
        self.abort_handle().abort();
    }

    fn check_peer(&self, peer: Rank) -> Result<(), CommError> {
        crate::comm::check_peer(peer, self.rank, self.group.n)
    }

    fn check_root(&self, root: Rank) -> Result<(), CommError> {
        crate::comm::check_rank(root, self.group.n)
    }

    /// The plan of a call, why it was chosen, and the chunk size the
    /// chooser asked for, if any.
    fn plan(&self, collective: Collective, bytes: usize) -> Result<Planned, CommError> {
        let n = self.group.n;
        if let Some(custom) = &self.config.schedule {
            let s = custom.schedule();
            if s.collective == collective && s.world_size == n {
                let plan = self.cached(PlanKey::Custom, || Ok(Plan::new((**custom).clone())))?;
                return Ok(Planned {
                    plan,
                    why: "the configured schedule".into(),
                    chunk: None,
                });
            }
        }
        let crate::choose::Choice {
            algorithm,
            params,
            max_chunk_bytes: chunk,
            why,
        } = crate::choose::decide(
            self.config.algorithm,
            self.config.chooser.as_ref(),
            self.config.channels,
            collective,
            n,
            bytes,
            || auto_algorithm(collective.kind(), n, bytes),
        );
        let why = Cow::Owned(why);
        let key = PlanKey::Builtin {
            algorithm,
            collective,
            params: params.clone(),
        };
        let plan = self.cached(key, || {
            let schedule = generate(algorithm, collective, n, &params)?;
            let verified = verify(schedule, &VerifyOptions::default()).map_err(Box::new)?;
            Ok(Plan::new(verified))
        })?;
        Ok(Planned { plan, why, chunk })
    }

    /// The plan under `key`, built by `build` by the first rank that needs it.
    fn cached(
        &self,
        key: PlanKey,
        build: impl FnOnce() -> Result<Plan, CommError>,
    ) -> Result<Arc<Plan>, CommError> {
        let cell = self
            .group
            .plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default()
            .clone();
        cell.get_or_init(|| build().map(Arc::new)).clone()
    }

    /// Run one collective. `input` is null for in-place calls whose input
    /// lives inside `output`; for in-place reduce-scatter, `output` is the
    /// whole (n-block) buffer.
    fn collective<T: Reduce>(
        &mut self,
        collective: Collective,
        count: usize,
        input: *const T,
        output: *mut T,
        in_place: bool,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.group.check()?;
        let call = self.calls;
        self.calls += 1;
        let signature = format!(
            "{collective} count={count} type={} op={op} in_place={in_place}",
            T::DATA_TYPE
        );
        let result = self.collective_inner(
            collective, count, input, output, in_place, op, call, &signature,
        );
        if let Err(e) = &result
            && !matches!(e, CommError::PeerFailed { .. })
        {
            self.group.fail(self.rank, e);
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn collective_inner<T: Reduce>(
        &mut self,
        collective: Collective,
        count: usize,
        input: *const T,
        output: *mut T,
        in_place: bool,
        op: ReduceOp,
        call: u64,
        signature: &str,
    ) -> Result<(), CommError> {
        self.group.register_call(call, self.rank, signature)?;
        let size = std::mem::size_of::<T>();
        // The nccl-tests size: the larger of one rank's buffers.
        let blocks = collective
            .input_blocks(self.group.n)
            .max(collective.output_blocks(self.group.n)) as usize;
        let Planned { plan, why, chunk } = self.plan(collective, count * size * blocks)?;
        if in_place && !plan.verified.supports_in_place() {
            return Err(CommError::InPlaceUnsupported {
                collective: format!(
                    "{collective} with schedule `{}`",
                    plan.verified.schedule().name
                ),
            });
        }
        let schedule = plan.verified.schedule();
        let layout = Layout::with_max_chunk_bytes(
            count,
            schedule.chunks_per_block,
            size,
            chunk.unwrap_or(self.config.max_chunk_bytes),
        );
        tracing::debug!(
            rank = self.rank,
            call,
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
        // In place, every access to the aliased view resolves into the
        // other buffer (`Schedule::physical`), so one base serves both.
        let (input_base, output_base) = if in_place {
            (output as usize, output as usize)
        } else {
            (input as usize, output as usize)
        };
        let started = Instant::now();
        let exec = Call {
            group: &self.group,
            plan: &plan,
            rank: self.rank,
            in_place,
            layout,
            op,
            bases: [input_base, output_base, scratch.as_mut_ptr() as usize],
            timeout: self.config.timeout,
        };
        execute::<T>(&exec)?;
        tracing::trace!(
            rank = self.rank,
            call,
            elapsed_us = started.elapsed().as_micros() as u64,
            "done"
        );
        if op == ReduceOp::Avg && collective.reduces() {
            let result = match collective {
                Collective::Reduce { root } if root != self.rank => None,
                Collective::ReduceScatter if in_place => {
                    // SAFETY: an in-place reduce-scatter's buffer holds n
                    // blocks; this rank's result is block `rank`.
                    Some(unsafe { output.add(self.rank as usize * count) })
                }
                _ => Some(output),
            };
            if let Some(ptr) = result {
                // SAFETY: `ptr` addresses `count` elements of the caller's
                // exclusive output buffer, and the collective has finished.
                let out = unsafe { std::slice::from_raw_parts_mut(ptr, count) };
                for x in out {
                    *x = x.divide(self.group.n);
                }
            }
        }
        Ok(())
    }

    fn wait_for(&self, what: &str, mut done: impl FnMut(&Group) -> bool) -> Result<(), CommError> {
        let deadline = Instant::now() + self.config.timeout;
        loop {
            let seen = self.group.generation(self.rank);
            self.group.check()?;
            if done(&self.group) {
                return Ok(());
            }
            self.group.wait(
                self.rank,
                seen,
                deadline,
                || what.to_owned(),
                self.config.timeout,
            )?;
        }
    }
}

impl Communicator for CpuCommunicator {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.group.n
    }

    fn all_reduce<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        check_len("all-reduce output", output.len(), input.len())?;
        let c = Collective::AllReduce;
        self.collective(
            c,
            input.len(),
            input.as_ptr(),
            output.as_mut_ptr(),
            false,
            op,
        )
    }

    fn all_reduce_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let c = Collective::AllReduce;
        self.collective(
            c,
            buffer.len(),
            std::ptr::null(),
            buffer.as_mut_ptr(),
            true,
            op,
        )
    }

    fn reduce_scatter<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let n = self.group.n as usize;
        check_len("reduce-scatter input", input.len(), output.len() * n)?;
        let c = Collective::ReduceScatter;
        self.collective(
            c,
            output.len(),
            input.as_ptr(),
            output.as_mut_ptr(),
            false,
            op,
        )
    }

    fn reduce_scatter_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let n = self.group.n as usize;
        let count = buffer.len() / n;
        check_len("reduce-scatter buffer (n blocks)", buffer.len(), count * n)?;
        let c = Collective::ReduceScatter;
        self.collective(c, count, std::ptr::null(), buffer.as_mut_ptr(), true, op)
    }

    fn all_gather<T: Reduce>(&mut self, input: &[T], output: &mut [T]) -> Result<(), CommError> {
        let n = self.group.n as usize;
        check_len("all-gather output", output.len(), input.len() * n)?;
        let c = Collective::AllGather;
        self.collective(
            c,
            input.len(),
            input.as_ptr(),
            output.as_mut_ptr(),
            false,
            ReduceOp::Sum,
        )
    }

    fn all_gather_in_place<T: Reduce>(&mut self, buffer: &mut [T]) -> Result<(), CommError> {
        let n = self.group.n as usize;
        let count = buffer.len() / n;
        check_len("all-gather buffer (n blocks)", buffer.len(), count * n)?;
        let c = Collective::AllGather;
        self.collective(
            c,
            count,
            std::ptr::null(),
            buffer.as_mut_ptr(),
            true,
            ReduceOp::Sum,
        )
    }

    fn broadcast<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        root: Rank,
    ) -> Result<(), CommError> {
        self.check_root(root)?;
        check_len("broadcast input", input.len(), output.len())?;
        let c = Collective::Broadcast { root };
        self.collective(
            c,
            output.len(),
            input.as_ptr(),
            output.as_mut_ptr(),
            false,
            ReduceOp::Sum,
        )
    }

    fn broadcast_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        root: Rank,
    ) -> Result<(), CommError> {
        self.check_root(root)?;
        let c = Collective::Broadcast { root };
        self.collective(
            c,
            buffer.len(),
            std::ptr::null(),
            buffer.as_mut_ptr(),
            true,
            ReduceOp::Sum,
        )
    }

    fn reduce<T: Reduce>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<(), CommError> {
        self.check_root(root)?;
        check_len("reduce output", output.len(), input.len())?;
        let c = Collective::Reduce { root };
        self.collective(
            c,
            input.len(),
            input.as_ptr(),
            output.as_mut_ptr(),
            false,
            op,
        )
    }

    fn reduce_in_place<T: Reduce>(
        &mut self,
        buffer: &mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<(), CommError> {
        self.check_root(root)?;
        let c = Collective::Reduce { root };
        self.collective(
            c,
            buffer.len(),
            std::ptr::null(),
            buffer.as_mut_ptr(),
            true,
            op,
        )
    }

    fn all_to_all<T: Reduce>(&mut self, input: &[T], output: &mut [T]) -> Result<(), CommError> {
        let n = self.group.n as usize;
        check_len("all-to-all output", output.len(), input.len())?;
        let count = input.len() / n;
        check_len("all-to-all input (n blocks)", input.len(), count * n)?;
        let c = Collective::AllToAll;
        self.collective(
            c,
            count,
            input.as_ptr(),
            output.as_mut_ptr(),
            false,
            ReduceOp::Sum,
        )
    }

    fn send<T: Reduce>(&mut self, data: &[T], peer: Rank) -> Result<(), CommError> {
        self.check_peer(peer)?;
        self.group.check()?;
        let link = self.group.link(self.rank, peer, P2P_CHANNEL);
        let bytes = std::mem::size_of_val(data);
        {
            let mut st = self.group.lock_link(&link);
            st.queue
                .push_back(Msg::Pointer(vec![(data.as_ptr() as usize, bytes)]));
            st.pushed += 1;
        }
        self.group.ring(peer);
        // The receiver reads `data` in place: return only once it has, or,
        // on failure, once it provably never will.
        let waited = self.wait_for(&format!("rank {peer} to receive a send"), |g| {
            g.lock_link(&link).queue.is_empty()
        });
        if let Err(e) = &waited {
            self.group.quiesce(self.rank, e);
            self.group.lock_link(&link).queue.clear();
        }
        waited
    }

    fn recv<T: Reduce>(&mut self, buffer: &mut [T], peer: Rank) -> Result<(), CommError> {
        self.check_peer(peer)?;
        let link = self.group.link(peer, self.rank, P2P_CHANNEL);
        self.wait_for(&format!("a send from rank {peer}"), |g| {
            !g.lock_link(&link).queue.is_empty()
        })?;
        let moving = self.group.begin_movement()?;
        let msg = self.group.lock_link(&link).queue.front().cloned();
        let Some(Msg::Pointer(pieces)) = msg else {
            unreachable!("point-to-point links carry pointers only")
        };
        let (address, bytes) = pieces[0];
        let wanted = std::mem::size_of_val(buffer);
        if bytes != wanted {
            drop(moving);
            let e = CommError::BufferSize {
                what: "recv buffer (bytes)",
                got: wanted,
                needed: bytes,
            };
            self.group.fail(self.rank, &e);
            return Err(e);
        }
        // SAFETY: the sender returns only after this message is popped, or,
        // if it gives up, only after taking the movement lock for writing,
        // which waits for our read guard; so its `bytes`-long slice stays
        // alive and unchanged while we copy. `buffer` is ours.
        unsafe {
            std::ptr::copy_nonoverlapping(
                address as *const u8,
                buffer.as_mut_ptr() as *mut u8,
                bytes,
            );
        }
        self.group.lock_link(&link).queue.pop_front();
        drop(moving);
        self.group.ring(peer);
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.group.check()?;
        let (generation, last) = self.group.arrive();
        if last {
            return Ok(());
        }
        self.wait_for("every rank to reach the barrier", |g| {
            g.barrier_generation() > generation
        })
    }
}

/// A call's plan, why it was chosen, and the chunk size asked for.
struct Planned {
    plan: Arc<Plan>,
    why: Cow<'static, str>,
    chunk: Option<usize>,
}
