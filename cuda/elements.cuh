// ferrocoll's device kernels, compiled at run time by NVRTC for the
// device's compute capability (crates/cuda/src/kernels.rs).
//
// One kernel does every step of a schedule: it reads up to MAX_INPUTS
// slices, combines them elementwise with the collective's operation, and
// writes the result to up to MAX_OUTPUTS slices. With peer access on, an
// input or an output may live on another GPU, so a step's receive, reduce
// and send are one pass over the data. With one input it is a copy (to
// several destinations at once).
//
// Arithmetic follows the CPU executor: integers wrap (computed unsigned),
// half and bfloat16 accumulate in float over a launch's inputs and round
// to nearest even once (a step with more than eight inputs takes several
// launches and so rounds between them), min and max use the same
// comparisons (NaN propagates), and `avg` is a sum followed by `ferrocoll_div_*` on the
// final values.
//
// Access is vectorised: when every pointer is 16-byte aligned, each thread
// moves 16 bytes per load and store; the tail (and unaligned slices) go
// element by element.

#ifndef FC_HOST
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

#define MAX_INPUTS 8
#define MAX_OUTPUTS 8

typedef unsigned long long u64;

template <typename T> struct Inputs { const T *p[MAX_INPUTS]; int count; };
template <typename T> struct Outputs { T *p[MAX_OUTPUTS]; int count; };

// Each type combines in an accumulator type: itself, except half and
// bfloat16, which accumulate in float over all of a step's inputs and round
// once at the end, as the CPU executor does.
template <typename T> struct Acc {
    typedef T type;
    static __device__ T load(T v) { return v; }
    static __device__ T store(T v) { return v; }
};
template <> struct Acc<__half> {
    typedef float type;
    static __device__ float load(__half v) { return __half2float(v); }
    static __device__ __half store(float v) { return __float2half_rn(v); }
};
template <> struct Acc<__nv_bfloat16> {
    typedef float type;
    static __device__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __device__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

// Integers wrap: add and multiply through the unsigned type of the width.
template <typename T> struct Unsigned { typedef T type; };
template <> struct Unsigned<signed char> { typedef unsigned char type; };
template <> struct Unsigned<int> { typedef unsigned int type; };
template <> struct Unsigned<long long> { typedef unsigned long long type; };

template <typename A> struct Sum {
    static __device__ A apply(A a, A b) {
        typedef typename Unsigned<A>::type U;
        return (A)((U)a + (U)b);
    }
};
template <> struct Sum<float> { static __device__ float apply(float a, float b) { return a + b; } };
template <> struct Sum<double> { static __device__ double apply(double a, double b) { return a + b; } };
template <typename A> struct Prod {
    static __device__ A apply(A a, A b) {
        typedef typename Unsigned<A>::type U;
        return (A)((U)a * (U)b);
    }
};
template <> struct Prod<float> { static __device__ float apply(float a, float b) { return a * b; } };
template <> struct Prod<double> { static __device__ double apply(double a, double b) { return a * b; } };
// The same comparisons as the CPU kernels, so NaNs land the same way.
// `b != b` holds only for a NaN: min and max propagate NaN whatever the
// operand order, as the CPU executor does (fminf/fmaxf would drop it).
template <typename A> struct Min { static __device__ A apply(A a, A b) { return (b < a || b != b) ? b : a; } };
template <typename A> struct Max { static __device__ A apply(A a, A b) { return (b > a || b != b) ? b : a; } };

template <typename T, template <typename> class Op>
__device__ T combine(const Inputs<T> &in, u64 i) {
    typedef typename Acc<T>::type A;
    A acc = Acc<T>::load(in.p[0][i]);
    for (int k = 1; k < in.count; ++k) acc = Op<A>::apply(acc, Acc<T>::load(in.p[k][i]));
    return Acc<T>::store(acc);
}

template <typename T, template <typename> class Op>
__device__ void reduce_copy(Outputs<T> out, Inputs<T> in, u64 n) {
    typedef typename Acc<T>::type A;
    const u64 per = 16 / sizeof(T);
    u64 bits = 0;
    for (int k = 0; k < in.count; ++k) bits |= (u64)in.p[k];
    for (int k = 0; k < out.count; ++k) bits |= (u64)out.p[k];
    const u64 vectors = (bits % 16 == 0) ? n / per : 0;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 v = first; v < vectors; v += stride) {
        uint4 result = reinterpret_cast<const uint4 *>(in.p[0])[v];
        if (in.count > 1) {
            T *r = reinterpret_cast<T *>(&result);
            A acc[16 / sizeof(T)];
            for (u64 j = 0; j < per; ++j) acc[j] = Acc<T>::load(r[j]);
            for (int k = 1; k < in.count; ++k) {
                uint4 next = reinterpret_cast<const uint4 *>(in.p[k])[v];
                const T *b = reinterpret_cast<const T *>(&next);
                for (u64 j = 0; j < per; ++j) acc[j] = Op<A>::apply(acc[j], Acc<T>::load(b[j]));
            }
            for (u64 j = 0; j < per; ++j) r[j] = Acc<T>::store(acc[j]);
        }
        for (int k = 0; k < out.count; ++k) reinterpret_cast<uint4 *>(out.p[k])[v] = result;
    }
    for (u64 i = vectors * per + first; i < n; i += stride) {
        // One input is a copy: move the bits (no float round trip, which
        // would change NaN payloads of half and bfloat16).
        T value = in.count == 1 ? in.p[0][i] : combine<T, Op>(in, i);
        for (int k = 0; k < out.count; ++k) out.p[k][i] = value;
    }
}

