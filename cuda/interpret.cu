// ferrocoll's device interpreter: one persistent launch per call and rank,
// one thread block per channel, each walking its channel's records of the
// device program (crates/cuda/src/program; the records, parameters and
// constants are cuda/records.h, generated from program/abi.rs) and moving
// data with the SMs' own loads and stores, into and out of peers' memory.
//
// The same source runs on CPU threads in every `cargo test`, built as host
// C++ with cuda/host.h (crates/cuda/src/program/host_kernel.rs).
//
// Per link, message g of the link's life moves in one of three ways, which
// both ends know from their records:
// - staged: the sender stores it into the receiver's slot g % slots once
//   `consumed >= g + 1 - slots`;
// - in the sender: the receiver reads it where the sender's buffer keeps
//   it, and the sender ends its call only once it has been consumed;
// - in the receiver: the sender stores it straight into the receiver's
//   destination.
// Either way the sender then publishes `posted = g + 1` in the receiver's
// window, and the receiver, once `posted >= g + 1`, combines and publishes
// `consumed = g + 1` in the sender's. Before its first store into (or wait
// on) a peer in a call, a block compares the peer's hello word for its
// channel with its own, and reads the addresses of the peer's buffers the
// peer published beside it.
//
// Everything that changes from call to call lives in device memory — the
// call number, the links' message totals, each channel's progress — or in
// the launch's parameters (the buffers), so a captured graph replays
// correctly and the host does no work between calls.

// ---- memory and timer primitives ------------------------------------------
// In PTX on the device; built as host C++ (FC_HOST, cuda/host.h) they are
// C++ atomics and the monotonic clock, and everything below is this same
// source. Flags are accessed at the launch's scope: .gpu when every peer
// and window is on this GPU, .sys otherwise.
#ifndef FC_HOST
__device__ __forceinline__ u64 fc_load_acquire(const u64 *p, u32 scope) {
    u64 v;
    if (scope == FC_SCOPE_GPU)
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    else
        asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void fc_store_release(u64 *p, u64 v, u32 scope) {
    if (scope == FC_SCOPE_GPU)
        asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    else
        asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// A counter published after `fc_fence`: the fence orders what came before
// it, so the stores themselves need not (one fence per instruction, not
// one per message).
__device__ __forceinline__ void fc_store_relaxed(u64 *p, u64 v, u32 scope) {
    if (scope == FC_SCOPE_GPU)
        asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    else
        asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void fc_fence(u32 scope) {
    if (scope == FC_SCOPE_GPU)
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    else
        asm volatile("fence.acq_rel.sys;" ::: "memory");
}

__device__ __forceinline__ u64 fc_now() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One 16-byte access whose two 64-bit halves each land whole (LL lines).
__device__ __forceinline__ void fc_store_pair(unsigned char *p, u64 lo, u64 hi) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
}

__device__ __forceinline__ void fc_load_pair(const unsigned char *p, u64 *lo, u64 *hi) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(*lo), "=l"(*hi) : "l"(p) : "memory");
}

// A word others write at any time (the board, the alarm, published
// buffer addresses), read and written whole.
__device__ __forceinline__ u64 fc_load_volatile(const u64 *p) { return *(const volatile u64 *)p; }
__device__ __forceinline__ void fc_store_volatile(u64 *p, u64 v) { *(volatile u64 *)p = v; }

// A spinning thread's pause: none on the GPU.
__device__ __forceinline__ void fc_pause() {}

// The launch's dynamic shared memory, where a block keeps its channel's
// records.
#define FC_RECORDS_MEMORY(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// ---- records and memory ---------------------------------------------------

// A channel's records: where its block reads them (its shared memory when
// they fit, else the rank's tables), indexed as in the tables.
struct FcRecords {
    const FcOp *ops;
    const FcEnd *ends;
    const FcPiece *pieces;
    const FcAfter *afters;
    u32 ops_first, ends_first, pieces_first, afters_first;
    __device__ __forceinline__ const FcOp &op(u32 i) const { return ops[i - ops_first]; }
    __device__ __forceinline__ const FcEnd &end(u32 i) const { return ends[i - ends_first]; }
    __device__ __forceinline__ const FcPiece &piece(u32 i) const { return pieces[i - pieces_first]; }
    __device__ __forceinline__ const FcAfter &after(u32 i) const { return afters[i - afters_first]; }
};

// What an instruction's data pass reads or writes: a region of a buffer
// (its pieces, offsets from `base`), or a slot, contiguous from `base`
// (no pieces); under LL a slot holds lines carrying `flag`.
struct FcOperand {
    unsigned char *base;
    FcSpan pieces;
    u32 flag, peer;
};

