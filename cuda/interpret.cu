// ferrocoll's device interpreter (CUDA executor v2): one persistent launch
// per call and rank, one thread block per channel, each walking its
// channel's records of the device program (crates/cuda/src/program, whose
// #[repr(C)] structs these mirror) and moving data with stores straight
// into peers' inboxes.
//
// This source also runs on CPU threads in every `cargo test`, built as host
// C++ with cuda/host.h (crates/cuda/src/program/host_kernel.rs), beside a
// Rust mirror of its protocol (crates/cuda/src/program/emulate.rs): per link, the sender stores message g into
// the receiver's slot g % slots once `consumed >= g + 1 - slots`, then
// publishes `posted = g + 1` in the receiver's window; the receiver combines
// once `posted >= g + 1`, then publishes `consumed = g + 1` in the
// sender's. Before its first store into (or wait on) a peer in a call, a
// block compares the peer's hello word for its channel with its own.
//
// Everything that changes from call to call lives in device memory — the
// call number, the links' message totals, each channel's progress — and
// advances inside the kernel, so the launch's parameters are the same for
// every call of a plan: a captured graph replays correctly, and the host
// does no work between calls.
//
// Compiled with reduce.cu (its Acc, Sum, Prod, Min and Max) by NVRTC;
// `cargo test` checks that it compiles for sm_80 and sm_90.

typedef unsigned int u32;

struct FcSpan { u32 first, count; };
struct FcLocal { u32 buffer; FcSpan pieces; };   // buffer 3: none
struct FcPiece { u64 offset, bytes; };
struct FcEnd { u32 peer, reserved; u64 index; };
struct FcAfter { u32 channel, index; };
struct FcOp { u64 bytes; FcSpan recv; FcLocal read; FcLocal write; FcSpan send; FcSpan after; };
struct FcCount { u64 word, count; };

#define FC_NONE 3u
#define FC_MAX_RANKS 64
// One message per peer and instruction at most (program::MAX_RANKS).
#define FC_MAX_FANIN FC_MAX_RANKS
#define FC_MAX_FANOUT FC_MAX_RANKS

// A rank's word on the group's failure board: the reason in bits 0..8, the
// rank it concerns in bits 8..32, and the number of the call that failed
// in bits 32.. (the device's count, so it is right under graph replay;
// program::params::Failure decodes it).
#define FC_MISMATCH 1
#define FC_TIMEOUT 2
#define FC_PEER_FAILED 3
// Written by the host to stop a rank's blocks.
#define FC_ABORTED 4

// How messages travel (program::Protocol).
#define FC_SIMPLE 0
#define FC_LL 1

// This rank's program, in its device memory.
struct FcTables {
    const FcSpan *channels;
    const FcOp *ops;
    const FcPiece *pieces;
    const FcEnd *ends;
    const FcAfter *afters;
    const FcCount *sent;
    const FcCount *received;
    u32 sent_count, received_count;
};

// One launch's parameters (program::params::Params).
struct FcCall {
    FcTables t;
    // Every rank's window (inbox, posted, consumed, hello), mapped here.
    unsigned char *window[FC_MAX_RANKS];
    unsigned char *buffer[3];      // input, output, scratch
    // This rank's private words: calls and done by channel, then the
    // messages sent and received by link word, ever.
    u64 *state;
    // The group's failure board, one word per rank (host-mapped: the host
    // reads it without waiting for the stream, and writes it to abort).
    u64 *board;
    u64 posted_at, consumed_at, hello_at, ll_at;   // byte offsets in a window
    u64 slot_bytes, ll_slot_bytes;
    u64 timeout_ns;                // the longest one wait may last
    u32 hash;                      // the program's agreement, low half
    u32 rank, world, slots, max_channels;
    u32 protocol;                  // FC_SIMPLE or FC_LL
};

