//! `bench --backend cpu --transport shm|tcp`: this process is one rank of
//! a group started by `ferrocoll launch`; rank 0 prints the table. Also
//! the rank-of-a-group wrapper the launched GPU backends time through.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use ferrocoll::Verified;
use ferrocoll::aligned::AlignedBuffer;
use ferrocoll::comm::{Call, CommError, Communicator};
use ferrocoll::conformance::KitElement;
use ferrocoll::cpu::CpuConfig;
use ferrocoll::network::Network;
use ferrocoll::process::{ProcessCommunicator, ProcessConfig, SharedBuffer, TransportKind};
use ferrocoll::topo::probe::membw::MemoryBandwidth;

use super::BenchArgs;
use super::buffers::{Pattern, try_filled};
use super::row::Row;
use super::run::{Backend, BenchRank};
use super::setup::custom_schedule;
use super::target::{Sweep, Target, host_bandwidth};

/// This process's rank of the CPU executor's process group.
pub(crate) struct Processes {
    comm: Mutex<ProcessCommunicator>,
    config: ProcessConfig,
    /// The MPI library, where the group formed over MPI.
    mpi: Option<String>,
}

/// Join the process group `launch` started (env:// variables), or in a
/// build with MPI the one `mpirun` started, over `args.transport`;
/// `args.ranks` becomes the group's size.
pub(crate) fn open(args: &mut BenchArgs) -> Result<Box<dyn Target>, String> {
    let transport = args.transport.unwrap_or(TransportKind::Auto);
    // The FERROCOLL_* settings (algorithm, timeout, job id) on the
    // built-in ones: a bad value is one error, not a warning from
    // `Default` and then the error.
    let env = ProcessConfig::builtin()
        .with_env()
        .map_err(|e| e.to_string())?;
    let network = match (args.net_gbps, &args.cluster) {
        (Some(gbit), _) => Some(Network::Rate(gbit)),
        (None, Some(file)) => Some(Network::File(file.clone())),
        (None, None) => ferrocoll::env::network_from_env().map_err(|e| e.to_string())?,
    };
    let mut config = ProcessConfig {
        cluster: network.map(ferrocoll::network::cluster_model),
        transport,
        net: args.net,
        max_message_bytes: args.max_chunk_bytes.unwrap_or(env.max_message_bytes),
        shared_heap_bytes: shared_heap_bytes(args, transport),
        ..env
    };
    let mut library = None;
    let comm = match over_mpi()? {
        Some(mpi) => {
            args.ranks = mpi.world_size()?;
            config.planning.schedule = custom_schedule(&args.algo, args.ranks)?;
            library = Some(mpi.library());
            let comm = mpi.connect(&config)?;
            super::terminate::abort_on_termination(comm.rank(), comm.abort_handle())?;
            comm
        }
        None => {
            let boot = ferrocoll::env::bootstrap_from_env(config.planning.timeout)
                .map_err(|e| e.to_string())?;
            args.ranks = boot.world_size;
            config.planning.schedule = custom_schedule(&args.algo, args.ranks)?;
            ProcessCommunicator::connect(boot.store, boot.rank, boot.world_size, &config)
                .map_err(|e| e.to_string())?
        }
    };
    Ok(Box::new(Processes {
        comm: Mutex::new(comm),
        config,
        mpi: library,
    }))
}

/// MPI, where this build has it and an MPI launcher started this process:
/// the group then forms over MPI (no `MASTER_ADDR` needed).
#[cfg(feature = "mpi")]
fn over_mpi() -> Result<Option<OverMpi>, String> {
    use ferrocoll::process::mpi::Mpi;
    if !Mpi::launched() {
        return Ok(None);
    }
    Mpi::init()
        .map(|mpi| Some(OverMpi(mpi)))
        .map_err(|e| e.to_string())
}

#[cfg(not(feature = "mpi"))]
fn over_mpi() -> Result<Option<OverMpi>, String> {
    Ok(None)
}

/// MPI, initialized for this process.
#[cfg(feature = "mpi")]
struct OverMpi(ferrocoll::process::mpi::Mpi);