#define FC_OPERANDS (FC_MAX_RANKS + 1)
// Sources in combining order (received messages, then the local read) and
// destinations (the local write, then every message stored somewhere).
__shared__ FcOperand fc_src[FC_OPERANDS], fc_dst[FC_OPERANDS];
__shared__ int fc_nsrc, fc_ndst;
// One run of the data pass: each operand's address and contiguous bytes.
__shared__ unsigned char *fc_ptr[2 * FC_OPERANDS];
__shared__ u64 fc_len[2 * FC_OPERANDS];
// Per peer, greeted this call as a receiver [0] and as a sender [1], and
// the buffer addresses it published (null: not this call's).
__shared__ unsigned char fc_greeted[2][FC_MAX_RANKS];
__shared__ unsigned char *fc_peer_buffer[2][FC_MAX_RANKS][3];

__device__ __forceinline__ u32 fc_word(const FcCall &a, u32 channel, u32 peer) { return channel * a.world + peer; }
__device__ __forceinline__ u64 *fc_posted(const FcCall &a, u32 owner) { return (u64 *)(a.window[owner] + a.posted_at); }
__device__ __forceinline__ u64 *fc_consumed(const FcCall &a, u32 owner) { return (u64 *)(a.window[owner] + a.consumed_at); }
__device__ __forceinline__ u64 *fc_hello(const FcCall &a, u32 owner) { return (u64 *)(a.window[owner] + a.hello_at); }
__device__ __forceinline__ u64 *fc_alarm(const FcCall &a, u32 owner) { return (u64 *)(a.window[owner] + a.alarm_at); }
__device__ __forceinline__ u64 *fc_buffers(const FcCall &a, u32 owner, u32 channel) {
    return (u64 *)(a.window[owner] + a.buffers_at + FC_BUFFER_WORDS_BYTES * channel);
}

__device__ __forceinline__ unsigned char *fc_slot(const FcCall &a, u32 owner, u32 channel, u32 from, u64 g) {
    const u64 slot = (u64)fc_word(a, channel, from) * a.slots + g % a.slots;
    if (a.protocol == FC_LL) return a.window[owner] + a.ll_at + slot * a.ll_slot_bytes;
    return a.window[owner] + slot * a.slot_bytes;
}

// An LL message's flag, from its number g over the link's life: never 0
// (what an unused slot holds) and never the flag of the message that used
// the slot before (g - slots). Lines a shorter later message leaves keep an
// older flag, which equals this one only after lcm(2^32 - 1, slots)
// messages on the link (1.7e10 at 4 slots).
__device__ __forceinline__ u32 fc_ll_flag(u64 g) { return (u32)((g + 1) % 0xffffffffull) + 1; }

// ---- failures -------------------------------------------------------------

// Every rank's alarm up: a failure anywhere stops every rank, which polls
// only its own.
__device__ void fc_raise(const FcCall &a) {
    __threadfence_system();
    for (u32 r = 0; r < a.world; ++r) fc_store_volatile(fc_alarm(a, r), 1);
}

// Record why this rank failed the call in progress (the first reason
// stays), then raise the alarm.
__device__ void fc_fail(const FcCall &a, u32 reason, u32 about) {
    const u64 call = (u32)(a.state[blockIdx.x] + 1);
    atomicCAS_system(a.board + a.rank, 0ull, (u64)reason | ((u64)about << 8) | (call << 32));
    fc_raise(a);
}

// The first rank whose board word is set (the world size: none). The
// board is host memory: a read crosses PCIe, so it is read rarely.
__device__ u32 fc_first_failed(const FcCall &a) {
    for (u32 r = 0; r < a.world; ++r)
        if (fc_load_volatile(a.board + r)) return r;
    return a.world;
}

// Whether the call has failed. This rank's alarm (its own memory) is up
// once any rank's kernel failed; only the host writes a board word behind
// the kernels' backs (to abort a rank, or when it refuses a call its peers
// may already be in), so `board` polls read this rank's word and every
// eighth also the others'. A rank that learns of another's failure names
// the first failed rank on its own word and raises every alarm.
__device__ bool fc_failed(const FcCall &a, u64 polls) {
    if (fc_load_volatile(fc_alarm(a, a.rank)) == 0) {
        if (polls == 0) return false;
        const bool mine = fc_load_volatile(a.board + a.rank) != 0;
        if (!mine && (polls % 8 != 0 || fc_first_failed(a) == a.world)) return false;
    }
    if (fc_load_volatile(a.board + a.rank) == 0) {
        const u32 first = fc_first_failed(a);
        fc_fail(a, FC_PEER_FAILED, first < a.world ? first : a.rank);
    } else {
        fc_raise(a);
    }
    return true;
}

