//! `ProcessCommunicator`: one rank of a group whose ranks are processes.

use crate::transport::shm::heap::SharedBuffer;
use std::time::Instant;

use ferrocoll_core::Rank;
use ferrocoll_core::algorithms::Algorithm;
use ferrocoll_core::comm::{
    Call, Checked, CommError, Communicator, HostSlice, HostSliceMut, split,
};
use ferrocoll_core::comm::{Planned, Planner};
use ferrocoll_core::kernels::KernelWatch;
use ferrocoll_core::plan::{ExecutionPlan, OneShot};
use ferrocoll_core::trace::{FlightRecorder, Identity};
use ferrocoll_core::types::CallShape;
use ferrocoll_rendezvous::Store;

use crate::across_hosts::AcrossHosts;
use crate::agree::Agreement;
use crate::config::{ProcessConfig, TransportKind};
use crate::heap_plan::HeapPlanner;
use crate::layout::HostLayout;
use crate::setup::{SetupError, connect};
use crate::transport::{Transport, between, inside};
use ferrocoll_core::link::exec::{Task, execute};

/// One rank of a process group: the [`Communicator`](ferrocoll_core::comm::Communicator)
/// of ranks that are processes, on one host (shared memory) or many (TCP).
///
/// Failure semantics match the in-process executor: every wait is bounded
/// by [`ProcessConfig::planning`]`.timeout`; a rank that errors tells every peer, a
/// peer whose process dies is noticed (shared memory: its process is gone;
/// TCP: its connection closed), and every pending and later call then
/// returns [`CommError::PeerFailed`]. Inputs of out-of-place calls are
/// never written.
pub struct ProcessCommunicator {
    pub(crate) transport: Box<dyn Transport>,
    pub(crate) config: ProcessConfig,
    /// Which ranks share a host, found at setup.
    layout: HostLayout,
    /// The kinds of its links, in words.
    links: String,
    pub(crate) rank: Rank,
    pub(crate) n: u32,
    pub(crate) calls: u64,
    /// Point-to-point sends so far, per peer, to number their messages.
    pub(crate) p2p_sent: Vec<u64>,
    pub(crate) p2p_received: Vec<u64>,
    /// Selects and compiles every call's plan, the same in every process.
    pub(crate) planner: Planner,
    /// Plans calls whose buffers lie in every rank's shared heap (`None`
    /// without a heap).
    heap_planner: Option<HeapPlanner>,
    /// Calls that ran on the heap's plan so far.
    heap_plan_calls: u64,
    /// Every call is agreed by all ranks before its data moves.
    pub(crate) agreement: Agreement,
    /// A call of this communicator failed the group: later calls return
    /// the failure at once and announce nothing to the peers.
    poisoned: bool,
    /// Messages this rank sent by reference (zero copy) so far.
    by_reference: u64,
    /// Calls that took the one-shot protocol so far.
    pub(crate) one_shot_calls: u64,
    /// The last one-shot call's shape, its part and its signature: a
    /// training loop repeats its calls, and formatting and hashing them
    /// again took a tenth of a 4 KiB call.
    pub(crate) one_shot_memo: Option<(CallShape, std::sync::Arc<(OneShot, String)>)>,
    /// Rank 0 hosts the store; keep it for the life of the group (a split
    /// meets its new group in a scope of it).
    store: Store,
    /// This rank's last calls.
    recorder: FlightRecorder,
    /// Keeps the kernels of large calls honest.
    watch: KernelWatch,
    /// The group's MPI communicator, where it formed over MPI (a split
    /// splits it); last, so dropped after the transport.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    mpi: Option<crate::MpiGroup>,
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

    /// As [`abort`](Self::abort), with the reason peers and this rank's
    /// pending call report.
    pub fn abort_because(&self, reason: &str) {
        (self.abort)(reason);
    }
}

impl ProcessCommunicator {
    /// Form a group through `store` (see [`ferrocoll_rendezvous::Store::join`]):
    /// every one of `world_size` processes calls this with its own `rank`
    /// and the same `config`.
    pub fn connect(
        store: Store,
        rank: Rank,
        world_size: u32,
        config: &ProcessConfig,
    ) -> Result<Self, SetupError> {
        ProcessCommunicator::form(store, rank, world_size, config, None)
    }

