//! Turning one call's execution plan into device work.
//!
//! One thread (the last rank to arrive at the call) enqueues every rank's
//! instructions, so cross-rank dependencies are plain CUDA events recorded
//! before anyone waits on them. Each (rank, channel) has its own stream; an
//! instruction is one reduce-copy kernel per stretch of its value
//! ([`Instruction::stretches`]) that reads its local region and the
//! messages it receives and writes its local region and the messages it
//! sends. Messages live in per-link mailboxes of `slots` entries on the
//! receiver's device:
//!
//! - same device: the sender's kernel writes straight into the mailbox;
//! - another device with peer access: it writes a local outbox, then a peer
//!   copy moves it (NVLink or PCIe P2P);
//! - without peer access: outbox → pinned host memory → mailbox, both
//!   copies on the sender's stream (the seed article's CPU relay).
//!
//! The order comes from the plan's dependency graph ([`Dag`]): program
//! order on a channel, waits, message arrival and slot reuse. Lengths,
//! offsets, message numbers and slots are the plan's.

// Several arrays indexed by rank are walked together; indices read best.
#![allow(clippy::needless_range_loop)]

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{result, sys};
use ferrocoll_core::Rank;
use ferrocoll_core::flow::Link;
use ferrocoll_core::plan::dag::{Dag, Node};
use ferrocoll_core::plan::{ExecutionPlan, Instruction};
use ferrocoll_core::schedule::Buffer;

use crate::device::{self, Device};
use crate::error::CudaError;

/// One rank's buffers for a call (device pointers on its device).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RankBuffers {
    pub input: u64,
    pub output: u64,
}

/// What the enqueuer needs about the group's devices.
pub(crate) struct Devices<'a> {
    /// Device of each rank.
    pub devices: Vec<&'a Arc<Device>>,
    /// Stream of each rank and channel.
    pub streams: Vec<Vec<sys::CUstream>>,
    /// Whether rank `a`'s messages to rank `b` may go device to device
    /// (false: through the host relay).
    pub p2p: Vec<Vec<bool>>,
}

/// The call: its plan and every rank's buffers.
pub(crate) struct CallSpec<'a> {
    pub plan: &'a ExecutionPlan,
    pub buffers: Vec<RankBuffers>,
}

/// Memory and events of one call; freed once its work has completed.
#[derive(Default)]
pub(crate) struct Resources {
    device_memory: Vec<(Arc<Device>, u64)>,
    host_memory: Vec<(Arc<Device>, usize)>,
    events: Vec<(Arc<Device>, usize)>,
    /// Set when the work may still be running (a timeout): then nothing is
    /// freed, because the device could still touch it.
    pub leak: bool,
}

impl Drop for Resources {
    fn drop(&mut self) {
        if self.leak {
            return;
        }
        for (d, ptr) in self.device_memory.drain(..) {
            // SAFETY: the call's work has completed (the owner checked
            // every completion event) and nothing else holds the pointer.
            unsafe { device::free(&d, ptr) };
        }
        for (d, ptr) in self.host_memory.drain(..) {
            if d.bind().is_ok() {
                // SAFETY: pinned memory from malloc_host, unused once the
                // call completed.
                let _ = unsafe { result::free_host(ptr as *mut std::ffi::c_void) };
            }
        }
        for (d, ev) in self.events.drain(..) {
            if d.bind().is_ok() {
                // SAFETY: an event created here and no longer waited on.
                let _ = unsafe { result::event::destroy(ev as sys::CUevent) };
            }
        }
    }
}

/// Work enqueued for one call: the event that completes each rank's part.
pub(crate) struct Enqueued {
    pub completion: Vec<sys::CUevent>,
    pub resources: Resources,
}

/// Mailbox storage of one link.
struct Mailbox {
    /// On the receiver's device: `slots` slots of `slot_bytes`.
    inbox: u64,
    /// On the sender's device, when it differs.
    outbox: Option<u64>,
    /// Pinned host staging, when peer access is off.
    pinned: Option<u64>,
    slot_bytes: usize,
}

impl Mailbox {
    /// Byte offset of `slot` in each of the link's buffers.
    fn at(&self, slot: u32) -> u64 {
        (slot as usize * self.slot_bytes) as u64
    }
}

/// Make `stream` wait for `ev`.
fn wait(stream: sys::CUstream, ev: sys::CUevent) -> Result<(), CudaError> {
    // SAFETY: every event waited on was recorded on its stream before the
    // wait is enqueued; events and streams live until the call is freed.
    unsafe {
        result::stream::wait_event(stream, ev, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
    }?;
    Ok(())
}

fn event(device: &Arc<Device>, resources: &mut Resources) -> Result<sys::CUevent, CudaError> {
    device.bind()?;
    let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
    resources.events.push((device.clone(), ev as usize));
    Ok(ev)
}

/// Enqueue every rank's work of `call` on `devices`.
pub(crate) fn enqueue(devices: &Devices, call: &CallSpec) -> Result<Enqueued, CudaError> {
    let mut resources = Resources::default();
    match enqueue_into(devices, call, &mut resources) {
        Ok(completion) => Ok(Enqueued {
            completion,
            resources,
        }),
        Err(e) => {
            // Work already launched may still use these buffers.
            resources.leak = true;
            Err(e)
        }
    }
}

/// One call's enqueuing state.
struct Enqueuer<'a> {
    devices: &'a Devices<'a>,
    call: &'a CallSpec<'a>,
    dag: Dag,
    scratch: Vec<u64>,
    mailboxes: HashMap<Link, Mailbox>,
    events: Vec<Option<sys::CUevent>>,
}

