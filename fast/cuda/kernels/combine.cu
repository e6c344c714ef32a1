// Combine of the routed experts' outputs (plus the shared expert) into the residual, and the
// shared expert's gate.
//
// combine_rows -- definition: strata_prefill.contract.moe.combine (docs/numerics.md section 7):
//   acc = 0.0f; for k in rank order: acc = acc + w[t,k] * Y[slot[t*K+k], j];
//   with a shared expert: acc = acc + g[t] * Ysh[t, j];  then out[t, j] = x[t, j] + acc.
//   x, out: T rows of D floats (ldx / ldo); w float32 [T, K]; slot int32 [T*K];
//   Y: expert-sorted rows (ldy); g: float32 [T] (already the sigmoid) or NULL; Ysh rows (ldsh).
//   out may alias x.
// combine_rows_vec -- the same definition and arithmetic per element, laid out for bandwidth: a
//   CTA per token row (rows in a grid-stride loop), four consecutive j a thread (float4), the
//   row's K weights and slot rows read once a row into shared memory instead of once an
//   element, K <= COMBINE_MAXK. Needs D % 4 == 0 and every row start 16-byte aligned (the host
//   checks; combine_rows serves the rest).
// combine_rows_bias, combine_rows_vec_bias -- the same two forms with each routed output's expert
//   down bias added first: definition strata_prefill.contract.moe.combine(..., down_bias=(bd, ids)):
//   acc = acc + w[t,k] * (Y[slot[t*K+k], j] + bd[ids[t*K+k], j]) (the sum one float32 addition, then
//   the product, then the accumulation). ids int32 [T*K] (the router's), bd: rows of D floats,
//   row e at + e * ldbd. The vec form also needs bd's rows 16-byte aligned (the host checks).
// sigmoid_vec -- definition: strata_prefill.contract.numerics.sigmoid: y = 1.0f / (1.0f + exp(-x)) with the shared
//   polynomial exp; x read with a stride (incx), y contiguous.

#include <stdint.h>
#include "strata_numerics.cuh"  // strata_exp


// The element form's body; kBias: each routed output takes its expert's down bias row first
// (ids, bd, ldbd unused without it). Each branch keeps the load order its kernel was written
// with (the biased sum before the weight), which fixes the PTX's instruction order.
template <bool kBias>
__device__ __forceinline__ void combine_rows_body(
    const float* x, long long ldx, const float* __restrict__ w, const int* __restrict__ slot, int K,
    const float* __restrict__ y, long long ldy, const float* __restrict__ g, const float* __restrict__ ysh,
    long long ldsh, float* out, long long ldo, int T, int D, const int* __restrict__ ids,
    const float* __restrict__ bd, long long ldbd)
{
    const long long total = (long long)T * D;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long t = idx / D;
        const long long j = idx - t * D;
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) {
            const long long r = slot[t * K + k];
            if constexpr (kBias) {
                const float yb = __fadd_rn(y[r * ldy + j], bd[(long long)ids[t * K + k] * ldbd + j]);
                acc = __fadd_rn(acc, __fmul_rn(w[t * K + k], yb));
            } else {
                acc = __fadd_rn(acc, __fmul_rn(w[t * K + k], y[r * ldy + j]));
            }
        }
        if (g != nullptr) acc = __fadd_rn(acc, __fmul_rn(g[t], ysh[t * ldsh + j]));
        out[t * ldo + j] = __fadd_rn(x[t * ldx + j], acc);
    }
}

#define COMBINE_MAXK 64  // fast/cuda/elementwise.py COMBINE_MAXK (tests/test_kernel_sources.py)

__device__ __forceinline__ void add_scaled4(float4& acc, float w, const float4 v)
{
    acc.x = __fadd_rn(acc.x, __fmul_rn(w, v.x));
    acc.y = __fadd_rn(acc.y, __fmul_rn(w, v.y));
    acc.z = __fadd_rn(acc.z, __fmul_rn(w, v.z));
    acc.w = __fadd_rn(acc.w, __fmul_rn(w, v.w));
}

