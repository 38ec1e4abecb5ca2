//! [`AsyncCommunicator`]: any communicator driven by a progress thread of
//! its own, so a call starts now, returns a [`Work`], and communicates
//! while the caller computes.
//!
//! The calls that start are named as MPI names them, with an `i`
//! (`iall_reduce`, `ibroadcast`, `isend`, `ibarrier`, …), so they never
//! hide the blocking calls of the same collective, which an
//! `AsyncCommunicator` has too (it is a [`Communicator`]).
//!
//! Invariants:
//! - **Issue order is execution order.** One queue, one thread: calls run
//!   one after another in the order they were started, which is what keeps
//!   every rank's sequence of calls the same. Blocking calls made through
//!   the [`Communicator`] impl queue behind the started ones.
//! - **Buffers are owned while in flight.** A start call takes its buffers
//!   by value and [`Work::wait`] gives them back, so no other code can
//!   touch them meanwhile and dropping a handle cannot free them early.
//! - **A failed group fails everything after it.** Once a call fails with
//!   an error that breaks the group, every call still queued, and every
//!   later one, fails with that error without running.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::call::Call;
use super::error::CommError;
use super::p2p::{P2pOp, send_recv_batch};
use super::work::{Outcome, Work};
use super::{Aborter, CallQueueRef, Communicator, CommunicatorExt, Lender};
use crate::kernels::Reduce;
use crate::types::{Collective, Rank, ReduceOp};

/// A queued call: runs on the progress thread with the communicator and
/// the group's failure so far.
type Job<C> = Box<dyn FnOnce(&mut C, &mut Option<CommError>) + Send>;

/// A batch's buffers, each with its peer: the sends, then the receives.
pub type P2pBuffers<I, B> = (Vec<(I, Rank)>, Vec<(B, Rank)>);

/// A communicator whose calls run on a progress thread of their own: the
/// non-blocking face of any backend (threads, processes, or a
/// `Box<dyn Communicator + Send>` chosen at run time).
///
/// ```
/// use ferrocoll_core::comm::AsyncCommunicator;
/// use ferrocoll_core::cpu::{self, CpuConfig};
/// use ferrocoll_core::ReduceOp;
///
/// let comms = cpu::group(2, &CpuConfig::default()).unwrap();
/// let sums = std::thread::scope(|s| {
///     let ranks: Vec<_> = comms
///         .into_iter()
///         .map(|comm| s.spawn(move || {
///             let mut comm = AsyncCommunicator::new(comm)?;
///             let work = comm.iall_reduce(vec![1.0f32; 1024], ReduceOp::Sum);
///             // ... compute here while the all-reduce runs ...
///             let grads = work.wait()?;
///             Ok::<f32, ferrocoll_core::comm::CommError>(grads[0])
///         }))
///         .collect();
///     ranks.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
/// });
/// assert!(sums.iter().all(|s| *s.as_ref().unwrap() == 2.0));
/// ```
pub struct AsyncCommunicator<C: Communicator + Send + 'static> {
    rank: Rank,
    world_size: u32,
    /// The backend's abort, callable while its thread is blocked.
    aborter: Option<Aborter>,
    /// The backend's lender: it hands out memory from any thread.
    lender: Option<Lender>,
    /// The backend's flight recorder's queue: what waits to run.
    queue: Option<CallQueueRef>,
    jobs: Option<mpsc::Sender<Job<C>>>,
    worker: Option<JoinHandle<C>>,
}

impl<C: Communicator + Send + 'static> std::fmt::Debug for AsyncCommunicator<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCommunicator")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

