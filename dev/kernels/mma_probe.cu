// Two questions about the tensor cores' mma.sync forms that decide whether MMQ's sub-scaled
// types could multiply on fp16 tensor cores (docs/performance.md, "MMQ's sub-scales on
// half-precision tensor cores"). Not a production kernel: dev/kernels/mma_probe.py runs it.
//
// 1. mma_f16_exact: is D = A * B + C of m16n8k16 with f16 A and B and an f32 accumulator the
//    exact integer when A, B and C hold integers and every partial sum stays below 2^24 (the
//    definition: NumPy's int64 sums, the check in mma_probe.py)? Each warp multiplies one case:
//    A [16][16] and B [16][8] as f16 (integers, exact in f16 up to 2048), C [16][8] as float.
// 2. mma_rate_*: how many cycles one warp's mma of each form occupies, from a loop of
//    independent mma chains (CHAINS accumulators a warp) timed by the host.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16" and "m16n8k32"): g = lane / 4,
// t = lane % 4. f16 A: a0 (row g, cols 2t, 2t+1), a1 (row g+8, same), a2 (row g, cols 2t+8, 2t+9),
// a3 (row g+8, same); B: b0 (rows 2t, 2t+1 of col g), b1 (rows 2t+8, 2t+9); C, D: c0 (g, 2t),
// c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t pack_h2(__half lo, __half hi) {
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

// a [n][16][16], b [n][16][8] (b[k][n]), c and d [n][16][8], row-major; warp w multiplies case w
extern "C" __global__ void mma_f16_exact(const __half* __restrict__ a, const __half* __restrict__ b,
                                         const float* __restrict__ c, float* __restrict__ d, int n) {
    const int w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (w >= n) return;
    const __half* A = a + (long long)w * 256;
    const __half* B = b + (long long)w * 128;
    const float* C = c + (long long)w * 128;
    float* D = d + (long long)w * 128;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t a0 = pack_h2(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]);
    const uint32_t a1 = pack_h2(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]);
    const uint32_t a2 = pack_h2(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]);
    const uint32_t a3 = pack_h2(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9]);
    const uint32_t b0 = pack_h2(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]);
    const uint32_t b1 = pack_h2(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g]);
    float d0 = C[g * 8 + 2 * t], d1 = C[g * 8 + 2 * t + 1], d2 = C[(g + 8) * 8 + 2 * t], d3 = C[(g + 8) * 8 + 2 * t + 1];
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    D[g * 8 + 2 * t] = d0;
    D[g * 8 + 2 * t + 1] = d1;
    D[(g + 8) * 8 + 2 * t] = d2;
    D[(g + 8) * 8 + 2 * t + 1] = d3;
}

#ifndef CHAINS
#define CHAINS 4
#endif

// Each warp runs `iters` rounds of CHAINS independent mma of one form; out gets one value a
// thread so that nothing is dead. The operands do not change an mma's time: the f16 form's are
// the finite halves 1.0 and 2.0, the int8 forms' the thread's own bits.
struct F16K16 {
    using Acc = float;
    static __device__ __forceinline__ uint32_t operand() { return 0x3C004000u + (threadIdx.x & 1); }
    static __device__ __forceinline__ void mma(Acc (&d)[4], uint32_t x) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, {%4,%4}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(x));
    }
};
struct S8K16 {
    using Acc = int;
    static __device__ __forceinline__ uint32_t operand() { return threadIdx.x * 0x9E3779B9u; }
    static __device__ __forceinline__ void mma(Acc (&d)[4], uint32_t x) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%4}, {%4}, {%0,%1,%2,%3};\n"
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]) : "r"(x));
    }
};
struct S8K32 {
    using Acc = int;
    static __device__ __forceinline__ uint32_t operand() { return threadIdx.x * 0x9E3779B9u; }
    static __device__ __forceinline__ void mma(Acc (&d)[4], uint32_t x) {
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, {%4,%4}, "
            "{%0,%1,%2,%3};\n"
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]) : "r"(x));
    }
};

template <class M>
__device__ __forceinline__ void rate(int iters, float* __restrict__ out) {
    const uint32_t x = M::operand();
    typename M::Acc acc[CHAINS][4] = {};
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) M::mma(acc[c], x);
    }
    typename M::Acc s = 0;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) s = s + acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = (float)s;
}

extern "C" __global__ void mma_rate_f16_k16(int iters, float* __restrict__ out) { rate<F16K16>(iters, out); }
extern "C" __global__ void mma_rate_s8_k16(int iters, float* __restrict__ out) { rate<S8K16>(iters, out); }
extern "C" __global__ void mma_rate_s8_k32(int iters, float* __restrict__ out) { rate<S8K32>(iters, out); }