    /// Form a group of every process of `MPI_COMM_WORLD` (collective;
    /// started by `mpirun` or any MPI launcher), ranked as MPI ranks
    /// them. Hosts link by MPI point-to-point on a duplicate of the world
    /// communicator (unless `config.net` says TCP), ranks of one host by
    /// shared memory (`config.transport`: `Mpi` sends every message
    /// through MPI). The setup meets in a store rank 0 serves, found by
    /// an MPI broadcast (see [`crate::mpi`]).
    #[cfg(feature = "mpi")]
    pub fn connect_mpi(mpi: &crate::mpi::Mpi, config: &ProcessConfig) -> Result<Self, SetupError> {
        let (group, store) = crate::MpiGroup::world(mpi, config.planning.timeout)?;
        let (rank, size) = (group.comm.rank(), group.comm.size());
        ProcessCommunicator::form(store, rank, size, config, Some(group))
    }

    fn form(
        mut store: Store,
        rank: Rank,
        world_size: u32,
        config: &ProcessConfig,
        mpi: Option<crate::MpiGroup>,
    ) -> Result<Self, SetupError> {
        let formed = connect(&mut store, rank, world_size, config, mpi.as_ref())?;
        let (transport, layout, links) = (formed.transport, formed.layout, formed.links);
        // Measure the host's kernels now, not inside the first call; after
        // the group formed, so a rank that dies meanwhile is a lost peer
        // (seen at once), not a store key that never appears.
        ferrocoll_core::kernels::calibration();
        crate::panic_note::install();
        let trace = config
            .trace
            .clone()
            .unwrap_or_else(ferrocoll_core::settings::trace_settings);
        let mut settings = config.planner_settings();
        let planning = &config.planning;
        // Nothing chosen by hand: across hosts, calls go by the network's
        // model where the group has one (rank 0's, the same everywhere),
        // else all-reduce goes hierarchical (the layout is the same on
        // every rank).
        if let (Some(model), Some(network)) = (&config.cluster, &formed.network) {
            let selector = model
                .0
                .selector(network, world_size, settings.slots_per_link)
                .map_err(|reason| SetupError::Cluster { reason })?;
            settings.selector = Some(selector);
        } else if planning.algorithm.is_none()
            && planning.schedule.is_none()
            && planning.selector.is_none()
        {
            settings.selector =
                AcrossHosts::for_layout(&layout, world_size, settings.slots_per_link);
        }
        Ok(ProcessCommunicator {
            transport,
            layout,
            links,
            config: config.clone(),
            rank,
            n: world_size,
            calls: 0,
            p2p_sent: vec![0; world_size as usize],
            p2p_received: vec![0; world_size as usize],
            planner: Planner::new(world_size, settings),
            heap_planner: HeapPlanner::new(world_size, config),
            heap_plan_calls: 0,
            agreement: Agreement::new(rank, world_size),
            poisoned: false,
            by_reference: 0,
            one_shot_calls: 0,
            one_shot_memo: None,
            store,
            mpi,
            watch: KernelWatch::new(config.planning.kernel_watch.clone()),
            recorder: {
                let mut r = FlightRecorder::with(
                    Identity {
                        group: format!("processes-{}", config.job_id.as_deref().unwrap_or("world")),
                        rank,
                        world_size,
                        executor: "processes",
                    },
                    trace.capacity,
                    trace.dir,
                );
                r.summarize_on_drop(trace.summary);
                r
            },
        })
    }

    /// This rank's flight recorder: its last calls
    /// (`ferrocoll_core::trace`).
    pub fn recorder(&self) -> &FlightRecorder {
        &self.recorder
    }

    /// Force (or, with `None`, stop forcing) the algorithm of later calls.
    /// Every rank must make the same change before the same call; a rank
    /// that does not is caught by the first message's header
    /// ([`CommError::Mismatch`] names both schedules).
    pub fn set_algorithm(&mut self, algorithm: Option<Algorithm>) {
        self.config.planning.algorithm = algorithm;
        self.planner.set_algorithm(algorithm);
        if let Some(h) = self.heap_planner.as_mut() {
            h.set_algorithm(algorithm);
        }
    }

    /// How a call of `shape` would run here, in the words of its debug
    /// log line: the one-shot protocol, or the plan's algorithm, channels,
    /// chunks and why it was chosen. Plans it as the call would (the plan
    /// is cached for it); runs nothing. The same on every rank.
    pub fn explain(&mut self, shape: &CallShape) -> Result<String, CommError> {
        if self.one_shot(shape) {
            return Ok(format!(
                "{} {} B {}: protocol=one-shot",
                shape.collective,
                shape.size_bytes(self.n),
                shape.dtype
            ));
        }
        self.planner.plan(shape).map(|p| p.describe())
    }

