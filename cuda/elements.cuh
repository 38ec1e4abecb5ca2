// How the device interpreter combines elements (cuda/interpret.cu): each
// type's accumulator, the reduction ops, and avg's final division.
//
// Arithmetic follows the CPU executor: integers wrap (computed unsigned),
// half and bfloat16 accumulate in float over all of an instruction's
// inputs and round to nearest even once, min and max use the same
// comparisons (NaN propagates), and avg is a sum followed by one division
// of the final values.

#ifndef FC_HOST
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

// Each type combines in an accumulator type: itself, except half and
// bfloat16, which accumulate in float and round once at the end.
template <typename T> struct Acc {
    typedef T type;
    static __device__ __forceinline__ T load(T v) { return v; }
    static __device__ __forceinline__ T store(T v) { return v; }
};
template <> struct Acc<__half> {
    typedef float type;
    static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
    static __device__ __forceinline__ __half store(float v) { return __float2half_rn(v); }
};
template <> struct Acc<__nv_bfloat16> {
    typedef float type;
    static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __device__ __forceinline__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

// Integers wrap: add and multiply through the unsigned type of the width.
template <typename T> struct Unsigned { typedef T type; };
template <> struct Unsigned<signed char> { typedef unsigned char type; };
template <> struct Unsigned<int> { typedef unsigned int type; };
template <> struct Unsigned<long long> { typedef unsigned long long type; };

template <typename A> struct Sum {
    static __device__ __forceinline__ A apply(A a, A b) {
        typedef typename Unsigned<A>::type U;
        return (A)((U)a + (U)b);
    }
};
template <> struct Sum<float> { static __device__ __forceinline__ float apply(float a, float b) { return a + b; } };
template <> struct Sum<double> { static __device__ __forceinline__ double apply(double a, double b) { return a + b; } };
template <typename A> struct Prod {
    static __device__ __forceinline__ A apply(A a, A b) {
        typedef typename Unsigned<A>::type U;
        return (A)((U)a * (U)b);
    }
};
template <> struct Prod<float> { static __device__ __forceinline__ float apply(float a, float b) { return a * b; } };
template <> struct Prod<double> { static __device__ __forceinline__ double apply(double a, double b) { return a * b; } };
// The same comparisons as the CPU kernels, so NaNs land the same way.
// `b != b` holds only for a NaN: min and max propagate NaN whatever the
// operand order, as the CPU executor does (fminf/fmaxf would drop it).
template <typename A> struct Min { static __device__ __forceinline__ A apply(A a, A b) { return (b < a || b != b) ? b : a; } };
template <typename A> struct Max { static __device__ __forceinline__ A apply(A a, A b) { return (b > a || b != b) ? b : a; } };

// avg's last pass: divide a final value by the number of ranks. Integers
// truncate toward zero; a divisor the type cannot hold (an 8-bit type over
// more than 127 or 255 ranks) gives 0, as on the CPU.
template <typename T> struct Largest;
template <> struct Largest<signed char> { static __device__ __forceinline__ u64 value() { return 127; } };
template <> struct Largest<unsigned char> { static __device__ __forceinline__ u64 value() { return 255; } };
template <> struct Largest<int> { static __device__ __forceinline__ u64 value() { return 2147483647ull; } };
template <> struct Largest<unsigned int> { static __device__ __forceinline__ u64 value() { return 4294967295ull; } };
template <> struct Largest<long long> { static __device__ __forceinline__ u64 value() { return 9223372036854775807ull; } };
template <> struct Largest<unsigned long long> { static __device__ __forceinline__ u64 value() { return ~0ull; } };

template <typename T> struct Divide {
    static __device__ __forceinline__ T apply(T a, u64 d) { return d == 0 || d > Largest<T>::value() ? (T)0 : (T)(a / (T)d); }
};
template <> struct Divide<float> {
    static __device__ __forceinline__ float apply(float a, u64 d) { return a / (float)d; }
};
template <> struct Divide<double> {
    static __device__ __forceinline__ double apply(double a, u64 d) { return a / (double)d; }
};
template <> struct Divide<__half> {
    static __device__ __forceinline__ __half apply(__half a, u64 d) { return __float2half_rn(__half2float(a) / (float)d); }
};
template <> struct Divide<__nv_bfloat16> {
    static __device__ __forceinline__ __nv_bfloat16 apply(__nv_bfloat16 a, u64 d) {
        return __float2bfloat16_rn(__bfloat162float(a) / (float)d);
    }
};