impl<C: Communicator + Send + 'static> AsyncCommunicator<C> {
    /// Move `comm` onto a new progress thread
    /// ([`CommError::Capacity`] if the system refuses the thread).
    pub fn new(comm: C) -> Result<Self, CommError> {
        let (rank, world_size) = (comm.rank(), comm.world_size());
        let (aborter, lender, waiting) = (comm.aborter(), comm.lender(), comm.call_queue());
        let (jobs, queue) = mpsc::channel::<Job<C>>();
        let worker = std::thread::Builder::new()
            .name(format!("ferrocoll-progress-{rank}"))
            .spawn(move || progress(comm, queue))
            .map_err(|e| CommError::Capacity {
                what: format!("cannot start rank {rank}'s progress thread: {e}"),
            })?;
        Ok(AsyncCommunicator {
            rank,
            world_size,
            aborter,
            lender,
            queue: waiting,
            jobs: Some(jobs),
            worker: Some(worker),
        })
    }

    /// Wait for every started call, stop the progress thread and return
    /// the communicator.
    pub fn into_inner(mut self) -> C {
        self.jobs = None;
        let worker = self.worker.take().expect("joined only here and in drop");
        worker
            .join()
            .expect("the progress thread catches every panic of a call")
    }

    /// Start `f` on the progress thread with `buffers`, after every call
    /// started before it: the general form behind the typed starts, for
    /// any call of [`CommunicatorExt`] (gather, scatter, the `-v`
    /// collectives, ...). A panic in `f` fails this call and the calls
    /// after it; the buffers still come back.
    pub fn start<B, F>(&mut self, buffers: B, f: F) -> Work<B>
    where
        B: Send + 'static,
        F: FnOnce(&mut C, &mut B) -> Result<(), CommError> + Send + 'static,
    {
        self.start_as(
            || "a call started with AsyncCommunicator::start".into(),
            buffers,
            f,
        )
    }

    /// [`start`](Self::start), described to the flight recorder while it
    /// waits in the queue (`what` is only formatted where one records).
    fn start_as<B, F>(&mut self, what: impl FnOnce() -> String, buffers: B, f: F) -> Work<B>
    where
        B: Send + 'static,
        F: FnOnce(&mut C, &mut B) -> Result<(), CommError> + Send + 'static,
    {
        let queue = self.queue.clone();
        let token = queue.as_ref().map(|q| q.queued(what()));
        let (tx, rx) = mpsc::sync_channel(1);
        // The call runs inside whatever span started it (a gradient
        // bucket's): a timeline nests it there.
        let span = tracing::Span::current();
        let job: Job<C> = Box::new(move |comm, failed| {
            let _span = span.enter();
            if let Some(q) = &queue {
                q.started(token);
            }
            let mut buffers = buffers;
            let result = match failed {
                Some(e) => Err(e.clone()),
                None => catch_unwind(AssertUnwindSafe(|| f(comm, &mut buffers)))
                    .unwrap_or_else(|panic| Err(abort_on_panic(comm, panic))),
            };
            if let Err(e) = &result
                && !e.is_argument_error()
            {
                failed.get_or_insert_with(|| e.clone());
            }
            // The caller may have dropped its handle: nothing to tell.
            let _ = tx.send(Outcome { buffers, result });
        });
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(job));
        match sent {
            Some(Ok(())) => Work::pending(rx),
            _ => Work::lost(CommError::Capacity {
                what: "the communicator's progress thread has stopped".into(),
            }),
        }
    }

    /// Start an in-place all-reduce of `buffer`.
    pub fn iall_reduce<T, B>(&mut self, buffer: B, op: ReduceOp) -> Work<B>
    where
        T: Reduce,
        B: AsMut<[T]> + Send + 'static,
    {
        let mut buffer = buffer;
        let what = described::<T>("all-reduce", buffer.as_mut().len(), Some(op), " in place");
        self.start_as(what, buffer, move |c, b| {
            c.all_reduce_in_place(b.as_mut(), op)
        })
    }

    /// Start an out-of-place all-reduce of `input` into `output`.
    pub fn iall_reduce_into<T, I, O>(&mut self, input: I, output: O, op: ReduceOp) -> Work<(I, O)>
    where
        T: Reduce,
        I: AsRef<[T]> + Send + 'static,
        O: AsMut<[T]> + Send + 'static,
    {
        let what = described::<T>("all-reduce", input.as_ref().len(), Some(op), "");
        self.start_as(what, (input, output), move |c, (i, o)| {
            c.all_reduce(i.as_ref(), o.as_mut(), op)
        })
    }

    /// Start an in-place broadcast of `root`'s `buffer`.
    pub fn ibroadcast<T, B>(&mut self, buffer: B, root: Rank) -> Work<B>
    where
        T: Reduce,
        B: AsMut<[T]> + Send + 'static,
    {
        let mut buffer = buffer;
        let what = described::<T>("broadcast", buffer.as_mut().len(), None, "");
        self.start_as(what, buffer, move |c, b| {
            c.broadcast_in_place(b.as_mut(), root)
        })
    }

    /// Start an all-gather of every rank's `input` into `output` (`n` blocks).
    pub fn iall_gather_into<T, I, O>(&mut self, input: I, output: O) -> Work<(I, O)>
    where
        T: Reduce,
        I: AsRef<[T]> + Send + 'static,
        O: AsMut<[T]> + Send + 'static,
    {
        let what = described::<T>("all-gather", input.as_ref().len(), None, "");
        self.start_as(what, (input, output), |c, (i, o)| {
            c.all_gather(i.as_ref(), o.as_mut())
        })
    }

    /// Start a reduce-scatter of `input` (`n` blocks) into `output`.
    pub fn ireduce_scatter_into<T, I, O>(
        &mut self,
        input: I,
        output: O,
        op: ReduceOp,
    ) -> Work<(I, O)>
    where
        T: Reduce,
        I: AsRef<[T]> + Send + 'static,
        O: AsMut<[T]> + Send + 'static,
    {
        let what = described::<T>("reduce-scatter", input.as_ref().len(), Some(op), "");
        self.start_as(what, (input, output), move |c, (i, o)| {
            c.reduce_scatter(i.as_ref(), o.as_mut(), op)
        })
    }

    /// Start an all-to-all of `input` into `output` (`n` blocks each).
    pub fn iall_to_all_into<T, I, O>(&mut self, input: I, output: O) -> Work<(I, O)>
    where
        T: Reduce,
        I: AsRef<[T]> + Send + 'static,
        O: AsMut<[T]> + Send + 'static,
    {
        let what = described::<T>("all-to-all", input.as_ref().len(), None, "");
        self.start_as(what, (input, output), |c, (i, o)| {
            c.execute(Call::collective(
                Collective::AllToAll,
                ReduceOp::Sum,
                Some(i.as_ref().into()),
                o.as_mut().into(),
            ))
        })
    }

    /// Start sending `data` to `peer`. Calls run in issue order, so a send
    /// and a receive that must overlap (an exchange) go together in
    /// [`batch_isend_irecv`](Self::batch_isend_irecv), as with NCCL groups.
    pub fn isend<T, I>(&mut self, data: I, peer: Rank) -> Work<I>
    where
        T: Reduce,
        I: AsRef<[T]> + Send + 'static,
    {
        let what = described::<T>("send", data.as_ref().len(), None, "");
        let what = move || format!("{} to rank {peer}", what());
        self.start_as(what, data, move |c, d| c.send(d.as_ref(), peer))
    }

    /// Start receiving `buffer.len()` elements from `peer`.
    pub fn irecv<T, B>(&mut self, buffer: B, peer: Rank) -> Work<B>
    where
        T: Reduce,
        B: AsMut<[T]> + Send + 'static,
    {
        let mut buffer = buffer;
        let what = described::<T>("recv", buffer.as_mut().len(), None, "");
        let what = move || format!("{} from rank {peer}", what());
        self.start_as(what, buffer, move |c, b| c.recv(b.as_mut(), peer))
    }

    /// Start a batch of sends and receives that run as one call, in an
    /// order that cannot deadlock whatever the pattern (see
    /// [`send_recv_batch`]): torch's `batch_isend_irecv`.
    pub fn batch_isend_irecv<T, I, B>(
        &mut self,
        sends: Vec<(I, Rank)>,
        recvs: Vec<(B, Rank)>,
    ) -> Work<P2pBuffers<I, B>>
    where
        T: Reduce,
        I: AsRef<[T]> + Send + 'static,
        B: AsMut<[T]> + Send + 'static,
    {
        let what = format!(
            "batch of {} sends and {} receives",
            sends.len(),
            recvs.len()
        );
        self.start_as(
            || what,
            (sends, recvs),
            |c, (sends, recvs)| {
                let mut ops: Vec<P2pOp<'_>> = sends
                    .iter()
                    .map(|(d, peer)| P2pOp::send(d.as_ref(), *peer))
                    .collect();
                ops.extend(
                    recvs
                        .iter_mut()
                        .map(|(b, peer)| P2pOp::recv(b.as_mut(), *peer)),
                );
                send_recv_batch(c, ops)
            },
        )
    }

    /// Start a barrier.
    pub fn ibarrier(&mut self) -> Work<()> {
        self.start_as(|| "barrier".into(), (), |c, _| c.barrier())
    }
}