    /// A zeroed buffer of `len` elements in this rank's shared heap
    /// (`ProcessConfig::shared_heap_bytes`, shared memory only). Use it
    /// like a `Vec` — as the input or output of any call, or owned by an
    /// `AsyncCommunicator` call — and values the plan leaves in it go to
    /// peers by reference: they read them in place instead of through a
    /// slot copy. `Capacity` when the heap has no room; `Unsupported`
    /// without a heap.
    pub fn shared_buffer<T: ferrocoll_core::types::Element>(
        &self,
        len: usize,
    ) -> Result<SharedBuffer<T>, CommError> {
        let heap = self.transport.own_heap().ok_or_else(|| CommError::Unsupported {
            what: "shared buffers need the shared-memory transport with ProcessConfig::shared_heap_bytes > 0".to_owned(),
        })?;
        SharedBuffer::new(heap, len)
    }

    /// Messages this rank has sent by reference — a value in its shared
    /// heap — rather than copied through a slot: how to see that zero copy
    /// is in effect.
    pub fn messages_by_reference(&self) -> u64 {
        self.by_reference
    }

    /// Calls that took the one-shot protocol (small calls over shared
    /// memory) rather than a schedule.
    pub fn one_shot_calls(&self) -> u64 {
        self.one_shot_calls
    }

    /// Calls that ran with chunks larger than a slot because every rank's
    /// buffers lay in its shared heap, so every message went by reference.
    pub fn heap_plan_calls(&self) -> u64 {
        self.heap_plan_calls
    }

    /// Which ranks of the group share a host (found at setup: equal host
    /// keys and probe files read both ways in shared memory).
    pub fn layout(&self) -> &HostLayout {
        &self.layout
    }

    /// This rank's position among the ranks of its host, from the layout
    /// (what `LOCAL_RANK` should say; the layout, not the variable, is
    /// what the group trusts).
    pub fn local_rank(&self) -> u32 {
        self.layout.local_rank(self.rank)
    }

    /// The kinds of link this rank's group runs over, in words: `shm`,
    /// `tcp`, `mpi`, or `shm inside each of 2 hosts, mpi across` (what
    /// `TransportKind::Auto` became), with the number of hosts.
    pub fn links(&self) -> &str {
        &self.links
    }

    /// The transport asked for (see [`links`](Self::links) for what it became).
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

