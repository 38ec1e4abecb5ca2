//! Turning one call of a verified schedule into device work.
//!
//! One thread (the last rank to arrive at the call) enqueues every rank's
//! steps, so cross-rank dependencies are plain CUDA events recorded before
//! anyone waits on them. Each (rank, channel) has its own stream; a step is
//! one reduce-copy kernel per chunk that reads its local slice and the
//! messages it receives and writes its local slice and the messages it
//! sends. Messages live in per-link mailboxes of `slots` entries on the
//! receiver's device:
//!
//! - same device: the sender's kernel writes straight into the mailbox;
//! - another device with peer access: it writes a local outbox, then a peer
//!   copy moves it (NVLink or PCIe P2P);
//! - without peer access: outbox → pinned host memory → mailbox, both
//!   copies on the sender's stream (the seed article's CPU relay).
//!
//! Step order comes from a topological sort of: program order on a
//! channel, `after` references, message arrival (sender before receiver)
//! and slot reuse (message `m` waits until message `m − slots` on the same
//! link was consumed). The verifier proves a schedule deadlock-free with
//! two slots per link, so with `slots ≥ 2` this order exists.

// Several arrays indexed by rank are walked together; indices read best.
#![allow(clippy::needless_range_loop)]

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{result, sys};
use ferrocoll_core::schedule::layout::Layout;
use ferrocoll_core::schedule::{Buffer, Schedule};
use ferrocoll_core::{Collective, DataType, Rank, ReduceOp};

use crate::device::{self, Device};
use crate::error::CudaError;

/// One rank's buffers for a call (device pointers on its device).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RankBuffers {
    pub input: u64,
    pub output: u64,
}

/// What the enqueuer needs about the group.
pub(crate) struct Fabric<'a> {
    /// Device of each rank.
    pub devices: Vec<&'a Arc<Device>>,
    /// Stream of each rank and channel.
    pub streams: Vec<Vec<sys::CUstream>>,
    /// Whether rank `a`'s messages to rank `b` may go device to device
    /// (false: through the host relay).
    pub p2p: Vec<Vec<bool>>,
}