// Called on every poll of a wait: false once the call failed or the wait
// outlasted the timeout (measured on the GPU's global timer, so it holds
// whatever the clock rate). Every 1024 polls, never on the first miss: a
// flag a thread polls a few times pays nothing for it.
__device__ __forceinline__ bool fc_keep_waiting(const FcCall &a, u32 peer, u64 spins, u64 &start) {
    fc_pause();
    if (spins == 0) {
        start = fc_now();
        return true;
    }
    if (spins % 1024 != 1023) return true;
    if (fc_failed(a, spins / 1024 + 1)) return false;
    if (fc_now() - start > a.timeout_ns) {
        fc_fail(a, FC_TIMEOUT, peer);
        return false;
    }
    return true;
}

// Spin until ready(); false once the call failed.
template <typename Ready>
__device__ bool fc_wait(const FcCall &a, u32 peer, Ready ready) {
    u64 start = 0;
    for (u64 spins = 0; !ready(); ++spins)
        if (!fc_keep_waiting(a, peer, spins, start)) return false;
    return true;
}

// ---- agreement ------------------------------------------------------------

// This rank's buffers for the call on `channel`, then its hello there.
__device__ void fc_publish(const FcCall &a, u32 channel, u64 hello) {
    u64 *b = fc_buffers(a, a.rank, channel);
    for (int k = 0; k < 3; ++k) fc_store_volatile(b + k, (u64)a.buffer[k]);
    fc_store_release(fc_hello(a, a.rank) + channel, hello, a.scope);
}

// The peer's hello for this channel against this call's, once the peer
// has reached this call (call numbers wrap). Before the first store into
// the peer it must be this call's with this plan. Before the first wait
// on it, a peer already past this call also passes: it has finished this
// call, so whatever it sent here it sent after checking this rank's hello
// itself (a sender never passes a receiver that is ahead), and if it sent
// nothing the wait times out rather than takes another call's data. Such
// a peer keeps nothing for this rank to read in place (it would have
// waited for this rank to consume it), so its published buffers are not
// taken.
__device__ bool fc_greet(const FcCall &a, u32 channel, u32 peer, u64 hello, int sending) {
    const u64 *word = fc_hello(a, peer) + channel;
    const u32 call = (u32)(hello >> 32);
    if (!fc_wait(a, peer, [&] { return (int)((u32)(fc_load_acquire(word, a.scope) >> 32) - call) >= 0; }))
        return false;
    const u64 theirs = fc_load_acquire(word, a.scope);
    unsigned char **published = fc_peer_buffer[sending][peer];
    if (theirs == hello) {
        const u64 *b = fc_buffers(a, peer, channel);
        for (int k = 0; k < 3; ++k) published[k] = (unsigned char *)fc_load_volatile(b + k);
        return true;
    }
    if (!sending && (u32)(theirs >> 32) != call) {
        for (int k = 0; k < 3; ++k) published[k] = 0;
        return true;
    }
    fc_fail(a, FC_MISMATCH, peer);
    return false;
}

// ---- one instruction: waits ----------------------------------------------

struct FcProgress {
    u64 call, hello;
    u64 *done, *sent, *received;   // this rank's state: by channel, by link
};

// Wait `k` of the instruction: an instruction of another channel.
__device__ bool fc_after(const FcCall &a, const FcRecords &r, const FcOp &op, u32 k, const FcProgress &s) {
    const FcAfter w = r.after(op.after.first + k);
    // The same call (its number wraps), past the instruction.
    return fc_wait(a, a.rank, [&] {
        const u64 d = fc_load_acquire(s.done + w.channel, a.scope);
        return (d >> 32) == s.call && (u32)d > w.index;
    });
}

// Received message `k`: greet its sender, wait for it (LL lines carry
// their own flags: every thread waits for its own), and say where its
// bytes are.
__device__ bool fc_take(const FcCall &a, const FcRecords &r, const FcOp &op, u32 c, u32 k, const FcProgress &s) {
    const FcEnd e = r.end(op.recv.first + k);
    const u64 g = s.received[fc_word(a, c, e.peer)] + e.index;
    if (!fc_greeted[0][e.peer]) {
        if (!fc_greet(a, c, e.peer, s.hello, 0)) return false;
        fc_greeted[0][e.peer] = 1;
    }
    const u64 *posted = fc_posted(a, a.rank) + fc_word(a, c, e.peer);
    if (a.protocol != FC_LL && !fc_wait(a, e.peer, [&] { return fc_load_acquire(posted, a.scope) > g; }))
        return false;
    FcOperand o = {fc_slot(a, a.rank, c, e.peer, g), {0, 0}, a.protocol == FC_LL ? fc_ll_flag(g) : 0, e.peer};
    if (e.transfer == FC_IN_SENDER) {
        o.base = fc_peer_buffer[0][e.peer][e.remote.buffer];
        o.pieces = e.remote.pieces;
        // Kept in place by a peer that already left the call: impossible
        // unless the ranks disagree.
        if (!o.base) {
            fc_fail(a, FC_MISMATCH, e.peer);
            return false;
        }
    } else if (e.transfer == FC_IN_RECEIVER) {
        o.base = a.buffer[op.write.buffer];
        o.pieces = op.write.pieces;
    }
    fc_src[k] = o;
    return true;
}

