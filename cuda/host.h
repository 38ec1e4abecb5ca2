// Host stand-ins for what records.h, elements.cuh and interpret.cu use of
// CUDA, so that the device interpreter's own source compiles as C++ (g++
// or clang++) and runs on CPU threads in `cargo test`
// (crates/cuda/src/program/host_kernel.rs). host_launch.h, appended after
// the source, is the entry the tests call.
//
// Model: one host thread per thread block; the block's threads are fibers
// of that host thread (ucontext), switched where a GPU thread would wait —
// at a barrier and in every spin — so `__shared__` (thread-local storage
// of the host thread) is shared by the block's threads, as on the GPU, and
// `__syncthreads_or` is a real barrier and vote. Peers' windows, the board
// and the tables are plain host memory, so "device addresses" are host
// pointers. What this cannot show is what only a GPU has: the memory model
// across SMs and PCIe/NVLink (x86 orders more), threads of a warp running
// at once, occupancy.

#define FC_HOST 1

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>

#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __grid_constant__
#define __launch_bounds__(threads, blocks)
// The launch's dynamic shared memory: as much as a launch may ask for, per
// host thread (so per block).
#define FC_RECORDS_MEMORY(name) static thread_local __attribute__((aligned(16))) unsigned char name[FC_RECORDS_SHARED_MAX]

struct FcDim3 { unsigned x, y, z; };
static thread_local FcDim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
static thread_local FcDim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};

// The block this host thread runs: its threads as fibers.
struct FcFiber { ucontext_t context; void *stack; bool done; };
static thread_local FcFiber *fc_fiber = 0;
static thread_local unsigned fc_fibers = 0, fc_current = 0, fc_finished = 0;
static thread_local ucontext_t fc_scheduler;
// The barrier: arrivals, votes, and a generation that moves on when the
// last thread arrives.
static thread_local unsigned fc_arrived = 0, fc_generation = 0;
static thread_local int fc_vote = 0, fc_result = 0;
static thread_local void (*fc_entry)(const void *) = 0;
static thread_local const void *fc_entry_arg = 0;

// Let the block's other threads run (back to the scheduler).
static inline void fc_yield() {
    if (fc_fibers > 1) swapcontext(&fc_fiber[fc_current].context, &fc_scheduler);
}

static void fc_fiber_main() {
    fc_entry(fc_entry_arg);
    fc_fiber[fc_current].done = true;
    ++fc_finished;
}

// Run `entry(arg)` as every thread of block `block` of a grid of `grid`,
// `threads` threads per block, on this host thread; back when all ended.
static void fc_run_block(void (*entry)(const void *), const void *arg, unsigned block, unsigned grid,
                         unsigned threads) {
    blockIdx.x = block;
    gridDim.x = grid;
    blockDim.x = threads ? threads : 1;
    threadIdx.x = 0;
    if (blockDim.x == 1) {
        fc_fibers = 0;
        entry(arg);
        return;
    }
    const size_t stack = 256 << 10;
    fc_entry = entry;
    fc_entry_arg = arg;
    fc_fiber = (FcFiber *)calloc(threads, sizeof(FcFiber));
    fc_fibers = threads;
    fc_finished = fc_arrived = 0;
    fc_vote = 0;
    for (unsigned t = 0; t < threads; ++t) {
        FcFiber &f = fc_fiber[t];
        f.stack = malloc(stack);
        if (!f.stack || getcontext(&f.context) != 0) abort();
        f.context.uc_stack.ss_sp = f.stack;
        f.context.uc_stack.ss_size = stack;
        f.context.uc_link = &fc_scheduler;
        makecontext(&f.context, fc_fiber_main, 0);
    }
    while (fc_finished < threads) {
        for (unsigned t = 0; t < threads; ++t) {
            if (fc_fiber[t].done) continue;
            fc_current = t;
            threadIdx.x = t;
            swapcontext(&fc_scheduler, &fc_fiber[t].context);
        }
        sched_yield();
    }
    for (unsigned t = 0; t < threads; ++t) free(fc_fiber[t].stack);
    free(fc_fiber);
    fc_fiber = 0;
    fc_fibers = 0;
}

// A plain block of one thread (avg's division covers its whole range).
extern "C" void fc_host_block(unsigned block, unsigned grid) {
    blockIdx.x = block;
    gridDim.x = grid;
    blockDim.x = 1;
    threadIdx.x = 0;
    fc_fibers = 0;
}

// Every thread of the block waits here for the others; true if any voted
// true. Threads that leave the kernel at different barriers would hang a
// GPU: here they stop the test with the reason.
static inline int __syncthreads_or(int vote) {
    if (fc_fibers <= 1) return vote != 0;
    const unsigned generation = fc_generation;
    fc_vote |= vote != 0;
    if (++fc_arrived == fc_fibers) {
        fc_result = fc_vote;
        fc_vote = 0;
        fc_arrived = 0;
        ++fc_generation;
        return fc_result;
    }
    while (generation == fc_generation) {
        if (fc_arrived + fc_finished == fc_fibers) {
            fprintf(stderr, "block %u: its threads left the kernel at different barriers\n", blockIdx.x);
            abort();
        }
        fc_yield();
    }
    return fc_result;
}

static inline void __syncthreads() { __syncthreads_or(0); }

struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };

template <typename T> static inline T min(T a, T b) { return b < a ? b : a; }

static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

static inline unsigned long long atomicCAS_system(unsigned long long *p, unsigned long long expected,
                                                  unsigned long long desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
}

typedef unsigned long long fc_u64;

// Flag words. The scope (the GPU's or the system's) means nothing on the
// host: one process's threads share one coherent memory.
static inline fc_u64 fc_load_acquire(const fc_u64 *p, unsigned) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void fc_store_release(fc_u64 *p, fc_u64 v, unsigned) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline fc_u64 fc_load_volatile(const fc_u64 *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void fc_store_volatile(fc_u64 *p, fc_u64 v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

// Counters are published as relaxed stores after one fence per
// instruction, as on the GPU. ThreadSanitizer does not model standalone
// fences, so under it (FC_TSAN) each such store is a release instead —
// the ordering the fence gives it.
#ifdef FC_TSAN
static inline void fc_fence(unsigned) {}
static inline void fc_store_relaxed(fc_u64 *p, fc_u64 v, unsigned) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
#else
static inline void fc_fence(unsigned) { __atomic_thread_fence(__ATOMIC_ACQ_REL); }
static inline void fc_store_relaxed(fc_u64 *p, fc_u64 v, unsigned) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
#endif

static inline fc_u64 fc_now() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (fc_u64)t.tv_sec * 1000000000ull + (fc_u64)t.tv_nsec;
}

// An LL line's halves: each 64-bit word whole (what the GPU's v2 access
// guarantees per element), the pair not. On the GPU they are relaxed
// (volatile): what a rank does after reading a line depends on the line's
// data, and nothing is ordered otherwise. ThreadSanitizer does not follow
// dependencies, so under it (FC_TSAN) the lines are release and acquire
// instead, which is what the dependencies give.
#ifdef FC_TSAN
#define FC_LL_STORE __ATOMIC_RELEASE
#define FC_LL_LOAD __ATOMIC_ACQUIRE
#else
#define FC_LL_STORE __ATOMIC_RELAXED
#define FC_LL_LOAD __ATOMIC_RELAXED
#endif
static inline void fc_store_pair(unsigned char *p, fc_u64 lo, fc_u64 hi) {
    __atomic_store_n((fc_u64 *)p, lo, FC_LL_STORE);
    __atomic_store_n((fc_u64 *)p + 1, hi, FC_LL_STORE);
}

static inline void fc_load_pair(const unsigned char *p, fc_u64 *lo, fc_u64 *hi) {
    *lo = __atomic_load_n((const fc_u64 *)p, FC_LL_LOAD);
    *hi = __atomic_load_n((const fc_u64 *)p + 1, FC_LL_LOAD);
}

// A spinning thread lets its block's other threads run; a block of one
// thread lets other blocks (more blocks than cores spin here).
static inline void fc_pause() {
    if (fc_fibers > 1)
        fc_yield();
    else
        sched_yield();
}

// IEEE half and bfloat16 as bits, converted with round-to-nearest-even, as
// the CUDA intrinsics and the CPU executor do (checked against a reference
// on every float). NaN stays NaN, quieted on the way to the narrow types;
// payloads are kept, where a GPU may return its canonical NaN.
struct __half { unsigned short bits; };
struct __nv_bfloat16 { unsigned short bits; };

static inline unsigned fc_bits(float f) { unsigned x; memcpy(&x, &f, 4); return x; }
static inline float fc_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }

static inline float __half2float(__half h) {
    const unsigned sign = (unsigned)(h.bits & 0x8000) << 16, exp = (h.bits >> 10) & 0x1f, mant = h.bits & 0x3ff;
    if (exp == 0x1f) return fc_float(sign | 0x7f800000 | (mant << 13));
    if (exp == 0) {
        const float f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    }
    return fc_float(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline __half __float2half_rn(float f) {
    const unsigned x = fc_bits(f), sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff;
    unsigned mant = x & 0x7fffff;
    if (exp == 0xff) return __half{(unsigned short)(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0))};
    const int e = (int)exp - 127 + 15;
    if (e >= 0x1f) return __half{(unsigned short)(sign | 0x7c00)};
    unsigned shift = 13, h;
    if (e <= 0) {
        if (e < -10) return __half{(unsigned short)sign};
        mant |= 0x800000;
        shift = (unsigned)(14 - e);
        h = mant >> shift;
    } else {
        h = ((unsigned)e << 10) | (mant >> 13);
    }
    const unsigned rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1))) ++h;
    return __half{(unsigned short)(sign | h)};
}

static inline float __bfloat162float(__nv_bfloat16 b) { return fc_float((unsigned)b.bits << 16); }

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    const unsigned x = fc_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return __nv_bfloat16{(unsigned short)((x >> 16) | 0x40)};
    return __nv_bfloat16{(unsigned short)((x + 0x7fff + ((x >> 16) & 1)) >> 16)};
}

// The conversions, for the tests that hold them against the CPU's.
extern "C" unsigned short fc_host_to_half(float f) { return __float2half_rn(f).bits; }
extern "C" float fc_host_from_half(unsigned short h) { return __half2float(__half{h}); }
extern "C" unsigned short fc_host_to_bf16(float f) { return __float2bfloat16_rn(f).bits; }
