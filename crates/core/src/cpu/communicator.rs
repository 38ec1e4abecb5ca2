//! `CpuCommunicator`: the [`Communicator`] of one rank of a CPU group, and
//! the launchers that create a group.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use super::CpuConfig;
use super::group::{Group, Msg};
use super::links::ThreadLinks;
use crate::comm::{
    Call, Checked, CommError, Communicator, HostSlice, HostSliceMut, Planner, split,
};
use crate::kernels::{KernelWatch, Switch};
use crate::link::exec::{Task, execute};
use crate::plan::{LinkLoad, OneShot};
use crate::trace::{FlightRecorder, Identity};
use crate::types::{CallShape, Rank};

/// Channel id reserved for point-to-point send/recv (schedules never reach it).
const P2P_CHANNEL: u32 = u32::MAX;

/// One rank of a CPU group. Create a group with [`group`] or [`run`].
pub struct CpuCommunicator {
    pub(super) group: Arc<Group>,
    pub(super) config: Arc<CpuConfig>,
    pub(super) rank: Rank,
    calls: u64,
    /// The last one-shot call's shape and this rank's part of it.
    pub(super) one_shot: Option<(CallShape, Arc<OneShot>)>,
    /// This rank's last calls.
    recorder: FlightRecorder,
    /// Keeps the kernels of large calls honest.
    watch: KernelWatch,
}

/// The signature a barrier announces.
fn barrier_signature() -> u64 {
    static SIGNATURE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SIGNATURE.get_or_init(|| crate::plan::stable_hash(&"barrier"))
}