/// The call.
pub(crate) struct CallSpec<'a> {
    pub schedule: &'a Schedule,
    pub in_place: bool,
    pub count: usize,
    pub layout: Layout,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub slots: u32,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Link {
    from: Rank,
    to: Rank,
    channel: u32,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    rank: Rank,
    channel: u32,
    segment: u32,
    step: u32,
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

fn event(device: &Arc<Device>, resources: &mut Resources) -> Result<sys::CUevent, CudaError> {
    device.bind()?;
    let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
    resources.events.push((device.clone(), ev as usize));
    Ok(ev)
}

/// Enqueue every rank's work of `call` on `fabric`.
pub(crate) fn enqueue(fabric: &Fabric, call: &CallSpec) -> Result<Enqueued, CudaError> {
    let mut resources = Resources::default();
    match enqueue_into(fabric, call, &mut resources) {
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

fn enqueue_into(
    fabric: &Fabric,
    call: &CallSpec,
    res: &mut Resources,
) -> Result<Vec<sys::CUevent>, CudaError> {
    let s = call.schedule;
    let n = s.world_size as usize;
    let segments = call.layout.segments();
    let elem = call.dtype.size_bytes();
    let slots = call.slots.max(2) as usize;

    // Nodes in program order per (rank, channel).
    let mut nodes: Vec<Node> = Vec::new();
    let mut order: Vec<Vec<Vec<usize>>> = vec![Vec::new(); n];
    for (r, program) in s.ranks.iter().enumerate() {
        for (c, steps) in program.channels.iter().enumerate() {
            let mut list = Vec::new();
            for segment in 0..segments {
                for i in 0..steps.len() {
                    list.push(nodes.len());
                    nodes.push(Node {
                        rank: r as Rank,
                        channel: c as u32,
                        segment,
                        step: i as u32,
                    });
                }
            }
            order[r].push(list);
        }
    }
    let step_of = |node: &Node| {
        &s.ranks[node.rank as usize].channels[node.channel as usize][node.step as usize]
    };

    // Messages: the k-th send on a link meets the k-th receive.
    let mut producers: HashMap<Link, Vec<usize>> = HashMap::new();
    let mut consumers: HashMap<Link, Vec<usize>> = HashMap::new();
    // Per node: the (link, message index) of each send and receive.
    let mut sends: Vec<Vec<(Link, usize)>> = vec![Vec::new(); nodes.len()];
    let mut recvs: Vec<Vec<(Link, usize)>> = vec![Vec::new(); nodes.len()];
    for r in 0..n {
        for (c, list) in order[r].iter().enumerate() {
            for &id in list {
                let st = step_of(&nodes[id]);
                for &q in &st.send_to {
                    let link = Link {
                        from: r as Rank,
                        to: q,
                        channel: c as u32,
                    };
                    let v = producers.entry(link).or_default();
                    sends[id].push((link, v.len()));
                    v.push(id);
                }
                for &p in &st.recv_from {
                    let link = Link {
                        from: p,
                        to: r as Rank,
                        channel: c as u32,
                    };
                    let v = consumers.entry(link).or_default();
                    recvs[id].push((link, v.len()));
                    v.push(id);
                }
            }
        }
    }
    // Elements in chunk `j` of a node's value: from its own slice, or, for
    // a step that only forwards, from the message it forwards.
    let mut lens: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (link, p) in &producers {
        if consumers.get(link).map_or(0, Vec::len) != p.len() {
            return Err(CudaError::Invalid(format!(
                "schedule `{}`: link {}->{} channel {} has unmatched messages",
                s.name, link.from, link.to, link.channel
            )));
        }
    }

    fn chunk_lens(
        id: usize,
        nodes: &[Node],
        s: &Schedule,
        layout: &Layout,
        recvs: &[Vec<(Link, usize)>],
        producers: &HashMap<Link, Vec<usize>>,
        lens: &mut Vec<Vec<usize>>,
    ) -> Vec<usize> {
        if lens[id].is_empty() {
            let node = nodes[id];
            let st =
                &s.ranks[node.rank as usize].channels[node.channel as usize][node.step as usize];
            let own = st.write.or(st.read);
            lens[id] = match (own, recvs[id].first()) {
                (Some(slice), _) => (0..st.chunks)
                    .map(|j| layout.chunk_range(node.segment, slice.chunk + j).len())
                    .collect(),
                (None, Some(&(link, m))) => chunk_lens(
                    producers[&link][m],
                    nodes,
                    s,
                    layout,
                    recvs,
                    producers,
                    lens,
                ),
                (None, None) => vec![0; st.chunks as usize],
            };
        }
        lens[id].clone()
    }
    for id in 0..nodes.len() {
        chunk_lens(id, &nodes, s, &call.layout, &recvs, &producers, &mut lens);
    }
    let message_elems = |id: usize| -> usize { lens[id].iter().sum() };

    // Dependencies: (node it waits for, whether on another stream).
    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for r in 0..n {
        for list in &order[r] {
            for w in list.windows(2) {
                deps[w[1]].push(w[0]);
            }
        }
    }
    for (id, node) in nodes.iter().enumerate() {
        let st = step_of(node);
        let len_of = |ch: u32| s.ranks[node.rank as usize].channels[ch as usize].len();
        for a in &st.after {
            let idx = node.segment as usize * len_of(a.channel) + a.step as usize;
            deps[id].push(order[node.rank as usize][a.channel as usize][idx]);
        }
        for &(link, m) in &recvs[id] {
            deps[id].push(producers[&link][m]);
        }
        for &(link, m) in &sends[id] {
            if m >= slots {
                deps[id].push(consumers[&link][m - slots]);
            }
        }
    }
    // Kahn's algorithm, smallest node first for a deterministic order.
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut dependants: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (id, ds) in deps.iter().enumerate() {
        for &d in ds {
            dependants[d].push(id);
        }
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..nodes.len()).filter(|&i| waiting[i] == 0).collect();
    let mut topo = Vec::with_capacity(nodes.len());
    while let Some(id) = ready.pop_first() {
        topo.push(id);
        for &d in &dependants[id] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                ready.insert(d);
            }
        }
    }
    if topo.len() != nodes.len() {
        return Err(CudaError::Invalid(format!(
            "schedule `{}` has no order its steps can be enqueued in with {slots} slots per link",
            s.name
        )));
    }

    // Memory: scratch per rank, mailboxes per link.
    let dev = |r: Rank| fabric.devices[r as usize];
    let scratch_elems = s.scratch_len(call.count);
    let mut scratch = vec![0u64; n];
    for r in 0..n {
        if scratch_elems > 0 {
            let ptr = dev(r as Rank).alloc(scratch_elems * elem)?;
            res.device_memory.push((dev(r as Rank).clone(), ptr));
            scratch[r] = ptr;
        }
    }
    let mut mailboxes: HashMap<Link, Mailbox> = HashMap::new();
    for (link, ids) in &producers {
        // Slots start on 256-byte boundaries so the kernels' 16-byte
        // vector accesses stay aligned.
        let slot_bytes =
            (ids.iter().map(|&i| message_elems(i)).max().unwrap_or(0) * elem).next_multiple_of(256);
        let bytes = slot_bytes.max(1) * slots;
        let (src, dst) = (dev(link.from), dev(link.to));
        let inbox = dst.alloc(bytes)?;
        res.device_memory.push((dst.clone(), inbox));
        let mut outbox = None;
        let mut pinned = None;
        let relay = !fabric.p2p[link.from as usize][link.to as usize];
        if src.ordinal != dst.ordinal || relay {
            let ptr = src.alloc(bytes)?;
            res.device_memory.push((src.clone(), ptr));
            outbox = Some(ptr);
            if relay {
                src.bind()?;
                // SAFETY: pinned host memory of `bytes`, freed with the call.
                // Portable: the receiving device's context copies from it too.
                let host =
                    unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }? as usize;
                res.host_memory.push((src.clone(), host));
                pinned = Some(host as u64);
            }
        }
        mailboxes.insert(
            *link,
            Mailbox {
                inbox,
                outbox,
                pinned,
                slot_bytes,
            },
        );
    }

    // Buffer base of a (physical) slice.
    let base = |r: usize, buffer: Buffer| match buffer {
        Buffer::Input => call.buffers[r].input,
        Buffer::Output => call.buffers[r].output,
        Buffer::Scratch => scratch[r],
    };
    let mut events: Vec<Option<sys::CUevent>> = vec![None; nodes.len()];
    for &id in &topo {
        let node = nodes[id];
        let r = node.rank as usize;
        let device = dev(node.rank);
        device.bind()?;
        let stream = fabric.streams[r][node.channel as usize];
        for &d in &deps[id] {
            let other = nodes[d];
            let same_stream = other.rank == node.rank && other.channel == node.channel;
            if !same_stream {
                let ev = events[d].expect("dependencies are enqueued first");
                // SAFETY: the event was recorded on its stream before this
                // wait is enqueued; both live until the call is freed.
                unsafe {
                    result::stream::wait_event(
                        stream,
                        ev,
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    )
                }?;
            }
        }
        let st = step_of(&node);
        let mut offset = 0usize;
        for j in 0..st.chunks {
            let chunk_ptr = |slice: ferrocoll_core::schedule::Slice| -> (u64, usize) {
                let (buffer, chunk) =
                    s.physical(call.in_place, node.rank, slice.buffer, slice.chunk + j);
                let range = call.layout.chunk_range(node.segment, chunk);
                (base(r, buffer) + (range.start * elem) as u64, range.len())
            };
            let len = lens[id][j as usize];
            // Messages first, then the local slice, as the CPU executor
            // combines them; but with more than eight inputs the local
            // slice goes first, because in place it may be the step's own
            // output, which the folding passes overwrite after the first.
            let mut inputs: Vec<u64> = Vec::new();
            for &(link, m) in &recvs[id] {
                let mb = &mailboxes[&link];
                inputs.push(mb.inbox + ((m % slots) * mb.slot_bytes + offset * elem) as u64);
            }
            if let Some(read) = st.read {
                let local = chunk_ptr(read).0;
                if inputs.len() + 1 > crate::kernels::MAX_POINTERS {
                    inputs.insert(0, local);
                } else {
                    inputs.push(local);
                }
            }
            let mut outputs: Vec<u64> = Vec::new();
            if let Some(write) = st.write {
                outputs.push(chunk_ptr(write).0);
            }
            for &(link, m) in &sends[id] {
                let mb = &mailboxes[&link];
                let at = ((m % slots) * mb.slot_bytes + offset * elem) as u64;
                outputs.push(mb.outbox.unwrap_or(mb.inbox) + at);
            }
            // SAFETY: every pointer addresses `len` elements inside a buffer
            // of the call (user buffers checked by the caller, scratch and
            // mailboxes sized above), reachable from this device (its own,
            // or a same-device mailbox); ordering by the waits above.
            unsafe { device.reduce_copy(stream, call.dtype, call.op, &inputs, &outputs, len)? };
            offset += len;
        }
        // Cross-device messages leave the outbox now.
        for &(link, m) in &sends[id] {
            let mb = &mailboxes[&link];
            let Some(outbox) = mb.outbox else { continue };
            let bytes = offset * elem;
            if bytes == 0 {
                continue;
            }
            let at = ((m % slots) * mb.slot_bytes) as u64;
            let dst = dev(link.to);
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
        let ev = event(device, res)?;
        device.bind()?;
        // SAFETY: a live event recorded on this rank's live stream.
        unsafe { result::event::record(ev, stream) }?;
        events[id] = Some(ev);
    }

    // Completion per rank: channel 0 waits for the others, divides for
    // avg, and records the rank's completion event.
    let mut completion = Vec::with_capacity(n);
    for r in 0..n {
        let device = dev(r as Rank);
        device.bind()?;
        let stream = fabric.streams[r][0];
        for list in order[r].iter().skip(1) {
            if let Some(&last) = list.last() {
                let ev = events[last].expect("enqueued");
                // SAFETY: recorded above; freed with the call.
                unsafe {
                    result::stream::wait_event(
                        stream,
                        ev,
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    )
                }?;
            }
        }
        if call.op == ReduceOp::Avg && s.collective.reduces() {
            let target = match s.collective {
                Collective::Reduce { root } if root != r as Rank => None,
                Collective::ReduceScatter if call.in_place => {
                    Some(call.buffers[r].output + (r * call.count * elem) as u64)
                }
                _ => Some(call.buffers[r].output),
            };
            if let Some(ptr) = target {
                // SAFETY: `count` elements of this rank's result, after all
                // of its channels (waited for above).
                unsafe { device.divide(stream, call.dtype, ptr, call.count, n as u64)? };
            }
        }
        let ev = event(device, res)?;
        device.bind()?;
        // SAFETY: a live event on a live stream.
        unsafe { result::event::record(ev, stream) }?;
        completion.push(ev);
    }
    Ok(completion)
}