#[cfg(feature = "mpi")]
impl OverMpi {
    fn world_size(&self) -> Result<u32, String> {
        self.0.world_size().map_err(|e| e.to_string())
    }

    fn library(&self) -> String {
        format!("{}, threads: {:?}", self.0.library(), self.0.threading())
    }

    fn connect(self, config: &ProcessConfig) -> Result<ProcessCommunicator, String> {
        ProcessCommunicator::connect_mpi(&self.0, config).map_err(|e| e.to_string())
    }
}

/// No MPI in this build: never made.
#[cfg(not(feature = "mpi"))]
enum OverMpi {}

#[cfg(not(feature = "mpi"))]
impl OverMpi {
    fn world_size(&self) -> Result<u32, String> {
        match *self {}
    }

    fn library(&self) -> String {
        match *self {}
    }

    fn connect(self, _config: &ProcessConfig) -> Result<ProcessCommunicator, String> {
        match self {}
    }
}

/// The largest shared heap the bench asks for, per rank.
const MAX_BENCH_HEAP: usize = 1 << 30;

/// Room for one size's input and output (the bench holds one size's
/// buffers at a time), when the transport has a shared heap and the run
/// wants one.
fn shared_heap_bytes(args: &BenchArgs, transport: TransportKind) -> usize {
    if args.no_shared_heap || !matches!(transport, TransportKind::Auto | TransportKind::Shm) {
        return 0;
    }
    let want = args
        .max_bytes
        .saturating_mul(2)
        .saturating_add(1 << 20)
        .next_multiple_of(4096);
    if want > MAX_BENCH_HEAP { 0 } else { want }
}

impl Target for Processes {
    fn custom(&self) -> Option<Arc<Verified>> {
        self.config.planning.schedule.clone()
    }

    fn prints(&self) -> bool {
        self.comm.lock().map_or(true, |c| c.rank() == 0)
    }

    fn describe(&self, args: &BenchArgs, _config: &CpuConfig, algorithm: &str) -> Vec<String> {
        let p = &self.config;
        let links = self
            .comm
            .lock()
            .map_or_else(|_| p.transport.to_string(), |c| c.links().to_owned());
        let mut lines = vec![format!(
            "# executor: cpu, {} processes over {links}, max message {} B, {} slots per link, timeout {:?}, algorithm {algorithm}",
            args.ranks, p.max_message_bytes, p.planning.slots_per_link, p.planning.timeout,
        )];
        if let Some(library) = &self.mpi {
            lines.push(format!(
                "# formed over MPI: {library} (messages over MPI links are MPI non-blocking sends on the group's own communicator)"
            ));
        }
        if let Some(model) = &p.cluster {
            lines.push(format!(
                "# network between hosts: {}; across hosts `auto` selects each size on rank 0's model of the cluster",
                model.0.settings()
            ));
        }
        if p.shared_heap_bytes > 0 {
            lines.push(format!(
                "# buffers in the shared heap ({} B per rank): peers read values in place (--no-shared-heap: copy through slots); calls that send only values lying in an input or output run with chunks up to {} B, not cut to the slot",
                p.shared_heap_bytes,
                p.heap_planner_settings().max_chunk_bytes
            ));
        }
        lines
    }

    fn memory_bandwidth(&self) -> Result<MemoryBandwidth, String> {
        Ok(host_bandwidth())
    }

    fn run_section(&self, sweep: &Sweep) -> Result<Vec<Row>, String> {
        self.comm
            .lock()
            .map_err(|_| "the communicator is poisoned")?
            .set_algorithm(sweep.config.planning.algorithm);
        let backend = Process {
            comm: &self.comm,
            schedule: self.config.planning.schedule.as_deref(),
        };
        sweep.on(&backend)
    }
}

/// The local rank of a process group: the CPU executor's over shm or TCP,
/// or NCCL's on this process's GPU.
pub(crate) struct Process<'a, C = ProcessCommunicator> {
    pub comm: &'a Mutex<C>,
    pub schedule: Option<&'a ferrocoll::Verified>,
}

