// ferrocoll's device interpreter (CUDA executor v2, in progress): one
// persistent launch per call and rank, one thread block per channel, each
// walking its channel's records of the device program
// (crates/cuda/src/program/mod.rs, whose #[repr(C)] structs these mirror)
// and moving data with stores straight into peers' inboxes.
//
// The protocol is the one crates/cuda/src/program/emulate.rs runs on CPU
// threads in every `cargo test`: per link, the sender stores message g into
// the receiver's slot g % slots once `consumed >= g + 1 - slots`, then
// publishes `posted = g + 1` in the receiver's memory; the receiver combines
// once `posted >= g + 1`, then publishes `consumed = g + 1` in the
// sender's. Before its first store into a peer in a call, a block compares
// the peer's hello word for its channel with its own.
//
// Compiled with reduce.cu (its Acc, Sum, Prod, Min and Max) by NVRTC;
// `cargo test` checks that it compiles for sm_80 and sm_90. It has not yet
// run on a GPU.

typedef unsigned int u32;

struct FcSpan { u32 first, count; };
struct FcLocal { u32 buffer; FcSpan pieces; };   // buffer 3: none
struct FcPiece { u64 offset, bytes; };
struct FcEnd { u32 peer; u64 index; };
struct FcAfter { u32 channel, index; };
struct FcOp { u64 bytes; FcSpan recv; FcLocal read; FcLocal write; FcSpan send; FcSpan after; };
struct FcCount { u64 word, count; };

#define FC_NONE 3u
#define FC_MAX_RANKS 64
// One message per peer and instruction at most (program::MAX_RANKS).
#define FC_MAX_FANIN FC_MAX_RANKS
#define FC_MAX_FANOUT FC_MAX_RANKS

// This rank's program, in its device memory.
struct FcTables {
    const FcSpan *channels;
    const FcOp *ops;
    const FcPiece *pieces;
    const FcEnd *ends;
    const FcAfter *afters;
    const FcCount *sent;
    u32 sent_count;
    const FcCount *received;
    u32 received_count;
};

// Every rank's shared memory, mapped into this rank's address space.
struct FcPeers {
    unsigned char *inbox[FC_MAX_RANKS];
    u64 *posted[FC_MAX_RANKS];     // by (channel, sender)
    u64 *consumed[FC_MAX_RANKS];   // by (channel, receiver)
    u64 *hello[FC_MAX_RANKS];      // by channel
};

struct FcCall {
    FcTables t;
    FcPeers peers;
    unsigned char *buffer[3];      // input, output, scratch
    u64 *base_sent;                // by link word, this rank's; blocks add their call's counts
    u64 *base_received;
    u64 *done;                     // by channel: (call << 32) | instructions fired
    u64 hello;                     // (call << 32) | the plan hash's low half
    u32 rank, world, slots, max_channels;
    u64 slot_bytes;
    int *failed;                   // this rank's: 1 mismatch, 2 timeout, 3 a peer failed
    int *peer_failed[FC_MAX_RANKS];
    u64 spin_limit;                // polls before a wait gives up
};

