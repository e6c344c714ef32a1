// Combine of the routed experts' outputs (plus the shared expert) into the residual, and the
// shared expert's gate.
//
// combine_rows -- definition: strata.moe.combine (docs/numerics.md section 7):
//   acc = 0.0f; for k in rank order: acc = acc + w[t,k] * Y[slot[t*K+k], j];
//   with a shared expert: acc = acc + g[t] * Ysh[t, j];  then out[t, j] = x[t, j] + acc.
//   x, out: T rows of D floats (ldx / ldo); w float32 [T, K]; slot int32 [T*K];
//   Y: expert-sorted rows (ldy); g: float32 [T] (already the sigmoid) or NULL; Ysh rows (ldsh).
//   out may alias x.
// sigmoid_vec -- definition: strata.numerics.sigmoid: y = 1.0f / (1.0f + exp(-x)) with the shared
//   polynomial exp; x read with a stride (incx), y contiguous.

#include <stdint.h>
#include "strata_numerics.cuh"  // strata_exp


extern "C" __global__ void __launch_bounds__(256)
combine_rows(const float* x, long long ldx, const float* __restrict__ w, const int* __restrict__ slot,
             int K, const float* __restrict__ y, long long ldy, const float* __restrict__ g,
             const float* __restrict__ ysh, long long ldsh, float* out, long long ldo, int T, int D)
{
    const long long total = (long long)T * D;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long t = idx / D;
        const long long j = idx - t * D;
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) {
            const long long r = slot[t * K + k];
            acc = __fadd_rn(acc, __fmul_rn(w[t * K + k], y[r * ldy + j]));
        }
        if (g != nullptr) acc = __fadd_rn(acc, __fmul_rn(g[t], ysh[t * ldsh + j]));
        out[t * ldo + j] = __fadd_rn(x[t * ldx + j], acc);
    }
}

extern "C" __global__ void __launch_bounds__(256)
sigmoid_vec(const float* __restrict__ x, long long incx, float* __restrict__ y, long long n)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = 1.0f / __fadd_rn(1.0f, strata_exp(-x[i * incx]));
}