impl<C: BenchRank + Send> Backend for Process<'_, C> {
    type Rank = C;

    fn run<R: Send>(
        &self,
        f: &(dyn Fn(&mut C) -> Result<R, CommError> + Sync),
    ) -> Result<Vec<Result<R, CommError>>, String> {
        let mut comm = self
            .comm
            .lock()
            .map_err(|_| "the communicator is poisoned")?;
        Ok(vec![f(&mut comm)])
    }

    fn schedule(&self) -> Option<&ferrocoll::Verified> {
        self.schedule
    }

    fn first_rank(&self) -> u32 {
        self.comm.lock().map_or(0, |c| c.rank())
    }

    fn one_rank_per_process(&self) -> bool {
        true
    }
}

/// A rank's buffer: in the group's shared heap when it has one (peers
/// read it in place), else private.
pub(crate) enum Held<T: KitElement> {
    Private(AlignedBuffer<T>),
    Shared(SharedBuffer<T>),
}

impl<T: KitElement> Held<T> {
    /// `len` elements, written by `write`.
    fn new(
        comm: &ProcessCommunicator,
        len: usize,
        write: impl FnOnce(&mut [T]),
    ) -> Result<Self, CommError> {
        let mut held = match comm.shared_buffer::<T>(len) {
            Ok(shared) => Held::Shared(shared),
            Err(CommError::Unsupported { .. }) => {
                Held::Private(try_filled(T::poison(), len, "buffer")?)
            }
            Err(e) => return Err(e),
        };
        write(held.slice_mut());
        Ok(held)
    }

    fn slice(&self) -> &[T] {
        match self {
            Held::Private(v) => v,
            Held::Shared(s) => s,
        }
    }

    fn slice_mut(&mut self) -> &mut [T] {
        match self {
            Held::Private(v) => v,
            Held::Shared(s) => s,
        }
    }
}

impl BenchRank for ProcessCommunicator {
    type Buffers<T: KitElement> = (Held<T>, Held<T>);

    fn place<T: KitElement>(
        &mut self,
        input: &Arc<AlignedBuffer<T>>,
        output: &Pattern<'_, T>,
    ) -> Result<(Held<T>, Held<T>), CommError> {
        let input = Held::new(self, input.len(), |b| b.copy_from_slice(input))?;
        let output = Held::new(self, output.len(), |b| output.write(0, b))?;
        Ok((input, output))
    }

    fn rewrite<T: KitElement>(
        &mut self,
        (_, placed): &mut (Held<T>, Held<T>),
        output: &Pattern<'_, T>,
    ) -> Result<(), CommError> {
        if placed.slice().len() == output.len() {
            output.write(0, placed.slice_mut());
        } else {
            // The old output goes back to the heap first: both at once
            // may not fit in it.
            *placed = Held::Private(try_filled(T::poison(), 0, "output")?);
            *placed = Held::new(self, output.len(), |b| output.write(0, b))?;
        }
        Ok(())
    }

    fn collective<T: KitElement>(
        &mut self,
        (input, output): &mut (Held<T>, Held<T>),
        collective: ferrocoll::Collective,
        op: ferrocoll::ReduceOp,
        in_place: bool,
        _count: usize,
    ) -> Result<(), CommError> {
        let input = (!in_place).then(|| input.slice().into());
        let call = Call::collective(collective, op, input, output.slice_mut().into());
        self.execute(call)
    }

    fn output<'b, T: KitElement>(
        &mut self,
        buffers: &'b (Held<T>, Held<T>),
    ) -> Result<Cow<'b, [T]>, CommError> {
        Ok(Cow::Borrowed(buffers.1.slice()))
    }

    /// One host linked by shared memory only: TCP or MPI ranks may sit on
    /// hosts whose clocks and memories differ (every rank has the same
    /// transport and layout: both are agreed at setup).
    fn shares_host_memory(&self) -> bool {
        matches!(self.transport(), TransportKind::Auto | TransportKind::Shm)
            && self.layout().hosts() == 1
    }
}