// Sent message `k`: wait for a free slot if it is staged, greet its
// receiver, and say where its bytes go (nowhere when the receiver reads
// them in place).
__device__ bool fc_give(const FcCall &a, const FcRecords &r, const FcOp &op, u32 c, u32 k, const FcProgress &s) {
    const FcEnd e = r.end(op.send.first + k);
    const u64 g = s.sent[fc_word(a, c, e.peer)] + e.index;
    const u64 *consumed = fc_consumed(a, a.rank) + fc_word(a, c, e.peer);
    if (e.transfer == FC_SLOT && !fc_wait(a, e.peer, [&] { return fc_load_acquire(consumed, a.scope) + a.slots > g; }))
        return false;
    if (!fc_greeted[1][e.peer]) {
        if (!fc_greet(a, c, e.peer, s.hello, 1)) return false;
        fc_greeted[1][e.peer] = 1;
    }
    FcOperand o = {fc_slot(a, e.peer, c, a.rank, g), {0, 0}, a.protocol == FC_LL ? fc_ll_flag(g) : 0, e.peer};
    if (e.transfer == FC_IN_RECEIVER) {
        o.base = fc_peer_buffer[1][e.peer][e.remote.buffer];
        o.pieces = e.remote.pieces;
    } else if (e.transfer == FC_IN_SENDER) {
        o.base = 0;
    }
    fc_dst[k + 1] = o;
    return true;
}

// Every wait of an instruction, the block's threads taking one each.
__device__ bool fc_prepare(const FcCall &a, const FcRecords &r, const FcOp &op, u32 c, const FcProgress &s) {
    const u32 na = op.after.count, nr = op.recv.count, ns = op.send.count;
    bool go = true;
    for (u32 k = threadIdx.x; go && k < na + nr + ns; k += blockDim.x) {
        if (k < na)
            go = fc_after(a, r, op, k, s);
        else if (k < na + nr)
            go = fc_take(a, r, op, c, k - na, s);
        else
            go = fc_give(a, r, op, c, k - na - nr, s);
    }
    return go;
}

// The data pass's operands in order (thread 0, after the waits): the
// local read after the messages; the local write first among the
// destinations, unless the sender stored the value there already; no
// destination for a message its receiver reads in place.
__device__ void fc_operands(const FcCall &a, const FcRecords &r, const FcOp &op) {
    int n = (int)op.recv.count;
    if (op.read.buffer != FC_NONE) fc_src[n++] = {a.buffer[op.read.buffer], op.read.pieces, 0, a.rank};
    fc_nsrc = n;
    const bool landed = op.recv.count == 1 && r.end(op.recv.first).transfer == FC_IN_RECEIVER;
    int m = 0;
    if (op.write.buffer != FC_NONE && !landed) fc_dst[m++] = {a.buffer[op.write.buffer], op.write.pieces, 0, a.rank};
    for (u32 k = 0; k < op.send.count; ++k)
        if (fc_dst[k + 1].base) fc_dst[m++] = fc_dst[k + 1];
    fc_ndst = m;
}

// ---- one instruction: data ------------------------------------------------

// Where byte `at` of an operand's value lives, and how many bytes follow
// contiguously (a slot: all of them).
__device__ unsigned char *fc_locate(const FcRecords &r, const FcOperand &o, u64 at, u64 *run) {
    if (o.pieces.count == 0) {
        *run = ~0ull;
        return o.base + at;
    }
    for (u32 k = 0; k < o.pieces.count; ++k) {
        const FcPiece &p = r.piece(o.pieces.first + k);
        if (at < p.bytes) {
            *run = p.bytes - at;
            return o.base + p.offset + at;
        }
        at -= p.bytes;
    }
    *run = 0;
    return 0;
}

// Whether T combines in a wider type (half and bfloat16 in float): then
// every source is widened and the value rounded once at the end.
template <typename T, typename A> struct FcWide { static const bool value = true; };
template <typename T> struct FcWide<T, T> { static const bool value = false; };