__device__ __forceinline__ float4 add4(const float4 a, const float4 b)
{
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

// The vec form's body; kBias as in combine_rows_body. sw, sy, sb: the kernel's shared arrays of
// COMBINE_MAXK (each rank's weight, Y row and bias row; sb unused without kBias), declared in
// the kernel so that they keep its name.
template <bool kBias>
__device__ __forceinline__ void combine_rows_vec_body(
    const float* x, long long ldx, const float* __restrict__ w, const int* __restrict__ slot, int K,
    const float* __restrict__ y, long long ldy, const float* __restrict__ g, const float* __restrict__ ysh,
    long long ldsh, float* out, long long ldo, int T, int D, const int* __restrict__ ids,
    const float* __restrict__ bd, long long ldbd, float* sw, const float** sy, const float** sb)
{
    const int D4 = D >> 2;
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        __syncthreads();  // the previous row's readers are done with sw, sy, sb
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            sw[k] = w[(long long)t * K + k];
            sy[k] = y + (long long)slot[(long long)t * K + k] * ldy;
            if constexpr (kBias) sb[k] = bd + (long long)ids[(long long)t * K + k] * ldbd;
        }
        __syncthreads();
        for (int j4 = threadIdx.x; j4 < D4; j4 += blockDim.x) {
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if constexpr (kBias) {
                for (int k = 0; k < K; ++k)
                    add_scaled4(acc, sw[k], add4(reinterpret_cast<const float4*>(sy[k])[j4],
                                                 reinterpret_cast<const float4*>(sb[k])[j4]));
            } else {
#pragma unroll 5
                for (int k = 0; k < K; ++k) add_scaled4(acc, sw[k], reinterpret_cast<const float4*>(sy[k])[j4]);
            }
            if (g != nullptr) add_scaled4(acc, g[t], reinterpret_cast<const float4*>(ysh + (long long)t * ldsh)[j4]);
            const float4 xv = reinterpret_cast<const float4*>(x + (long long)t * ldx)[j4];
            float4* o = reinterpret_cast<float4*>(out + (long long)t * ldo) + j4;
            // the same four additions either way; each form keeps the spelling its kernel was
            // written with, which fixes the PTX's register numbering
            if constexpr (kBias)
                *o = add4(xv, acc);
            else
                *o = make_float4(__fadd_rn(xv.x, acc.x), __fadd_rn(xv.y, acc.y), __fadd_rn(xv.z, acc.z),
                                 __fadd_rn(xv.w, acc.w));
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
combine_rows(const float* x, long long ldx, const float* __restrict__ w, const int* __restrict__ slot,
             int K, const float* __restrict__ y, long long ldy, const float* __restrict__ g,
             const float* __restrict__ ysh, long long ldsh, float* out, long long ldo, int T, int D)
{
    combine_rows_body<false>(x, ldx, w, slot, K, y, ldy, g, ysh, ldsh, out, ldo, T, D, nullptr, nullptr, 0);
}

extern "C" __global__ void __launch_bounds__(128)
combine_rows_vec(const float* x, long long ldx, const float* __restrict__ w, const int* __restrict__ slot,
                 int K, const float* __restrict__ y, long long ldy, const float* __restrict__ g,
                 const float* __restrict__ ysh, long long ldsh, float* out, long long ldo, int T, int D)
{
    __shared__ float sw[COMBINE_MAXK];
    __shared__ const float* sy[COMBINE_MAXK];
    combine_rows_vec_body<false>(x, ldx, w, slot, K, y, ldy, g, ysh, ldsh, out, ldo, T, D, nullptr, nullptr, 0,
                                 sw, sy, nullptr);
}

extern "C" __global__ void __launch_bounds__(256)
combine_rows_bias(const float* x, long long ldx, const float* __restrict__ w, const int* __restrict__ slot,
                  int K, const float* __restrict__ y, long long ldy, const float* __restrict__ g,
                  const float* __restrict__ ysh, long long ldsh, float* out, long long ldo, int T, int D,
                  const int* __restrict__ ids, const float* __restrict__ bd, long long ldbd)
{
    combine_rows_body<true>(x, ldx, w, slot, K, y, ldy, g, ysh, ldsh, out, ldo, T, D, ids, bd, ldbd);
}

extern "C" __global__ void __launch_bounds__(128)
combine_rows_vec_bias(const float* x, long long ldx, const float* __restrict__ w, const int* __restrict__ slot,
                      int K, const float* __restrict__ y, long long ldy, const float* __restrict__ g,
                      const float* __restrict__ ysh, long long ldsh, float* out, long long ldo, int T, int D,
                      const int* __restrict__ ids, const float* __restrict__ bd, long long ldbd)
{
    __shared__ float sw[COMBINE_MAXK];
    __shared__ const float* sy[COMBINE_MAXK];
    __shared__ const float* sb[COMBINE_MAXK];
    combine_rows_vec_body<true>(x, ldx, w, slot, K, y, ldy, g, ysh, ldsh, out, ldo, T, D, ids, bd, ldbd, sw, sy, sb);
}

extern "C" __global__ void __launch_bounds__(256)
sigmoid_vec(const float* __restrict__ x, long long incx, float* __restrict__ y, long long n)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = 1.0f / __fadd_rn(1.0f, strata_exp(-x[i * incx]));
}
