// NEOX rotary position embedding, in place or out of place.
//
// Definition: strata_prefill.contract.numerics.rope_neox (docs/numerics.md section 1, "RoPE (NEOX)"), with the
// float32 table from strata_prefill.contract.numerics.rope_table computed on the host and uploaded: the device
// never evaluates sin or cos.
//   for i < hd/2, j = i + hd/2, c = cos[pos, i], s = sin[pos, i]:
//   y_i = x_i * c - x_j * s
//   y_j = x_i * s + x_j * c          (each product rounded, then the sum; --fmad=false)
// x: T tokens of `heads` head vectors of hd floats, token t at x + t * ldx, head h at + h * hd.
// positions: int32 [T], absolute, indices into the table (rows of hd/2 floats).
// One thread per (token, head, i). y may alias x.

#include <stdint.h>

extern "C" __global__ void __launch_bounds__(256)
rope_neox(const float* x, long long ldx, float* y, long long ldy, const int* __restrict__ positions,
          const float* __restrict__ cos_t, const float* __restrict__ sin_t, int T, int heads, int hd)
{
    const int half = hd >> 1;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)T * heads * half;
    if (idx >= total) return;
    const int i = (int)(idx % half);
    const long long th = idx / half;
    const int h = (int)(th % heads);
    const long long t = th / heads;
    const long long p = positions[t];
    const float c = cos_t[p * half + i];
    const float s = sin_t[p * half + i];
    const float* xr = x + t * ldx + (long long)h * hd;
    float* yr = y + t * ldy + (long long)h * hd;
    const float xi = xr[i];
    const float xj = xr[i + half];
    yr[i] = xi * c - xj * s;
    yr[i + half] = xi * s + xj * c;
}