__device__ __forceinline__ void fc_load_vectors(const unsigned char *p, u64 v, u64 n, uint4 *x) {
    const uint4 *q = (const uint4 *)p;
#pragma unroll
    for (int u = 0; u < FC_UNROLL; ++u) {
        const u64 i = v + (u64)u * blockDim.x;
        if (i < n) x[u] = q[i];
        else x[u] = uint4{0, 0, 0, 0};
    }
}

// `n` 16-byte vectors of one run: each thread loads FC_UNROLL independent
// vectors of a source before it combines them, so that many loads are in
// flight; then stores the value to every destination. A thread reads and
// writes the same offsets, so a source that is also a destination (in
// place) is safe. No `const __restrict__` on the loads: that would allow
// the non-coherent read-only path, and slots and peers' buffers change
// while the kernel runs.
template <typename T, template <typename> class Op>
__device__ void fc_vectors(int ns, int nd, u64 n) {
    typedef typename Acc<T>::type A;
    const int per = 16 / sizeof(T);
    for (u64 v = threadIdx.x; v < n; v += (u64)FC_UNROLL * blockDim.x) {
        uint4 x[FC_UNROLL];
        fc_load_vectors(fc_ptr[0], v, n, x);
        if (ns > 1 && FcWide<T, A>::value) {
            A acc[FC_UNROLL][16 / sizeof(T)];
#pragma unroll
            for (int u = 0; u < FC_UNROLL; ++u)
                for (int j = 0; j < per; ++j) acc[u][j] = Acc<T>::load(reinterpret_cast<const T *>(&x[u])[j]);
            for (int k = 1; k < ns; ++k) {
                fc_load_vectors(fc_ptr[k], v, n, x);
#pragma unroll
                for (int u = 0; u < FC_UNROLL; ++u)
                    for (int j = 0; j < per; ++j)
                        acc[u][j] = Op<A>::apply(acc[u][j], Acc<T>::load(reinterpret_cast<const T *>(&x[u])[j]));
            }
#pragma unroll
            for (int u = 0; u < FC_UNROLL; ++u)
                for (int j = 0; j < per; ++j) reinterpret_cast<T *>(&x[u])[j] = Acc<T>::store(acc[u][j]);
        } else if (ns > 1) {
            for (int k = 1; k < ns; ++k) {
                uint4 y[FC_UNROLL];
                fc_load_vectors(fc_ptr[k], v, n, y);
#pragma unroll
                for (int u = 0; u < FC_UNROLL; ++u) {
                    // In place in the vector: A is T here (the widening
                    // load and store are the identity).
                    T *acc = reinterpret_cast<T *>(&x[u]);
                    const T *b = reinterpret_cast<const T *>(&y[u]);
                    for (int j = 0; j < per; ++j)
                        acc[j] = Acc<T>::store(Op<A>::apply(Acc<T>::load(acc[j]), Acc<T>::load(b[j])));
                }
            }
        }
        for (int d = 0; d < nd; ++d) {
            uint4 *__restrict__ q = (uint4 *)fc_ptr[ns + d];
#pragma unroll
            for (int u = 0; u < FC_UNROLL; ++u) {
                const u64 i = v + (u64)u * blockDim.x;
                if (i < n) q[i] = x[u];
            }
        }
    }
}

// The same, element by element, for runs that are not 16-byte aligned
// (from byte `head` of the run).
template <typename T, template <typename> class Op>
__device__ void fc_elements(int ns, int nd, u64 head, u64 n) {
    typedef typename Acc<T>::type A;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
        T value = reinterpret_cast<const T *>(fc_ptr[0] + head)[i];
        if (ns > 1) {
            A acc = Acc<T>::load(value);
            for (int k = 1; k < ns; ++k) acc = Op<A>::apply(acc, Acc<T>::load(reinterpret_cast<const T *>(fc_ptr[k] + head)[i]));
            value = Acc<T>::store(acc);
        }
        for (int d = 0; d < nd; ++d) reinterpret_cast<T *>(fc_ptr[ns + d] + head)[i] = value;
    }
}

// One instruction's data pass (Simple), a contiguous run of every operand
// at a time; 16 bytes per access where every address of the run allows
// it (slots are 16-byte aligned and the plan's chunk boundaries are cut at
// 16 bytes, so most runs do).
template <typename T, template <typename> class Op>
__device__ void fc_move(const FcRecords &r, u64 bytes) {
    const int ns = fc_nsrc, nd = fc_ndst, all = fc_nsrc + fc_ndst;
    for (u64 at = 0; nd > 0 && at < bytes;) {
        for (int k = threadIdx.x; k < all; k += blockDim.x)
            fc_ptr[k] = fc_locate(r, k < ns ? fc_src[k] : fc_dst[k - ns], at, &fc_len[k]);
        __syncthreads();
        u64 run = bytes - at, bits = 0;
        for (int k = 0; k < all; ++k) {
            run = min(run, fc_len[k]);
            bits |= (u64)fc_ptr[k];
        }
        const u64 vectors = bits % 16 == 0 ? run / 16 : 0, head = vectors * 16;
        if (vectors) fc_vectors<T, Op>(ns, nd, vectors);
        if (run > head) fc_elements<T, Op>(ns, nd, head, (run - head) / sizeof(T));
        // Every thread is done with this run's addresses before the next.
        __syncthreads();
        at += run;
    }
}