    /// Split the group (see [`Communicator::split`]): the ranks that pass
    /// the same `color` form a new process group of their own — its own
    /// transport (shared-memory segments or TCP connections), met through
    /// a scope of this group's store — ranked by `key` then by rank here;
    /// `None` gets no communicator. The new group has this group's
    /// settings and lives independently of this one.
    pub fn split(
        &mut self,
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<ProcessCommunicator>, CommError> {
        let call = self.calls;
        let setup = |e: SetupError| CommError::backend("process split", e);
        let Some(membership) = split::exchange(self, color, key)? else {
            return Ok(None);
        };
        // The members agreed; in a group formed over MPI they alone make
        // its communicator, ranked as the split ranked them.
        let mpi = self.split_mpi(&membership.members, membership.rank)?;
        let size = membership.members.len() as u32;
        let store = self
            .store
            .scoped(&format!("split{call}.{}", membership.color))
            .map_err(|e| setup(e.into()))?;
        let mut comm = ProcessCommunicator::form(store, membership.rank, size, &self.config, mpi)
            .map_err(setup)?;
        comm.recorder = self
            .recorder
            .split(call, membership.color, membership.rank, size);
        Ok(Some(comm))
    }

    /// The MPI communicator of `members` (ranks here, in their new order;
    /// this one at `rank`), where the group formed over MPI.
    #[cfg(feature = "mpi")]
    fn split_mpi(
        &mut self,
        members: &[Rank],
        rank: Rank,
    ) -> Result<Option<crate::MpiGroup>, CommError> {
        let Some(group) = &self.mpi else {
            return Ok(None);
        };
        let part = group
            .part(members, rank)
            .map_err(|e| CommError::backend("process split", SetupError::from(e)));
        self.fail_on(part).map(Some)
    }

    #[cfg(not(feature = "mpi"))]
    fn split_mpi(
        &mut self,
        _members: &[Rank],
        _rank: Rank,
    ) -> Result<Option<crate::MpiGroup>, CommError> {
        Ok(None)
    }

    /// Fail the group on an error this rank found, so no peer waits for it.
    fn fail_on<R>(&mut self, result: Result<R, CommError>) -> Result<R, CommError> {
        if let Err(e) = &result
            && !e.is_argument_error()
        {
            self.poisoned = true;
            match e {
                CommError::PeerFailed { rank, reason } => {
                    if *rank != self.rank {
                        crate::launch_note::peer_failed_first(self.config.job_id.as_deref());
                    }
                    self.transport.fail(*rank, reason)
                }
                other => self.transport.fail(self.rank, &other.to_string()),
            }
        }
        result.map_err(|e| self.name_host(e))
    }

    /// In a group across hosts, an error about a peer says which host the
    /// peer is on and which ranks share it (a host down takes them all).
    fn name_host(&self, e: CommError) -> CommError {
        let layout = &self.layout;
        let on = |rank: Rank| {
            (rank < self.n && layout.hosts() > 1 && !layout.same_host(rank, self.rank))
                .then(|| layout.describe_host(layout.host(rank)))
        };
        match e {
            CommError::PeerFailed { rank, reason } if !reason.contains(" (on host ") => {
                match on(rank) {
                    Some(host) => CommError::PeerFailed {
                        rank,
                        reason: format!("{reason} (on {host})"),
                    },
                    None => CommError::PeerFailed { rank, reason },
                }
            }
            other => other,
        }
    }

    fn run_plan(
        &mut self,
        shape: &CallShape,
        baseline: &Planned,
        input: Option<HostSlice<'_>>,
        mut output: HostSliceMut<'_>,
    ) -> Result<(), CommError> {
        let number = self.calls;
        self.calls += 1;
        self.check_channels(&baseline.plan)?;
        let output_base = output.as_mut_ptr() as usize;
        let input_base = input.map_or(output_base, |i| i.as_ptr() as usize);
        let offer = self.heap_offer(shape, baseline, input_base, output_base);
        let agreed = signature_of(&baseline.plan);
        let on_heap = self.agreement.agree_offering(
            self.transport.as_mut(),
            number,
            &agreed,
            offer.is_some(),
            self.config.planning.timeout,
        )?;
        let heap = offer.filter(|_| on_heap);
        self.heap_plan_calls += u64::from(heap.is_some());
        let planned = heap.as_ref().unwrap_or(baseline);
        let plan = &planned.plan;
        // Messages carry the plan that runs: were ranks ever to run
        // different ones, the first message would say so.
        let signature = match &heap {
            Some(h) => signature_of(&h.plan),
            None => agreed,
        };
        let kernels = self.watch.for_call(plan.host_bytes(), plan.chunk_bytes);
        self.recorder
            .planned(number, &plan.schedule, Some(planned.signature));
        tracing::debug!(
            rank = self.rank,
            call = number,
            transport = %self.config.transport,
            kernels = %kernels,
            chunks = if heap.is_some() { "heap (every rank's buffers in its shared heap)" } else { "slot" },
            "{}",
            planned.describe()
        );
        let started = Instant::now();
        let rank_bytes = plan.input_bytes + plan.output_bytes;
        let meter = self.watch.meter(rank_bytes, plan.host_bytes());
        ferrocoll_core::with_element_type!(shape.dtype, T => {
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
            // capacity, all of `shape.dtype`, which `T` is; the transport
            // keeps the `Links` contract.
            self.by_reference += unsafe { execute::<T, _>(self.transport.as_mut(), &task) }?;
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

    /// A schedule with more channels than the segments were laid out for
    /// is refused before anything is announced.
    fn check_channels(&self, plan: &ExecutionPlan) -> Result<(), CommError> {
        match self.transport.max_channel() {
            Some(max) if plan.channels > max => Err(CommError::Capacity {
                what: format!(
                    "schedule `{}` uses {} channels; this group was set up for {max} (raise ProcessConfig::max_channels)",
                    plan.schedule, plan.channels
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The heap's plan for this call, if this rank can offer it (see
    /// [`crate::heap_plan`]).
    fn heap_offer(
        &mut self,
        shape: &CallShape,
        baseline: &Planned,
        input_base: usize,
        output_base: usize,
    ) -> Option<Planned> {
        let plan = &baseline.plan;
        let mut buffers = vec![(output_base, plan.output_bytes as usize)];
        if plan.input_bytes > 0 {
            buffers.push((input_base, plan.input_bytes as usize));
        }
        let heap = self.heap_planner.as_mut()?.offer(
            self.transport.as_ref(),
            shape,
            baseline,
            &buffers,
        )?;
        self.check_channels(&heap.plan).is_ok().then_some(heap)
    }

    /// A barrier is a call's agreement alone: no rank returns before every
    /// rank has entered it, and a rank that makes another call instead is
    /// a mismatch.
    fn barrier(&mut self) -> Result<(), CommError> {
        let number = self.calls;
        self.calls += 1;
        self.agreement.agree(
            self.transport.as_mut(),
            number,
            "barrier",
            self.config.planning.timeout,
        )
    }
}

impl Communicator for ProcessCommunicator {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.n
    }

    fn execute(&mut self, call: Call<'_>) -> Result<(), CommError> {
        let checked = call.check(self.rank, self.n)?;
        // Inside a collective (or barrier) it is call `self.calls`;
        // point-to-point calls sit between collectives.
        let collective = matches!(checked, Checked::Collective { .. } | Checked::Barrier);
        let number = self.calls;
        let span = match &checked {
            Checked::Collective { shape, .. } => {
                self.recorder.begin(number, Some(shape));
                ferrocoll_core::trace::call_span(self.rank, number, shape, self.n)
            }
            Checked::Barrier => {
                self.recorder.begin(number, None);
                tracing::Span::none()
            }
            _ => tracing::Span::none(),
        };
        let _span = span.entered();
        if collective {
            self.transport.set_position(inside(self.calls));
        }
        let result = self.dispatch(checked);
        self.transport.set_position(between(self.calls));
        if collective {
            self.recorder.end(number, &result);
        }
        if result.is_ok() && self.watch.due() {
            return ferrocoll_core::comm::kernel_checkpoint(self, |c| &mut c.watch);
        }
        result
    }

    fn split(
        &mut self,
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<Box<dyn Communicator + Send>>, CommError> {
        ProcessCommunicator::split(self, color, key).map(split::boxed)
    }

    fn aborter(&self) -> Option<ferrocoll_core::comm::Aborter> {
        // Peers touch this process's memory (its shared heap) only while
        // one of its calls runs, and a failing call withdraws its posts
        // before it returns: failing the transport is all an abort needs.
        let abort = self.transport.aborter();
        Some(std::sync::Arc::new(move |why: &str| abort(why)))
    }

    fn call_queue(&self) -> Option<ferrocoll_core::comm::CallQueueRef> {
        Some(self.recorder.queue())
    }

    /// This rank's shared heap, where peers read a call's values in place
    /// (and where every rank's buffers lie in its heap, a call of several
    /// segments runs with the heap's larger chunks).
    fn lender(&self) -> Option<ferrocoll_core::comm::Lender> {
        let heap = self.transport.own_heap()?;
        Some(std::sync::Arc::new(move |bytes: usize| {
            let lent = SharedBuffer::<u8>::new(heap.clone(), bytes).ok()?;
            Some(ferrocoll_core::comm::LentMemory::new(lent))
        }))
    }
}

/// What ranks compare to agree on a plan. The hash comes before the
/// schedule's name, so it survives when a long name is cut to fit the
/// header.
fn signature_of(plan: &ExecutionPlan) -> String {
    format!("{} schedule={}", plan.signature(), plan.schedule)
}

impl ProcessCommunicator {
    /// Run one checked call; on an error other than a bad argument, fail
    /// the group (stamped with this call's position).
    fn dispatch(&mut self, checked: Checked<'_>) -> Result<(), CommError> {
        if self.poisoned {
            self.transport.check()?;
        }
        // A loss noticed during an earlier call fails this one; record it
        // as this rank's failure too, so peers hear of it from us. Calls
        // that agree first check inside the agreement, after looking at
        // the announcements: a rank that arrives after a peer failed the
        // group over this very call's mismatch reports the mismatch.
        let result = match checked {
            Checked::Collective {
                shape,
                input,
                output,
            } if self.one_shot(&shape) => self.run_one_shot(&shape, input, output),
            Checked::Collective {
                shape,
                input,
                output,
            } => self
                .planner
                .plan(&shape)
                .and_then(|planned| self.run_plan(&shape, &planned, input, output)),
            Checked::Send { data, peer } => {
                self.transport.check().and_then(|()| self.send(data, peer))
            }
            Checked::Recv { buffer, peer } => self
                .transport
                .check()
                .and_then(|()| self.recv(buffer, peer)),
            Checked::Barrier => self.barrier(),
        };
        self.transport.settle();
        self.fail_on(result)
    }
}

impl ProcessCommunicator {
    /// The kernel variants this rank's watch switched to, oldest first.
    pub fn kernel_switches(&self) -> &[ferrocoll_core::kernels::Switch] {
        self.watch.switches()
    }
}

impl Drop for ProcessCommunicator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Dropped while unwinding: the program did not finish its calls,
            // so peers must hear of a failure (and why), not a clean exit.
            let why = crate::panic_note::last()
                .map_or_else(|| "panicked".to_owned(), |m| format!("panicked: {m}"));
            self.transport.fail(self.rank, &why);
        } else {
            self.transport.depart();
        }
    }
}