impl<C: Communicator + Send + 'static> Drop for AsyncCommunicator<C> {
    fn drop(&mut self) {
        // Unwinding: the program will not wait for its calls, so neither
        // should its peers.
        if std::thread::panicking() {
            self.abort();
        }
        // Closing the queue lets the thread finish what was started (every
        // wait is bounded by the backend's timeout, and fails at once after
        // an abort) and end.
        self.jobs = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

impl<C: Communicator + Send + 'static> Communicator for AsyncCommunicator<C> {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.world_size
    }

    /// Run `call` after every started call, and return when it is done.
    fn execute(&mut self, call: Call<'_>) -> Result<(), CommError> {
        // SAFETY: the borrow is extended only for the progress thread's
        // use of it, and this function returns only after that use is over:
        // `wait` returns once the job has run and sent its outcome, or once
        // the job was dropped without running (a closed queue), either way
        // never touching the buffers again.
        let call: Call<'static> = unsafe { std::mem::transmute::<Call<'_>, Call<'static>>(call) };
        let work = self.start_as(
            || "a blocking call".into(),
            Some(call),
            |c, call| {
                let call = call.take().expect("each job runs once");
                c.execute(call)
            },
        );
        work.wait().map(drop).map_err(|f| f.error)
    }

    fn split(
        &mut self,
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<Box<dyn Communicator + Send>>, CommError> {
        let work = self.start(None, move |c, out| {
            *out = c.split(color, key)?;
            Ok(())
        });
        work.wait().map_err(|f| f.error)
    }

    /// Abort the group at once, without queueing behind the started calls:
    /// they fail, and so do the peers' (see [`Communicator::aborter`]).
    /// A backend without an aborter is aborted from the progress thread,
    /// after the calls already started.
    fn abort(&mut self) {
        match &self.aborter {
            Some(abort) => abort("aborted"),
            None => drop(self.start((), |c, _| {
                c.abort();
                Ok(())
            })),
        }
    }

    fn aborter(&self) -> Option<Aborter> {
        self.aborter.clone()
    }

    fn lender(&self) -> Option<Lender> {
        self.lender.clone()
    }
}