// LL: one line is 8 data bytes with the message's flag beside each 4-byte
// half: two 64-bit words (data half low, flag high), stored and loaded as
// one 16-byte access whose 64-bit elements each land whole. A reader that
// sees the flag in both words has all 8 bytes — no fence and no separate
// announcement.
__device__ __forceinline__ void fc_ll_put(unsigned char *p, u64 data, u32 flag) {
    const u64 lo = (data & 0xffffffffull) | ((u64)flag << 32), hi = (data >> 32) | ((u64)flag << 32);
    fc_store_pair(p, lo, hi);
}

// Wait (this thread) for the line at `p` to carry `flag`; false once the
// call failed.
__device__ bool fc_ll_get(const FcCall &a, u32 peer, const unsigned char *p, u32 flag, u64 *data) {
    u64 start = 0;
    for (u64 spins = 0;; ++spins) {
        u64 lo, hi;
        fc_load_pair(p, &lo, &hi);
        if ((u32)(lo >> 32) == flag && (u32)(hi >> 32) == flag) {
            *data = (lo & 0xffffffffull) | (hi << 32);
            return true;
        }
        if (!fc_keep_waiting(a, peer, spins, start)) return false;
    }
}

// `n` (at most 8) bytes from byte `at` of a region operand's value, and
// back (assembled with shifts: a byte array would live in local memory).
__device__ u64 fc_gather8(const FcRecords &r, const FcOperand &o, u64 at, u64 n) {
    u64 v = 0, run;
    for (u64 k = 0; k < n;) {
        const unsigned char *p = fc_locate(r, o, at + k, &run);
        if (!run) break;
        for (u64 j = 0; j < run && k < n; ++j, ++k) v |= (u64)p[j] << (8 * k);
    }
    return v;
}

__device__ void fc_scatter8(const FcRecords &r, const FcOperand &o, u64 at, u64 n, u64 v) {
    u64 run;
    for (u64 k = 0; k < n;) {
        unsigned char *p = fc_locate(r, o, at + k, &run);
        if (!run) break;
        for (u64 j = 0; j < run && k < n; ++j, ++k) p[j] = (unsigned char)(v >> (8 * k));
    }
}

// Line `l` of a source: waited for on its slot, or read from a region.
__device__ bool fc_ll_read(const FcCall &a, const FcRecords &r, const FcOperand &o, u64 l, u64 n, u64 *v) {
    if (o.flag) return fc_ll_get(a, o.peer, o.base + 16 * l, o.flag, v);
    *v = fc_gather8(r, o, 8 * l, n);
    return true;
}

// One instruction's data pass under LL, every thread its own lines:
// sources (each line waited for by the thread that needs it) combined in
// order, then stored and put into every receiver's slot. False once the
// call failed.
template <typename T, template <typename> class Op>
__device__ bool fc_ll_move(const FcCall &a, const FcRecords &r, u64 bytes) {
    typedef typename Acc<T>::type A;
    const int ns = fc_nsrc, nd = fc_ndst;
    for (u64 l = threadIdx.x; nd > 0 && l < (bytes + 7) / 8; l += blockDim.x) {
        const u64 n = min((u64)8, bytes - 8 * l);
        const int per = (int)(n / sizeof(T));
        u64 value;
        if (!fc_ll_read(a, r, fc_src[0], l, n, &value)) return false;
        if (ns > 1) {
            A acc[8 / sizeof(T)];
            const T *first = reinterpret_cast<const T *>(&value);
            for (int e = 0; e < per; ++e) acc[e] = Acc<T>::load(first[e]);
            for (int k = 1; k < ns; ++k) {
                u64 next;
                if (!fc_ll_read(a, r, fc_src[k], l, n, &next)) return false;
                const T *b = reinterpret_cast<const T *>(&next);
                for (int e = 0; e < per; ++e) acc[e] = Op<A>::apply(acc[e], Acc<T>::load(b[e]));
            }
            T *out = reinterpret_cast<T *>(&value);
            for (int e = 0; e < per; ++e) out[e] = Acc<T>::store(acc[e]);
        }
        for (int d = 0; d < nd; ++d) {
            const FcOperand &o = fc_dst[d];
            if (o.flag)
                fc_ll_put(o.base + 16 * l, value, o.flag);
            else
                fc_scatter8(r, o, 8 * l, n, value);
        }
    }
    return true;
}