// The memory and timer primitives, in PTX. Built as host C++ for the
// tests (FC_HOST, cuda/host.h), the same names are C++ atomics and the
// monotonic clock, and everything below is this same source.
#ifndef FC_HOST
__device__ __forceinline__ u64 fc_load_acquire(const u64 *p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void fc_store_release(u64 *p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
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

// A board word as it is now (the host and other GPUs write it).
__device__ __forceinline__ u64 fc_load_volatile(const u64 *p) { return *(const volatile u64 *)p; }

// A spinning thread's pause: none on the GPU.
__device__ __forceinline__ void fc_pause() {}
#endif

__device__ __forceinline__ u32 fc_word(const FcCall &a, u32 channel, u32 peer) { return channel * a.world + peer; }

__device__ __forceinline__ u64 *fc_posted(const FcCall &a, u32 owner) { return (u64 *)(a.window[owner] + a.posted_at); }
__device__ __forceinline__ u64 *fc_consumed(const FcCall &a, u32 owner) { return (u64 *)(a.window[owner] + a.consumed_at); }
__device__ __forceinline__ u64 *fc_hello(const FcCall &a, u32 owner) { return (u64 *)(a.window[owner] + a.hello_at); }

__device__ __forceinline__ unsigned char *fc_slot(const FcCall &a, u32 owner, u32 channel, u32 from, u64 g) {
    const u64 slot = (u64)fc_word(a, channel, from) * a.slots + g % a.slots;
    if (a.protocol == FC_LL) return a.window[owner] + a.ll_at + slot * a.ll_slot_bytes;
    return a.window[owner] + slot * a.slot_bytes;
}

// An LL message's flag (program::Protocol::ll_flag): never 0, never the
// flag of the message that used the slot before.
__device__ __forceinline__ u32 fc_ll_flag(u64 g) { return (u32)((g + 1) % 0xffffffffull) + 1; }

// The call in progress is the one after the last this channel finished.
__device__ void fc_fail(const FcCall &a, u32 reason, u32 about) {
    const u64 call = (u32)(a.state[blockIdx.x] + 1);
    atomicCAS_system(a.board + a.rank, 0ull, (u64)reason | ((u64)about << 8) | (call << 32));
}

// Whether this rank or a peer has failed the call (or the host aborted).
__device__ bool fc_failed(const FcCall &a) {
    if (fc_load_volatile(a.board + a.rank)) return true;
    for (u32 r = 0; r < a.world; ++r)
        if (fc_load_volatile(a.board + r)) {
            fc_fail(a, FC_PEER_FAILED, r);
            return true;
        }
    return false;
}

// Called on every poll of a wait: false once a rank failed or the wait
// outlasted the timeout (measured on the GPU's global timer, so it holds
// whatever the clock rate).
// The board lives in host memory: it is read every 1024 polls, never on
// the first miss (an LL line a thread polls a few times would otherwise
// pay a sweep of PCIe reads per hop).
__device__ __forceinline__ bool fc_keep_waiting(const FcCall &a, u32 peer, u64 spins, u64 &start) {
    fc_pause();
    if (spins == 0) {
        start = fc_now();
        return true;
    }
    if (spins % 1024 != 1023) return true;
    if (fc_failed(a)) return false;
    if (fc_now() - start > a.timeout_ns) {
        fc_fail(a, FC_TIMEOUT, peer);
        return false;
    }
    return true;
}

// Spin (thread 0) until ready(); false once the call failed.
template <typename Ready>
__device__ bool fc_wait(const FcCall &a, u32 peer, Ready ready) {
    u64 start = 0;
    for (u64 spins = 0; !ready(); ++spins)
        if (!fc_keep_waiting(a, peer, spins, start)) return false;
    return true;
}

// The peer's hello for this channel against this call's, once the peer
// has reached this call (call numbers wrap). Before the first store into
// the peer it must be this call's with this plan. Before the first wait
// on it, a peer already past this call also passes: it has finished this
// call, so whatever it sent here it sent after checking this rank's hello
// itself (a sender never passes a receiver that is ahead), and if it sent
// nothing the wait times out rather than takes another call's data.
__device__ bool fc_greet(const FcCall &a, u32 channel, u32 peer, u64 hello, bool sending) {
    const u64 *word = fc_hello(a, peer) + channel;
    const u32 call = (u32)(hello >> 32);
    if (!fc_wait(a, peer, [&] { return (int)((u32)(fc_load_acquire(word) >> 32) - call) >= 0; })) return false;
    const u64 theirs = fc_load_acquire(word);
    if (theirs == hello || (!sending && (u32)(theirs >> 32) != call)) return true;
    fc_fail(a, FC_MISMATCH, peer);
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

// `n` 16-byte vectors: the received messages (from byte `at` of each) in
// order, then the local read, combined; stored to `store` and into every
// receiver's slot. One input is a copy of the bits.
template <typename T, template <typename> class Op>
__device__ void fc_vectors(unsigned char *const *in, int fanin, const uint4 *local, uint4 *store,
                           unsigned char *const *out, int fanout, u64 at, u64 n) {
    typedef typename Acc<T>::type A;
    const int per = 16 / sizeof(T);
    for (u64 v = threadIdx.x; v < n; v += blockDim.x) {
        uint4 result = fanin == 0 ? local[v] : reinterpret_cast<const uint4 *>(in[0] + at)[v];
        if (fanin + (local != 0) > 1) {
            T *r = reinterpret_cast<T *>(&result);
            A acc[16 / sizeof(T)];
            for (int j = 0; j < per; ++j) acc[j] = Acc<T>::load(r[j]);
            for (int k = 1; k < fanin; ++k) {
                const uint4 next = reinterpret_cast<const uint4 *>(in[k] + at)[v];
                const T *b = reinterpret_cast<const T *>(&next);
                for (int j = 0; j < per; ++j) acc[j] = Op<A>::apply(acc[j], Acc<T>::load(b[j]));
            }
            if (fanin > 0 && local) {
                const uint4 next = local[v];
                const T *b = reinterpret_cast<const T *>(&next);
                for (int j = 0; j < per; ++j) acc[j] = Op<A>::apply(acc[j], Acc<T>::load(b[j]));
            }
            for (int j = 0; j < per; ++j) r[j] = Acc<T>::store(acc[j]);
        }
        if (store) store[v] = result;
        for (int k = 0; k < fanout; ++k) reinterpret_cast<uint4 *>(out[k] + at)[v] = result;
    }
}

// The same, element by element, for runs that are not 16-byte aligned.
template <typename T, template <typename> class Op>
__device__ void fc_elements(unsigned char *const *in, int fanin, const T *local, T *store,
                            unsigned char *const *out, int fanout, u64 at, u64 n) {
    typedef typename Acc<T>::type A;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
        T value;
        if (fanin == 0) {
            value = local[i];
        } else if (fanin == 1 && !local) {
            value = reinterpret_cast<const T *>(in[0] + at)[i];
        } else {
            A acc = Acc<T>::load(reinterpret_cast<const T *>(in[0] + at)[i]);
            for (int k = 1; k < fanin; ++k) acc = Op<A>::apply(acc, Acc<T>::load(reinterpret_cast<const T *>(in[k] + at)[i]));
            if (local) acc = Op<A>::apply(acc, Acc<T>::load(local[i]));
            value = Acc<T>::store(acc);
        }
        if (store) store[i] = value;
        for (int k = 0; k < fanout; ++k) reinterpret_cast<T *>(out[k] + at)[i] = value;
    }
}

// One instruction's data pass, every thread of the block, a contiguous run
// of the read and write regions at a time; 16 bytes per access where every
// pointer of the run allows it (slots are 16-byte aligned and the plan's
// chunk boundaries are cut at 16 bytes, so most runs do).
template <typename T, template <typename> class Op>
__device__ void fc_move(const FcCall &a, const FcOp &op, unsigned char *const *in, int fanin,
                        unsigned char *const *out, int fanout) {
    for (u64 at = 0; at < op.bytes;) {
        u64 run = op.bytes - at, r;
        unsigned char *local = 0, *store = 0;
        if (op.read.buffer != FC_NONE) {
            local = fc_locate(a, op.read, at, &r);
            run = min(run, r);
        }
        if (op.write.buffer != FC_NONE) {
            store = fc_locate(a, op.write, at, &r);
            run = min(run, r);
        }
        u64 bits = (u64)local | (u64)store | at;
        for (int k = 0; k < fanin; ++k) bits |= (u64)in[k];
        for (int k = 0; k < fanout; ++k) bits |= (u64)out[k];
        const u64 vectors = bits % 16 == 0 ? run / 16 : 0, head = vectors * 16;
        if (vectors)
            fc_vectors<T, Op>(in, fanin, (const uint4 *)local, (uint4 *)store, out, fanout, at, vectors);
        if (run > head)
            fc_elements<T, Op>(in, fanin, (const T *)(local ? local + head : 0), (T *)(store ? store + head : 0),
                               out, fanout, at + head, (run - head) / sizeof(T));
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

// `n` (at most 8) bytes from byte `at` of a region's value, and back.
__device__ u64 fc_gather8(const FcCall &a, const FcLocal &r, u64 at, u64 n) {
    u64 v = 0, run;
    unsigned char *b = (unsigned char *)&v;
    for (u64 k = 0; k < n;) {
        const unsigned char *p = fc_locate(a, r, at + k, &run);
        if (!run) break;
        for (u64 j = 0; j < run && k < n; ++j, ++k) b[k] = p[j];
    }
    return v;
}

__device__ void fc_scatter8(const FcCall &a, const FcLocal &r, u64 at, u64 n, u64 v) {
    u64 run;
    const unsigned char *b = (const unsigned char *)&v;
    for (u64 k = 0; k < n;) {
        unsigned char *p = fc_locate(a, r, at + k, &run);
        if (!run) break;
        for (u64 j = 0; j < run && k < n; ++j, ++k) p[j] = b[k];
    }
}

// One instruction's data pass under LL, every thread its own lines:
// received lines (each waited for by the thread that needs it) in order,
// then the local read, combined, then stored and put into every
// receiver's slot. False once the call failed.
template <typename T, template <typename> class Op>
__device__ bool fc_ll_move(const FcCall &a, const FcOp &op, unsigned char *const *in, const u32 *inflag,
                           const u32 *inpeer, int fanin, unsigned char *const *out, const u32 *outflag,
                           int fanout) {
    typedef typename Acc<T>::type A;
    const bool local = op.read.buffer != FC_NONE;
    for (u64 l = threadIdx.x; l < (op.bytes + 7) / 8; l += blockDim.x) {
        const u64 at = 8 * l, n = min((u64)8, op.bytes - at);
        const int per = (int)(n / sizeof(T));
        u64 value;
        if (fanin == 0) {
            value = fc_gather8(a, op.read, at, n);
        } else if (!fc_ll_get(a, inpeer[0], in[0] + 16 * l, inflag[0], &value)) {
            return false;
        } else if (fanin > 1 || local) {
            A acc[8 / sizeof(T)];
            const T *first = reinterpret_cast<const T *>(&value);
            for (int e = 0; e < per; ++e) acc[e] = Acc<T>::load(first[e]);
            for (int k = 1; k <= fanin; ++k) {
                u64 next;
                if (k < fanin) {
                    if (!fc_ll_get(a, inpeer[k], in[k] + 16 * l, inflag[k], &next)) return false;
                } else if (local) {
                    next = fc_gather8(a, op.read, at, n);
                } else {
                    break;
                }
                const T *b = reinterpret_cast<const T *>(&next);
                for (int e = 0; e < per; ++e) acc[e] = Op<A>::apply(acc[e], Acc<T>::load(b[e]));
            }
            T *r = reinterpret_cast<T *>(&value);
            for (int e = 0; e < per; ++e) r[e] = Acc<T>::store(acc[e]);
        }
        if (op.write.buffer != FC_NONE) fc_scatter8(a, op.write, at, n, value);
        for (int k = 0; k < fanout; ++k) fc_ll_put(out[k] + 16 * l, value, outflag[k]);
    }
    return true;
}

template <typename T, template <typename> class Op>
__device__ void fc_interpret(const FcCall &a) {
    const u32 c = blockIdx.x;
    const FcSpan span = a.t.channels[c];
    u64 *calls = a.state, *done = a.state + a.max_channels;
    u64 *base_sent = done + a.max_channels, *base_received = base_sent + (u64)a.max_channels * a.world;
    // The previous call of this rank finished before this launch began
    // (stream order, and the communicator's event between its streams).
    const u64 call = (u32)(calls[c] + 1);
    const u64 hello = (call << 32) | a.hash;
    __shared__ unsigned char *in[FC_MAX_FANIN];
    __shared__ unsigned char *out[FC_MAX_FANOUT];
    __shared__ u32 inflag[FC_MAX_FANIN], inpeer[FC_MAX_FANIN], outflag[FC_MAX_FANOUT];
    const bool ll = a.protocol == FC_LL;
    // Per peer: greeted before waiting on it (bit 0), before storing into it (bit 1).
    __shared__ unsigned char greeted[FC_MAX_RANKS];
    for (u32 r = threadIdx.x; r < FC_MAX_RANKS; r += blockDim.x) greeted[r] = 0;
    // A call queued behind a failed one does nothing: its rank's counters
    // stopped where the failure left them. Then hello: this block's
    // channel, and block 0 the channels this plan leaves idle, so a peer
    // whose plan uses them still finds this call's.
    // Whether to stop is agreed at each barrier (`__syncthreads_or`), so
    // every thread leaves at the same barrier and none waits at one the
    // others skipped.
    int stop = 0;
    if (threadIdx.x == 0) {
        stop = fc_failed(a);
        if (!stop) fc_store_release(fc_hello(a, a.rank) + c, hello);
        if (!stop && c == 0)
            for (u32 k = gridDim.x; k < a.max_channels; ++k) fc_store_release(fc_hello(a, a.rank) + k, hello);
    }
    if (__syncthreads_or(stop)) return;
    for (u32 i = 0; i < span.count; ++i) {
        const FcOp &op = a.t.ops[span.first + i];
        bool go = true;
        if (threadIdx.x == 0) {
            for (u32 k = 0; go && k < op.after.count; ++k) {
                const FcAfter w = a.t.afters[op.after.first + k];
                // The same call (its number wraps), past the instruction.
                go = fc_wait(a, a.rank, [&] {
                    const u64 d = fc_load_acquire(done + w.channel);
                    return (d >> 32) == call && (u32)d > w.index;
                });
            }
            for (u32 k = 0; go && k < op.recv.count; ++k) {
                const FcEnd e = a.t.ends[op.recv.first + k];
                const u64 g = base_received[fc_word(a, c, e.peer)] + e.index;
                const u64 *posted = fc_posted(a, a.rank) + fc_word(a, c, e.peer);
                // A sender on another plan may never post: its hello says so.
                if (!(greeted[e.peer] & 1)) {
                    go = fc_greet(a, c, e.peer, hello, false);
                    greeted[e.peer] |= 1;
                }
                // LL lines carry their own flags: each thread waits for its own.
                go = go && (ll || fc_wait(a, e.peer, [&] { return fc_load_acquire(posted) > g; }));
                in[k] = fc_slot(a, a.rank, c, e.peer, g);
                inflag[k] = fc_ll_flag(g);
                inpeer[k] = e.peer;
            }
            for (u32 k = 0; go && k < op.send.count; ++k) {
                const FcEnd e = a.t.ends[op.send.first + k];
                const u64 g = base_sent[fc_word(a, c, e.peer)] + e.index;
                const u64 *consumed = fc_consumed(a, a.rank) + fc_word(a, c, e.peer);
                go = fc_wait(a, e.peer, [&] { return fc_load_acquire(consumed) + a.slots > g; });
                if (go && !(greeted[e.peer] & 2)) {
                    go = fc_greet(a, c, e.peer, hello, true);
                    greeted[e.peer] |= 2;
                }
                out[k] = fc_slot(a, e.peer, c, a.rank, g);
                outflag[k] = fc_ll_flag(g);
            }
        }
        if (__syncthreads_or(!go)) return;
        if (!ll) {
            fc_move<T, Op>(a, op, in, (int)op.recv.count, out, (int)op.send.count);
        } else {
            go = fc_ll_move<T, Op>(a, op, in, inflag, inpeer, (int)op.recv.count, out, outflag,
                                   (int)op.send.count);
        }
        if (__syncthreads_or(!go)) return;
        if (threadIdx.x == 0) {
            // Every thread's stores are done (the barrier); make them
            // visible to the peers before the counters that announce them.
            // (LL data announces itself; its `posted` only keeps the
            // link's count for bulk messages of later calls.)
            if (!ll) __threadfence_system();
            for (u32 k = 0; k < op.recv.count; ++k) {
                const FcEnd e = a.t.ends[op.recv.first + k];
                const u64 g = base_received[fc_word(a, c, e.peer)] + e.index;
                fc_store_release(fc_consumed(a, e.peer) + fc_word(a, c, a.rank), g + 1);
            }
            for (u32 k = 0; k < op.send.count; ++k) {
                const FcEnd e = a.t.ends[op.send.first + k];
                const u64 g = base_sent[fc_word(a, c, e.peer)] + e.index;
                fc_store_release(fc_posted(a, e.peer) + fc_word(a, c, a.rank), g + 1);
            }
            fc_store_release(done + c, (call << 32) | (i + 1));
        }
    }
    // The links of this channel count this call's messages for the next,
    // and the channel (block 0: the idle ones too) its call.
    if (threadIdx.x == 0) {
        for (u32 k = 0; k < a.t.sent_count; ++k)
            if (a.t.sent[k].word / a.world == c) base_sent[a.t.sent[k].word] += a.t.sent[k].count;
        for (u32 k = 0; k < a.t.received_count; ++k)
            if (a.t.received[k].word / a.world == c) base_received[a.t.received[k].word] += a.t.received[k].count;
        calls[c] = call;
        if (c == 0)
            for (u32 k = gridDim.x; k < a.max_channels; ++k) calls[k] = call;
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
