// RMSNorm of float32 rows.
//
// Definition: strata_prefill.contract.numerics.rmsnorm (docs/numerics.md section 1, "RMSNorm" and "Reductions").
//   ss   = lane_sum(x_i * x_i)         lane l: acc = acc + x[i]*x[i] for i = l, l+32, ... < n,
//                                      then the xor butterfly 16, 8, 4, 2, 1
//   mean = ss / (float)n
//   r    = 1.0f / sqrtf(mean + eps)    IEEE sqrt and division (never rsqrtf)
//   y_i  = (x_i * r) * w_i
// One warp per row. Compiled with --fmad=false (no contraction).
//
// Rows: row r = (t, h) with t = r / heads, h = r % heads, at x + t * ldx + h * n (and the same for
// y with ldy). heads = 1 and ldx = n gives plain contiguous rows; heads > 1 covers the per-head
// Q/K norms of a [T, heads, head_dim] tensor (ldx = heads * head_dim, or wider for a fused row).
// y may alias x (each lane reads and writes only its own elements).

#include <stdint.h>
#include "strata_numerics.cuh"  // warp_sum

#define RMS_WARPS 8

extern "C" __global__ void __launch_bounds__(32 * RMS_WARPS)
rmsnorm_rows(const float* x, long long ldx, const float* __restrict__ w, float* y, long long ldy,
             int rows, int heads, int n, float eps)
{
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * RMS_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    const long long t = row / heads;
    const long long h = row - t * heads;
    const float* xr = x + t * ldx + h * n;
    float* yr = y + t * ldy + h * n;

    float acc = 0.0f;
    for (int i = lane; i < n; i += 32) {
        const float v = xr[i];
        acc = acc + v * v;
    }
    acc = warp_sum(acc);

    const float mean = acc / (float)n;
    const float r = 1.0f / sqrtf(mean + eps);
    for (int i = lane; i < n; i += 32) {
        const float v = xr[i];
        yr[i] = (v * r) * w[i];
    }
}