// ---- one instruction: announce --------------------------------------------

// Every thread's accesses are done (the barrier before); one fence makes
// them visible before the counters that announce them (thread 0).
__device__ void fc_announce(const FcCall &a, const FcRecords &r, const FcOp &op, u32 c, u32 i, const FcProgress &s) {
    fc_fence(a.scope);
    for (u32 k = 0; k < op.recv.count; ++k) {
        const FcEnd e = r.end(op.recv.first + k);
        const u64 g = s.received[fc_word(a, c, e.peer)] + e.index;
        fc_store_relaxed(fc_consumed(a, e.peer) + fc_word(a, c, a.rank), g + 1, a.scope);
    }
    for (u32 k = 0; k < op.send.count; ++k) {
        const FcEnd e = r.end(op.send.first + k);
        const u64 g = s.sent[fc_word(a, c, e.peer)] + e.index;
        fc_store_relaxed(fc_posted(a, e.peer) + fc_word(a, c, a.rank), g + 1, a.scope);
    }
    fc_store_relaxed(s.done + c, (s.call << 32) | (i + 1), a.scope);
}

// ---- a block's call -------------------------------------------------------

// `bytes` (a multiple of 8, 8-byte aligned: every record is) from `from`
// to `to`, the block's threads taking a word each.
__device__ __forceinline__ void fc_copy_words(unsigned char *to, const void *from, u64 bytes) {
    for (u64 w = threadIdx.x; w < bytes / 8; w += blockDim.x) ((u64 *)to)[w] = ((const u64 *)from)[w];
}

// The channel's records, copied into the block's shared memory when they
// fit what the launch reserved (every thread, then a barrier).
__device__ FcRecords fc_records(const FcCall &a, const FcChannel &ch, unsigned char *shared) {
    FcRecords r = {a.t.ops, a.t.ends, a.t.pieces, a.t.afters, 0, 0, 0, 0};
    const u64 at_ends = ((u64)ch.ops.count * sizeof(FcOp) + 15) / 16 * 16;
    const u64 at_pieces = at_ends + ((u64)ch.ends.count * sizeof(FcEnd) + 15) / 16 * 16;
    const u64 at_afters = at_pieces + ((u64)ch.pieces.count * sizeof(FcPiece) + 15) / 16 * 16;
    const u64 total = at_afters + ((u64)ch.afters.count * sizeof(FcAfter) + 15) / 16 * 16;
    if (total == 0 || total > a.records_shared) return r;
    fc_copy_words(shared, a.t.ops + ch.ops.first, (u64)ch.ops.count * sizeof(FcOp));
    fc_copy_words(shared + at_ends, a.t.ends + ch.ends.first, (u64)ch.ends.count * sizeof(FcEnd));
    fc_copy_words(shared + at_pieces, a.t.pieces + ch.pieces.first, (u64)ch.pieces.count * sizeof(FcPiece));
    fc_copy_words(shared + at_afters, a.t.afters + ch.afters.first, (u64)ch.afters.count * sizeof(FcAfter));
    __syncthreads();
    r.ops = (const FcOp *)shared;
    r.ends = (const FcEnd *)(shared + at_ends);
    r.pieces = (const FcPiece *)(shared + at_pieces);
    r.afters = (const FcAfter *)(shared + at_afters);
    r.ops_first = ch.ops.first;
    r.ends_first = ch.ends.first;
    r.pieces_first = ch.pieces.first;
    r.afters_first = ch.afters.first;
    return r;
}

// The end of a channel's call (thread 0): messages left in this rank's
// memory consumed, the links' totals carried to the next call, and the
// channel marked done. False once the call failed.
__device__ bool fc_finish(const FcCall &a, u32 c, const FcProgress &s) {
    for (u32 k = 0; k < a.t.sent_count; ++k) {
        const FcCount n = a.t.sent[k];
        if (n.word / a.world != c || !n.drain) continue;
        const u64 *consumed = fc_consumed(a, a.rank) + n.word;
        const u64 all = s.sent[n.word] + n.count;
        if (!fc_wait(a, n.word % a.world, [&] { return fc_load_acquire(consumed, a.scope) >= all; })) return false;
    }
    for (u32 k = 0; k < a.t.sent_count; ++k)
        if (a.t.sent[k].word / a.world == c) s.sent[a.t.sent[k].word] += a.t.sent[k].count;
    for (u32 k = 0; k < a.t.received_count; ++k)
        if (a.t.received[k].word / a.world == c) s.received[a.t.received[k].word] += a.t.received[k].count;
    fc_store_release(s.done + c, (s.call << 32) | FC_DONE, a.scope);
    return true;
}