fn enqueue_into(
    devices: &Devices,
    call: &CallSpec,
    res: &mut Resources,
) -> Result<Vec<sys::CUevent>, CudaError> {
    let dag = Dag::new(call.plan).map_err(|e| CudaError::Invalid(e.to_string()))?;
    let mut q = Enqueuer {
        events: vec![None; dag.nodes.len()],
        dag,
        scratch: Vec::new(),
        mailboxes: HashMap::new(),
        devices,
        call,
    };
    q.allocate(res)?;
    for i in 0..q.dag.order.len() {
        q.node(q.dag.order[i], res)?;
    }
    q.completion(res)
}

impl Enqueuer<'_> {
    fn dev(&self, r: Rank) -> &Arc<Device> {
        self.devices.devices[r as usize]
    }

    /// Scratch per rank, mailboxes per link (sized by its largest message).
    fn allocate(&mut self, res: &mut Resources) -> Result<(), CudaError> {
        let plan = self.call.plan;
        for r in 0..plan.world_size {
            let mut ptr = 0;
            if plan.scratch_bytes > 0 {
                ptr = self.dev(r).alloc(plan.scratch_bytes as usize)?;
                res.device_memory.push((self.dev(r).clone(), ptr));
            }
            self.scratch.push(ptr);
        }
        let slots = plan.slots_per_link as usize;
        for load in &plan.links {
            let link = load.link;
            // Slots start on 256-byte boundaries so the kernels' 16-byte
            // vector accesses stay aligned.
            let slot_bytes = (load.largest as usize).next_multiple_of(256);
            let bytes = slot_bytes.max(1) * slots;
            let (src, dst) = (self.dev(link.from).clone(), self.dev(link.to).clone());
            let inbox = dst.alloc(bytes)?;
            res.device_memory.push((dst.clone(), inbox));
            let (mut outbox, mut pinned) = (None, None);
            let relay = !self.devices.p2p[link.from as usize][link.to as usize];
            if src.ordinal != dst.ordinal || relay {
                let ptr = src.alloc(bytes)?;
                res.device_memory.push((src.clone(), ptr));
                outbox = Some(ptr);
                if relay {
                    src.bind()?;
                    // SAFETY: pinned host memory of `bytes`, freed with the call.
                    // Portable: the receiving device's context copies from it too.
                    let host = unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }?
                        as usize;
                    res.host_memory.push((src.clone(), host));
                    pinned = Some(host as u64);
                }
            }
            let mailbox = Mailbox {
                inbox,
                outbox,
                pinned,
                slot_bytes,
            };
            self.mailboxes.insert(link, mailbox);
        }
        Ok(())
    }

    /// The base of a rank's buffer.
    fn base(&self, r: Rank, buffer: Buffer) -> u64 {
        match buffer {
            Buffer::Input => self.call.buffers[r as usize].input,
            Buffer::Output => self.call.buffers[r as usize].output,
            Buffer::Scratch => self.scratch[r as usize],
        }
    }

    fn stream(&self, node: Node) -> sys::CUstream {
        self.devices.streams[node.rank as usize][node.channel as usize]
    }

    /// Wait for the dependencies on other streams, launch the
    /// instruction's kernels, move cross-device messages, record its event.
    fn node(&mut self, id: usize, res: &mut Resources) -> Result<(), CudaError> {
        let node = self.dag.nodes[id];
        let device = self.dev(node.rank).clone();
        device.bind()?;
        let stream = self.stream(node);
        for &d in &self.dag.deps[id] {
            let other = self.dag.nodes[d];
            if (other.rank, other.channel) != (node.rank, node.channel) {
                let ev = self.events[d].expect("dependencies are enqueued first");
                wait(stream, ev)?;
            }
        }
        let plan = self.call.plan;
        let ins =
            &plan.ranks[node.rank as usize].channels[node.channel as usize][node.index as usize];
        self.kernels(&device, stream, node, ins)?;
        self.relay(&device, stream, node, ins)?;
        let ev = event(&device, res)?;
        device.bind()?;
        // SAFETY: a live event recorded on this rank's live stream.
        unsafe { result::event::record(ev, stream) }?;
        self.events[id] = Some(ev);
        Ok(())
    }

    /// One reduce-copy kernel per stretch of the value.
    fn kernels(
        &self,
        device: &Device,
        stream: sys::CUstream,
        node: Node,
        ins: &Instruction,
    ) -> Result<(), CudaError> {
        let plan = self.call.plan;
        let elem = plan.element_bytes() as u64;
        let link = |from, to| Link {
            from,
            to,
            channel: node.channel,
        };
        for st in ins.stretches() {
            // Messages first, then the local region, as the CPU executor
            // combines them; but with more than eight inputs the local
            // region goes first, because in place it may be the step's own
            // output, which the folding passes overwrite after the first.
            let mut inputs: Vec<u64> = Vec::new();
            for m in &ins.recv {
                let mb = &self.mailboxes[&link(m.peer, node.rank)];
                inputs.push(mb.inbox + mb.at(m.slot) + st.offset);
            }
            if let (Some(r), Some(at)) = (&ins.read, st.read) {
                let local = self.base(node.rank, r.buffer) + at;
                if inputs.len() + 1 > crate::kernels::MAX_POINTERS {
                    inputs.insert(0, local);
                } else {
                    inputs.push(local);
                }
            }
            let mut outputs: Vec<u64> = Vec::new();
            if let (Some(w), Some(at)) = (&ins.write, st.write) {
                outputs.push(self.base(node.rank, w.buffer) + at);
            }
            for m in &ins.send {
                let mb = &self.mailboxes[&link(node.rank, m.peer)];
                outputs.push(mb.outbox.unwrap_or(mb.inbox) + mb.at(m.slot) + st.offset);
            }
            // SAFETY: every pointer addresses the stretch inside a buffer of
            // the call (user buffers checked by the caller, scratch and
            // mailboxes sized from the plan), reachable from this device
            // (its own, or a same-device mailbox); ordered by the waits.
            unsafe {
                device.reduce_copy(
                    stream,
                    plan.dtype,
                    plan.op,
                    &inputs,
                    &outputs,
                    (st.bytes / elem) as usize,
                )?
            };
        }
        Ok(())
    }

    /// Cross-device messages leave the outbox: by peer copy, or through
    /// pinned host memory where peer access is off.
    fn relay(
        &self,
        device: &Device,
        stream: sys::CUstream,
        node: Node,
        ins: &Instruction,
    ) -> Result<(), CudaError> {
        let bytes = ins.bytes as usize;
        for m in &ins.send {
            let link = Link {
                from: node.rank,
                to: m.peer,
                channel: node.channel,
            };
            let mb = &self.mailboxes[&link];
            let Some(outbox) = mb.outbox else { continue };
            if bytes == 0 {
                continue;
            }
            let at = mb.at(m.slot);
            let dst = self.dev(m.peer);
            match mb.pinned {
                None => {
                    // SAFETY: both ranges lie inside their mailboxes; peer
                    // access between the contexts is enabled or the driver
                    // stages the copy itself.
                    unsafe {
                        result::memcpy_peer_async(
                            dst.ctx.cu_ctx(),
                            mb.inbox + at,
                            device.ctx.cu_ctx(),
                            outbox + at,
                            bytes,
                            stream,
                        )
                    }?;
                }
                Some(host) => {
                    // SAFETY: pinned host slot and device slots of `bytes`
                    // inside their allocations; same stream, so in order.
                    unsafe {
                        sys::cuMemcpyDtoHAsync_v2(
                            (host + at) as *mut std::ffi::c_void,
                            outbox + at,
                            bytes,
                            stream,
                        )
                        .result()?;
                        sys::cuMemcpyHtoDAsync_v2(
                            mb.inbox + at,
                            (host + at) as *const std::ffi::c_void,
                            bytes,
                            stream,
                        )
                        .result()?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Completion per rank: channel 0 waits for the others, divides for
    /// `Avg` where the plan says, and records the rank's completion event.
    fn completion(&self, res: &mut Resources) -> Result<Vec<sys::CUevent>, CudaError> {
        let plan = self.call.plan;
        let mut completion = Vec::with_capacity(plan.ranks.len());
        for rp in &plan.ranks {
            let r = rp.rank;
            let device = self.dev(r).clone();
            device.bind()?;
            let stream = self.devices.streams[r as usize][0];
            for (c, list) in rp.channels.iter().enumerate().skip(1) {
                if list.is_empty() {
                    continue;
                }
                let last = self.dag.id(r, c as u32, list.len() as u32 - 1);
                let ev = self.events[last].expect("enqueued");
                wait(stream, ev)?;
            }
            for (buffer, p) in rp
                .divide
                .iter()
                .flat_map(|d| d.pieces.iter().map(move |p| (d.buffer, p)))
            {
                let ptr = self.base(r, buffer) + p.offset;
                let elems = p.bytes as usize / plan.element_bytes();
                // SAFETY: the plan's divide region of this rank's output,
                // after all of its channels (waited for above).
                unsafe {
                    device.divide(stream, plan.dtype, ptr, elems, u64::from(plan.world_size))?
                };
            }
            let ev = event(&device, res)?;
            device.bind()?;
            // SAFETY: a live event on a live stream.
            unsafe { result::event::record(ev, stream) }?;
            completion.push(ev);
        }
        Ok(completion)
    }
}