/// `n` communicators sharing one group, one per thread you start
/// ([`CommError::EmptyGroup`] for `n == 0`).
pub fn group(n: u32, config: &CpuConfig) -> Result<Vec<CpuCommunicator>, CommError> {
    if n == 0 {
        return Err(CommError::EmptyGroup);
    }
    // Measure the host's kernels now, not inside the first call.
    crate::kernels::calibration();
    let planner = Planner::new(n, config.planner_settings());
    let group = Arc::new(Group::new(n, config.link_slots() as usize, planner));
    let config = Arc::new(config.clone());
    // Names the group in flight-recorder dumps: groups of one process
    // apart, and the same for each of its ranks.
    static GROUPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let number = GROUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("threads-p{}-g{number}", std::process::id());
    let trace = config
        .trace
        .clone()
        .unwrap_or_else(crate::settings::trace_settings);
    Ok((0..n)
        .map(|rank| CpuCommunicator {
            group: group.clone(),
            config: config.clone(),
            rank,
            calls: 0,
            one_shot: None,
            watch: KernelWatch::new(config.planning.kernel_watch.clone()),
            recorder: {
                let mut r = FlightRecorder::with(
                    Identity {
                        group: name.clone(),
                        rank,
                        world_size: n,
                        executor: "threads",
                    },
                    trace.capacity,
                    trace.dir.clone(),
                );
                r.summarize_on_drop(trace.summary);
                r
            },
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
    let allowed = if config.pin_ranks {
        super::pin::allowed_cpus()
    } else {
        None
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                let (group, rank) = (comm.group.clone(), comm.rank);
                let cpu = super::pin::cpu_for(allowed.as_deref(), rank, n);
                let spawned = std::thread::Builder::new()
                    .name(format!("ferrocoll-rank-{rank}"))
                    .spawn_scoped(scope, move || {
                        if let Some(cpu) = cpu
                            && !super::pin::pin_to(cpu)
                        {
                            tracing::debug!(rank, cpu, "could not pin the rank's thread");
                        }
                        let (group, rank) = (comm.group.clone(), comm.rank);
                        match catch_unwind(AssertUnwindSafe(|| f(&mut comm))) {
                            Ok(Ok(value)) => Ok(value),
                            Ok(Err(e)) => {
                                group.fail_on(rank, &e);
                                Err(e)
                            }
                            Err(panic) => {
                                let what = crate::comm::panic_message(&*panic);
                                let e = CommError::PeerFailed {
                                    rank,
                                    reason: format!("panicked: {what}"),
                                };
                                group.fail(rank, &format!("panicked: {what}"));
                                Err(e)
                            }
                        }
                    });
                // The system refused a thread: this rank never runs, so
                // fail the group at once rather than let the others wait.
                spawned.map_err(|e| {
                    let err = CommError::Capacity {
                        what: format!("cannot start a thread for rank {rank} of {n}: {e}"),
                    };
                    group.fail(rank, &err);
                    err
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h?.join().expect("panics are caught inside the thread"))
            .collect()
    })
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
    /// Returns once no peer is still reading or writing this rank's
    /// buffers (so they may be freed).
    pub fn abort(&self) {
        self.group.quiesce(self.rank, &"aborted");
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

    /// Split the group (see [`Communicator::split`]): the ranks that pass
    /// the same `color` get a communicator of a new group of their own,
    /// ranked by `key` then by rank here; `None` gets no communicator. The
    /// new group has this group's settings.
    pub fn split(
        &mut self,
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<CpuCommunicator>, CommError> {
        let call = self.calls;
        let Some(membership) = split::exchange(self, color, key)? else {
            return Ok(None);
        };
        let size = membership.members.len() as u32;
        let config = self.config.clone();
        let group = self.group.split_group(call, membership.color, size, || {
            let planner = Planner::new(size, config.planner_settings());
            Group::new(size, config.link_slots() as usize, planner)
        });
        let recorder = self
            .recorder
            .split(call, membership.color, membership.rank, size);
        Ok(Some(CpuCommunicator {
            group,
            config,
            rank: membership.rank,
            calls: 0,
            one_shot: None,
            watch: KernelWatch::new(self.config.planning.kernel_watch.clone()),
            recorder,
        }))
    }

    /// This rank's flight recorder: its last calls ([`crate::trace`]).
    pub fn recorder(&self) -> &FlightRecorder {
        &self.recorder
    }

    /// What every link of the group has carried since the group was made:
    /// messages and bytes counted where the data moved (the sender's
    /// writes into slots and posted destinations, the receiver's reads of
    /// the sender's memory). Point-to-point links have channel `u32::MAX`.
    pub fn link_traffic(&self) -> Vec<LinkLoad> {
        self.group.traffic()
    }

    /// Run one collective; on an error other than a bad argument, fail the
    /// group so no peer waits for this rank.
    fn collective(
        &mut self,
        shape: &CallShape,
        input: Option<HostSlice<'_>>,
        output: HostSliceMut<'_>,
    ) -> Result<(), CommError> {
        let number = self.calls;
        self.group.check_before(number)?;
        self.calls += 1;
        let result = if self.group.one_shot.applies(shape, self.group.n) {
            self.run_one_shot(number, shape, input, output)
        } else {
            self.run_collective(number, shape, input, output)
        };
        if let Err(e) = &result
            && !matches!(e, CommError::PeerFailed { .. })
        {
            self.group.fail(self.rank, e);
        }
        result
    }

    fn run_collective(
        &mut self,
        number: u64,
        shape: &CallShape,
        input: Option<HostSlice<'_>>,
        mut output: HostSliceMut<'_>,
    ) -> Result<(), CommError> {
        let planned = self.group.plan(shape)?;
        let plan = &planned.plan;
        self.agree(number, planned.signature, None, &|| plan.signature())?;
        let kernels = self.watch.for_call(plan.host_bytes(), plan.chunk_bytes);
        self.recorder
            .planned(number, &plan.schedule, Some(planned.signature));
        tracing::debug!(
            rank = self.rank,
            call = number,
            kernels = %kernels,
            "{}",
            planned.describe()
        );
        // In place the plan names only the output, so both bases are its.
        let output_base = output.as_mut_ptr() as usize;
        let input_base = input.map_or(output_base, |i| i.as_ptr() as usize);
        let started = Instant::now();
        let rank_bytes = plan.input_bytes + plan.output_bytes;
        let meter = self.watch.meter(rank_bytes, plan.host_bytes());
        // Every message carries it; the agreement above already proved
        // every rank makes this call, so it is short.
        let signature = format!("{:016x}", planned.signature);
        let mut links = ThreadLinks::new(&self.group, self.rank, &plan.ranks[self.rank as usize]);
        crate::with_element_type!(shape.dtype, T => {
            let mut scratch: Vec<T> = Vec::with_capacity(plan.scratch_bytes as usize / std::mem::size_of::<T>());
            let task = Task {
                plan,
                rank: self.rank,
                bases: [input_base, output_base, scratch.as_mut_ptr() as usize],
                number,
                signature: &signature,
                timeout: self.config.planning.timeout,
                kernels,
                meter: &meter,
            };
            // SAFETY: the bases are the caller's buffers (checked against
            // the call's shape before planning, so as long as the plan's
            // sizes; in place the output alone) and the scratch vector's
            // capacity, all of `shape.dtype`, which `T` is; the thread
            // links keep the `Links` contract.
            unsafe { execute::<T, _>(&mut links, &task) }?;
        });
        self.watch
            .observe(rank_bytes, plan.host_bytes(), kernels, &meter);
        tracing::trace!(
            rank = self.rank,
            call = number,
            elapsed_us = started.elapsed().as_micros() as u64,
            "done"
        );
        Ok(())
    }

    fn wait_for(&self, what: &str, mut done: impl FnMut(&Group) -> bool) -> Result<(), CommError> {
        let deadline = Instant::now() + self.config.planning.timeout;
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
                self.config.planning.timeout,
            )?;
        }
    }

    fn send(&mut self, data: HostSlice<'_>, peer: Rank) -> Result<(), CommError> {
        self.group.check()?;
        let link = self.group.link(self.rank, peer, P2P_CHANNEL);
        let bytes = data.as_bytes().len();
        {
            let mut st = self.group.lock_link(&link);
            st.queue.push_back(Msg::Send {
                address: data.as_ptr() as usize,
                bytes,
                dtype: data.dtype(),
            });
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

    fn recv(&mut self, mut buffer: HostSliceMut<'_>, peer: Rank) -> Result<(), CommError> {
        let link = self.group.link(peer, self.rank, P2P_CHANNEL);
        self.wait_for(&format!("a send from rank {peer}"), |g| {
            !g.lock_link(&link).queue.is_empty()
        })?;
        let moving = self.group.begin_movement()?;
        let msg = self.group.lock_link(&link).queue.front().cloned();
        let Some(Msg::Send {
            address,
            bytes,
            dtype,
        }) = msg
        else {
            unreachable!("point-to-point links carry sends only")
        };
        let wanted = buffer.as_bytes_mut().len();
        let e = if dtype != buffer.dtype() {
            Some(CommError::Mismatch {
                call: self.group.lock_link(&link).popped,
                rank: self.rank,
                other: peer,
                expected: format!("send of {bytes} bytes of {dtype}"),
                got: format!("recv of {wanted} bytes of {}", buffer.dtype()),
            })
        } else if bytes != wanted {
            // In elements, like every other size check (the types agree).
            let size = dtype.size_bytes();
            Some(CommError::BufferSize {
                what: "recv buffer",
                got: wanted / size,
                needed: bytes.div_ceil(size),
            })
        } else {
            None
        };
        if let Some(e) = e {
            drop(moving);
            // The send cannot complete: fail the group so the sender does
            // not wait out its timeout.
            self.group.fail(self.rank, &e);
            return Err(e);
        }
        // SAFETY: the sender returns only after this message is popped, or,
        // if it gives up, only after taking the movement lock for writing,
        // which waits for our read guard; so its `bytes`-long slice stays
        // alive and unchanged while we copy. `buffer` is ours.
        unsafe {
            std::ptr::copy_nonoverlapping(address as *const u8, buffer.as_mut_ptr(), bytes);
        }
        {
            let mut st = self.group.lock_link(&link);
            st.queue.pop_front();
            st.count(link.link, bytes);
        }
        drop(moving);
        self.group.ring(peer);
        Ok(())
    }

    /// A barrier is a call like any other: its agreement is the barrier,
    /// and a rank that meanwhile makes another call is a mismatch.
    fn barrier(&mut self) -> Result<(), CommError> {
        let number = self.calls;
        self.group.check_before(number)?;
        self.calls += 1;
        let result = self.agree(number, barrier_signature(), None, &|| "barrier".to_owned());
        if let Err(e) = &result
            && !matches!(e, CommError::PeerFailed { .. })
        {
            self.group.fail(self.rank, e);
        }
        result
    }
}

impl CpuCommunicator {
    /// The kernel variants this rank's watch switched to, oldest first.
    pub fn kernel_switches(&self) -> &[Switch] {
        self.watch.switches()
    }
}

impl Drop for CpuCommunicator {
    fn drop(&mut self) {
        // Peers waiting for this rank's next call learn at once that it
        // will never come, instead of waiting out their timeout.
        self.group.depart(self.rank);
    }
}

impl Communicator for CpuCommunicator {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.group.n
    }

    fn execute(&mut self, call: Call<'_>) -> Result<(), CommError> {
        let number = self.calls;
        let (recorded, result) = match call.check(self.rank, self.group.n)? {
            Checked::Collective {
                shape,
                input,
                output,
            } => {
                self.recorder.begin(number, Some(&shape));
                let _span =
                    crate::trace::call_span(self.rank, number, &shape, self.group.n).entered();
                (true, self.collective(&shape, input, output))
            }
            Checked::Send { data, peer } => (false, self.send(data, peer)),
            Checked::Recv { buffer, peer } => (false, self.recv(buffer, peer)),
            Checked::Barrier => {
                self.recorder.begin(number, None);
                (true, self.barrier())
            }
        };
        if recorded {
            self.recorder.end(number, &result);
        }
        if result.is_ok() && self.watch.due() {
            return crate::comm::kernel_checkpoint(self, |c| &mut c.watch);
        }
        result
    }

    fn split(
        &mut self,
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<Box<dyn Communicator + Send>>, CommError> {
        CpuCommunicator::split(self, color, key).map(split::boxed)
    }

    fn aborter(&self) -> Option<crate::comm::Aborter> {
        let (group, rank) = (self.group.clone(), self.rank);
        Some(Arc::new(move |why: &str| group.quiesce(rank, &why)))
    }

    fn call_queue(&self) -> Option<crate::comm::CallQueueRef> {
        Some(self.recorder.queue())
    }
}