// The call number carried to the next call (thread 0, once nothing of
// this call can fail: a failure names the call from it).
__device__ void fc_close(const FcCall &a, u32 c, const FcProgress &s) {
    a.state[c] = s.call;
    if (c == 0)
        for (u32 k = gridDim.x; k < a.max_channels; ++k) a.state[k] = s.call;
}

// avg's division, once every channel of the rank is done: each block a
// share of the region (thread 0 waits; false once the call failed).
__device__ bool fc_all_done(const FcCall &a, const FcProgress &s) {
    for (u32 k = 0; k < gridDim.x; ++k)
        if (!fc_wait(a, a.rank, [&] { return fc_load_acquire(s.done + k, a.scope) == ((s.call << 32) | FC_DONE); }))
            return false;
    return true;
}

template <typename T>
__device__ void fc_divide(const FcCall &a) {
    for (u32 k = 0; k < a.divide.pieces.count; ++k) {
        const FcPiece p = a.t.pieces[a.divide.pieces.first + k];
        T *data = reinterpret_cast<T *>(a.buffer[a.divide.buffer] + p.offset);
        const u64 n = p.bytes / sizeof(T);
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
            data[i] = Divide<T>::apply(data[i], a.world);
    }
}

template <typename T, template <typename> class Op>
__device__ void fc_interpret(const FcCall &a) {
    FC_RECORDS_MEMORY(fc_shared_records);
    const u32 c = blockIdx.x;
    const FcChannel ch = a.t.channels[c];
    const FcRecords r = fc_records(a, ch, fc_shared_records);
    FcProgress s;
    s.done = a.state + a.max_channels;
    s.sent = s.done + a.max_channels;
    s.received = s.sent + (u64)a.max_channels * a.world;
    // The previous call of this rank finished before this launch began
    // (stream order, and the communicator's event between its streams).
    s.call = (u32)(a.state[c] + 1);
    s.hello = (s.call << 32) | a.hash;
    // Nothing of a previous call's greetings or buffers carries over.
    for (u32 p = threadIdx.x; p < FC_MAX_RANKS; p += blockDim.x)
        for (int side = 0; side < 2; ++side) {
            fc_greeted[side][p] = 0;
            for (int k = 0; k < 3; ++k) fc_peer_buffer[side][p][k] = 0;
        }
    // A call queued behind a failed one does nothing: its rank's counters
    // stopped where the failure left them. Then this block's channel's
    // buffers and hello, and block 0 those of the channels this plan
    // leaves idle, so a peer whose plan uses them still finds this call's.
    // Whether to stop is agreed at each barrier (`__syncthreads_or`), so
    // every thread leaves at the same barrier and none waits at one the
    // others skipped.
    int stop = 0;
    if (threadIdx.x == 0) {
        stop = fc_failed(a, 0);
        if (!stop) fc_publish(a, c, s.hello);
        if (!stop && c == 0)
            for (u32 k = gridDim.x; k < a.max_channels; ++k) fc_publish(a, k, s.hello);
    }
    if (__syncthreads_or(stop)) return;
    for (u32 i = 0; i < ch.ops.count; ++i) {
        const FcOp &op = r.op(ch.ops.first + i);
        if (__syncthreads_or(!fc_prepare(a, r, op, c, s))) return;
        if (threadIdx.x == 0) fc_operands(a, r, op);
        __syncthreads();
        bool go = true;
        if (a.protocol == FC_LL)
            go = fc_ll_move<T, Op>(a, r, op.bytes);
        else
            fc_move<T, Op>(r, op.bytes);
        if (__syncthreads_or(!go)) return;
        if (threadIdx.x == 0) fc_announce(a, r, op, c, i, s);
    }
    if (threadIdx.x == 0) stop = !fc_finish(a, c, s) || (a.divide.buffer != FC_NONE && !fc_all_done(a, s));
    if (__syncthreads_or(stop)) return;
    if (threadIdx.x == 0) fc_close(a, c, s);
    if (a.divide.buffer != FC_NONE) fc_divide<T>(a);
}

// One entry point: the interpreter for one reduction and element type
// (avg runs the sum; its division travels in the parameters). The host
// appends the entries it compiles (crates/cuda/src/kernels.rs): one per
// module on a GPU, compiled on first use; all forty for the tests.
#define FC_ENTRY(OP, FUNCTOR, NAME, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(FC_THREADS, FC_MIN_BLOCKS)                                  \
        ferrocoll_run_##OP##_##NAME(const __grid_constant__ FcCall a) { fc_interpret<T, FUNCTOR>(a); }