__device__ __forceinline__ u64 fc_load_acquire(const u64 *p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void fc_store_release(u64 *p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ u32 fc_word(const FcCall &a, u32 channel, u32 peer) { return channel * a.world + peer; }

__device__ __forceinline__ u64 fc_slot(const FcCall &a, u32 channel, u32 from, u64 g) {
    return ((u64)fc_word(a, channel, from) * a.slots + g % a.slots) * a.slot_bytes;
}

// Whether this rank or a peer has failed the call.
__device__ bool fc_failed(const FcCall &a) {
    if (*(volatile int *)a.failed) return true;
    for (u32 r = 0; r < a.world; ++r)
        if (*(volatile int *)a.peer_failed[r]) {
            atomicCAS(a.failed, 0, 3);
            return true;
        }
    return false;
}

// Spin (thread 0) until ready(); false once a rank failed or the wait ran out.
template <typename Ready>
__device__ bool fc_wait(const FcCall &a, Ready ready) {
    for (u64 spins = 0; !ready(); ++spins) {
        if (spins % 1024 == 0) {
            if (fc_failed(a)) return false;
            if (spins > a.spin_limit) {
                atomicCAS(a.failed, 0, 2);
                return false;
            }
        }
    }
    return true;
}

// The peer's hello for this channel must be this call's with this plan.
__device__ bool fc_greet(const FcCall &a, u32 channel, u32 peer) {
    const u64 *word = a.peers.hello[peer] + channel;
    const u32 call = (u32)(a.hello >> 32);
    if (!fc_wait(a, [&] { return (int)((u32)(fc_load_acquire(word) >> 32) - call) >= 0; })) return false;
    if (fc_load_acquire(word) == a.hello) return true;
    atomicCAS(a.failed, 0, 1);
    return false;
}

// Where byte `at` of a region's value lives, and how many bytes follow
// contiguously.
__device__ unsigned char *fc_locate(const FcCall &a, const FcLocal &r, u64 at, u64 *run) {
    for (u32 k = 0; k < r.pieces.count; ++k) {
        const FcPiece &p = a.t.pieces[r.pieces.first + k];
        if (at < p.bytes) {
            *run = p.bytes - at;
            return a.buffer[r.buffer] + p.offset + at;
        }
        at -= p.bytes;
    }
    *run = 0;
    return 0;
}

// One instruction's data pass, every thread of the block: the received
// messages in order, then the local read, combined; stored to the write
// region and into every receiver's slot. Runs of contiguous bytes are
// taken where the read and write pieces both hold.
template <typename T, template <typename> class Op>
__device__ void fc_move(const FcCall &a, const FcOp &op, const T *const *in, int fanin, T *const *out, int fanout) {
    typedef typename Acc<T>::type A;
    for (u64 at = 0; at < op.bytes;) {
        u64 run = op.bytes - at, r;
        const T *local = 0;
        T *store = 0;
        if (op.read.buffer != FC_NONE) {
            local = (const T *)fc_locate(a, op.read, at, &r);
            run = min(run, r);
        }
        if (op.write.buffer != FC_NONE) {
            store = (T *)fc_locate(a, op.write, at, &r);
            run = min(run, r);
        }
        const u64 base = at / sizeof(T), n = run / sizeof(T);
        for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
            T value;
            if (fanin == 0) {
                value = local[i];
            } else {
                A acc = Acc<T>::load(in[0][base + i]);
                for (int k = 1; k < fanin; ++k) acc = Op<A>::apply(acc, Acc<T>::load(in[k][base + i]));
                if (local) acc = Op<A>::apply(acc, Acc<T>::load(local[i]));
                value = (fanin == 1 && !local) ? in[0][base + i] : Acc<T>::store(acc);
            }
            if (store) store[i] = value;
            for (int k = 0; k < fanout; ++k) out[k][base + i] = value;
        }
        at += run;
    }
}

template <typename T, template <typename> class Op>
__device__ void fc_interpret(const FcCall &a) {
    const u32 c = blockIdx.x;
    const FcSpan span = a.t.channels[c];
    const u64 call = a.hello >> 32;
    __shared__ const T *in[FC_MAX_FANIN];
    __shared__ T *out[FC_MAX_FANOUT];
    __shared__ int go;
    __shared__ unsigned char greeted[FC_MAX_RANKS];
    for (u32 r = threadIdx.x; r < FC_MAX_RANKS; r += blockDim.x) greeted[r] = 0;
    // Hello first: this block's channel, and block 0 the channels this plan
    // leaves idle, so a peer whose plan uses them still finds this call's.
    if (threadIdx.x == 0) {
        fc_store_release(a.peers.hello[a.rank] + c, a.hello);
        if (c == 0)
            for (u32 k = gridDim.x; k < a.max_channels; ++k) fc_store_release(a.peers.hello[a.rank] + k, a.hello);
    }
    __syncthreads();
    for (u32 i = 0; i < span.count; ++i) {
        const FcOp &op = a.t.ops[span.first + i];
        if (threadIdx.x == 0) {
            go = 1;
            for (u32 k = 0; go && k < op.after.count; ++k) {
                const FcAfter w = a.t.afters[op.after.first + k];
                // The same call (its number wraps), past the instruction.
                go = fc_wait(a, [&] {
                    const u64 d = fc_load_acquire(a.done + w.channel);
                    return (d >> 32) == call && (u32)d > w.index;
                });
            }
            for (u32 k = 0; go && k < op.recv.count; ++k) {
                const FcEnd e = a.t.ends[op.recv.first + k];
                const u64 g = a.base_received[fc_word(a, c, e.peer)] + e.index;
                const u64 *posted = a.peers.posted[a.rank] + fc_word(a, c, e.peer);
                // A sender on another plan may never post: its hello says so.
                if (!greeted[e.peer]) {
                    go = fc_greet(a, c, e.peer);
                    greeted[e.peer] = 1;
                }
                go = go && fc_wait(a, [&] { return fc_load_acquire(posted) > g; });
                in[k] = (const T *)(a.peers.inbox[a.rank] + fc_slot(a, c, e.peer, g));
            }
            for (u32 k = 0; go && k < op.send.count; ++k) {
                const FcEnd e = a.t.ends[op.send.first + k];
                const u64 g = a.base_sent[fc_word(a, c, e.peer)] + e.index;
                const u64 *consumed = a.peers.consumed[a.rank] + fc_word(a, c, e.peer);
                go = fc_wait(a, [&] { return fc_load_acquire(consumed) + a.slots > g; });
                if (go && !greeted[e.peer]) {
                    go = fc_greet(a, c, e.peer);
                    greeted[e.peer] = 1;
                }
                out[k] = (T *)(a.peers.inbox[e.peer] + fc_slot(a, c, a.rank, g));
            }
        }
        __syncthreads();
        if (!go) return;
        fc_move<T, Op>(a, op, in, (int)op.recv.count, out, (int)op.send.count);
        __syncthreads();
        if (threadIdx.x == 0) {
            // Every thread's stores are done (the barrier); make them
            // visible to the peers before the counters that announce them.
            __threadfence_system();
            for (u32 k = 0; k < op.recv.count; ++k) {
                const FcEnd e = a.t.ends[op.recv.first + k];
                const u64 g = a.base_received[fc_word(a, c, e.peer)] + e.index;
                fc_store_release(a.peers.consumed[e.peer] + fc_word(a, c, a.rank), g + 1);
            }
            for (u32 k = 0; k < op.send.count; ++k) {
                const FcEnd e = a.t.ends[op.send.first + k];
                const u64 g = a.base_sent[fc_word(a, c, e.peer)] + e.index;
                fc_store_release(a.peers.posted[e.peer] + fc_word(a, c, a.rank), g + 1);
            }
            fc_store_release(a.done + c, (call << 32) | (i + 1));
        }
    }
    // The links of this channel count this call's messages for the next.
    if (threadIdx.x == 0) {
        for (u32 k = 0; k < a.t.sent_count; ++k)
            if (a.t.sent[k].word / a.world == c) a.base_sent[a.t.sent[k].word] += a.t.sent[k].count;
        for (u32 k = 0; k < a.t.received_count; ++k)
            if (a.t.received[k].word / a.world == c) a.base_received[a.t.received[k].word] += a.t.received[k].count;
    }
}

#define INTERPRETERS(NAME, T)                                                                          \
    extern "C" __global__ void ferrocoll_run_sum_##NAME(FcCall a) { fc_interpret<T, Sum>(a); }    \
    extern "C" __global__ void ferrocoll_run_prod_##NAME(FcCall a) { fc_interpret<T, Prod>(a); }  \
    extern "C" __global__ void ferrocoll_run_min_##NAME(FcCall a) { fc_interpret<T, Min>(a); }    \
    extern "C" __global__ void ferrocoll_run_max_##NAME(FcCall a) { fc_interpret<T, Max>(a); }

INTERPRETERS(i8, signed char)
INTERPRETERS(u8, unsigned char)
INTERPRETERS(i32, int)
INTERPRETERS(u32, unsigned int)
INTERPRETERS(i64, long long)
INTERPRETERS(u64, unsigned long long)
INTERPRETERS(f16, __half)
INTERPRETERS(bf16, __nv_bfloat16)
INTERPRETERS(f32, float)
INTERPRETERS(f64, double)