// avg's last pass: divide every final value by the number of ranks.
// Integers truncate toward zero; a divisor the type cannot hold (an 8-bit
// type over more than 127 or 255 ranks) gives 0, as on the CPU.
template <typename T> struct Divide {
    static __device__ T apply(T a, u64 d, T max) { return d == 0 || d > (u64)max ? (T)0 : (T)(a / (T)d); }
};
template <> struct Divide<float> {
    static __device__ float apply(float a, u64 d, float) { return a / (float)d; }
};
template <> struct Divide<double> {
    static __device__ double apply(double a, u64 d, double) { return a / (double)d; }
};
template <> struct Divide<__half> {
    static __device__ __half apply(__half a, u64 d, __half) { return __float2half_rn(__half2float(a) / (float)d); }
};
template <> struct Divide<__nv_bfloat16> {
    static __device__ __nv_bfloat16 apply(__nv_bfloat16 a, u64 d, __nv_bfloat16) {
        return __float2bfloat16_rn(__bfloat162float(a) / (float)d);
    }
};

template <typename T>
__device__ void divide(T *data, u64 n, u64 divisor, T max) {
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = first; i < n; i += stride) data[i] = Divide<T>::apply(data[i], divisor, max);
}

#define KERNELS(NAME, T, MAX)                                                  \
    extern "C" __global__ void ferrocoll_sum_##NAME(Outputs<T> o, Inputs<T> i, u64 n) { reduce_copy<T, Sum>(o, i, n); } \
    extern "C" __global__ void ferrocoll_prod_##NAME(Outputs<T> o, Inputs<T> i, u64 n) { reduce_copy<T, Prod>(o, i, n); } \
    extern "C" __global__ void ferrocoll_min_##NAME(Outputs<T> o, Inputs<T> i, u64 n) { reduce_copy<T, Min>(o, i, n); } \
    extern "C" __global__ void ferrocoll_max_##NAME(Outputs<T> o, Inputs<T> i, u64 n) { reduce_copy<T, Max>(o, i, n); } \
    extern "C" __global__ void ferrocoll_div_##NAME(T *data, u64 n, u64 d) { divide<T>(data, n, d, MAX); }

KERNELS(i8, signed char, (signed char)127)
KERNELS(u8, unsigned char, (unsigned char)255)
KERNELS(i32, int, 2147483647)
KERNELS(u32, unsigned int, 4294967295u)
KERNELS(i64, long long, 9223372036854775807ll)
KERNELS(u64, unsigned long long, 18446744073709551615ull)
KERNELS(f16, __half, __half())
KERNELS(bf16, __nv_bfloat16, __nv_bfloat16())
KERNELS(f32, float, 0.0f)
KERNELS(f64, double, 0.0)