/// How a typed start describes its call to the flight recorder while it
/// waits: `all-reduce f32 x1024 sum in place`.
fn described<T: Reduce>(
    name: &'static str,
    len: usize,
    op: Option<ReduceOp>,
    tail: &'static str,
) -> impl FnOnce() -> String {
    move || {
        let op = op.map_or_else(String::new, |op| format!(" {op}"));
        format!("{name} {} x{len}{op}{tail}", T::DATA_TYPE)
    }
}

/// The progress thread: run each job in turn until the queue closes.
fn progress<C: Communicator>(mut comm: C, queue: mpsc::Receiver<Job<C>>) -> C {
    let mut failed = None;
    while let Some(job) = next_job(&queue) {
        job(&mut comm, &mut failed);
    }
    comm
}

/// How long the progress thread keeps looking for the next call, yielding
/// its core between looks, before it blocks: calls often come one after
/// another (a gradient bucket a layer), and each wake-up of a blocked
/// thread — then of the peer that waited for it inside the call — costs
/// tens of microseconds or more. Measured with example 05 (16 buckets,
/// backward = 1 × comm, 2 vCPU), alternating in one series: the
/// overlapped step 6.1–6.3 ms without, 5.3–5.4 ms with.
const LINGER: std::time::Duration = std::time::Duration::from_micros(200);

/// The next call, or `None` once the handle is gone.
fn next_job<C: Communicator>(queue: &mpsc::Receiver<Job<C>>) -> Option<Job<C>> {
    let started = std::time::Instant::now();
    loop {
        match queue.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) if started.elapsed() < LINGER => {
                std::thread::yield_now();
            }
            Err(mpsc::TryRecvError::Empty) => return queue.recv().ok(),
        }
    }
}

/// A call panicked: peers may be inside the same call, so abort the group
/// now (naming the panic) rather than let them wait out their timeout.
fn abort_on_panic<C: Communicator>(
    comm: &mut C,
    panic: Box<dyn std::any::Any + Send>,
) -> CommError {
    let reason = panicked(panic);
    match comm.aborter() {
        Some(abort) => abort(&reason),
        None => comm.abort(),
    }
    CommError::PeerFailed {
        rank: comm.rank(),
        reason,
    }
}

/// Why a call failed, from its panic's payload.
fn panicked(panic: Box<dyn std::any::Any + Send>) -> String {
    format!(
        "a call started on the progress thread panicked: {}",
        super::panic_message(&*panic)
    )
}
