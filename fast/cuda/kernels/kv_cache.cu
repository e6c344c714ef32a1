// Writing a chunk's K and V into the KV cache of one layer.
//
// Definition: strata_prefill.contract.attention.KVCache.write, with the arithmetic of
// strata_prefill.contract.blockquant.quantize_blocks over one block of the whole head row
// (docs/numerics.md sections 2 and 5): amax = max |x_i|; amax == 0 -> d = 0, codes 0;
//   else d_inv = qmax / amax, q_i = roundf(x_i * d_inv) (non-finite: 0), d = 1.0f / d_inv.
//   K: qmax 511, the codes stored as float16 (integers, exact), one float32 scale per (token,
//     KV head).
//   V: qmax 127, int8 codes, one float32 scale per (token, KV head).
//   Both by row_quantize_warp of strata_numerics.cuh (a tiny amax: d_inv = inf, every code 0,
//   d = 1 / inf = 0).
// Cache layout of one layer (as the NumPy class):
//   k_codes [n_kv, capacity, hd] float16  k_scale [n_kv, capacity] float32
//   v_codes [n_kv, capacity, hd] int8     v_scale [n_kv, capacity]        float32
// k, v: T tokens of n_kv head vectors of hd floats (token t at + t * ldk / + t * ldv, head h at
// + h * hd). positions: int32 [T], absolute, distinct, < capacity (not checked here).
// v_t (optional, NULL: not written): the same V codes in the pair kernel's transposed blocks
// (layout: v_blocks.cuh), [n_kv, ceil(capacity / 64), hd, 64] int8.
// One warp per (token, KV head); lane l holds values l + 32 b. --fmad=false, IEEE division.
// v_transpose: v_t from v_codes for keys 0 .. n_keys - 1 (a cache written without v_t).

#include <stdint.h>
#include <cuda_fp16.h>
#include "strata_numerics.cuh"  // row_quantize_warp
#include "v_blocks.cuh"         // vt_offset

#define KV_WARPS 8
#define KV_MAX_HD 256

extern "C" __global__ void __launch_bounds__(32 * KV_WARPS)
kv_write(const float* __restrict__ k, long long ldk, const float* __restrict__ v, long long ldv,
         const int* __restrict__ positions, int T, int n_kv, int hd, int capacity,
         unsigned short* __restrict__ k_codes, float* __restrict__ k_scale,
         int8_t* __restrict__ v_codes, float* __restrict__ v_scale, int8_t* __restrict__ v_t)
{
    const int lane = threadIdx.x & 31;
    const long long task = (long long)blockIdx.x * KV_WARPS + (threadIdx.x >> 5);
    if (task >= (long long)T * n_kv) return;
    const long long t = task / n_kv;
    const int h = (int)(task - t * n_kv);
    const long long pos = positions[t];
    const float* kr = k + t * ldk + (long long)h * hd;
    const float* vr = v + t * ldv + (long long)h * hd;
    const long long cache_row = (long long)h * capacity + pos;

    const int nb = hd >> 5;

    // K and V: one scale for the whole head_dim row each; K's codes (|k| <= 511) as float16,
    // V's (|v| <= 127) as int8
    float xk[KV_MAX_HD / 32], xv[KV_MAX_HD / 32], kc[KV_MAX_HD / 32], vc[KV_MAX_HD / 32];
#pragma unroll
    for (int b = 0; b < KV_MAX_HD / 32; ++b) {
        xk[b] = (b < nb) ? kr[32 * b + lane] : 0.0f;
        xv[b] = (b < nb) ? vr[32 * b + lane] : 0.0f;
    }
    const float dk = row_quantize_warp<KV_MAX_HD / 32>(xk, 511.0f, kc);
    const float dv = row_quantize_warp<KV_MAX_HD / 32>(xv, 127.0f, vc);
#pragma unroll
    for (int b = 0; b < KV_MAX_HD / 32; ++b) {
        if (b < nb) {
            k_codes[cache_row * hd + 32 * b + lane] = __half_as_ushort(__float2half_rn(kc[b]));
            const int8_t q = (int8_t)(int)vc[b];
            v_codes[cache_row * hd + 32 * b + lane] = q;
            if (v_t) v_t[vt_offset(h, pos, 32 * b + lane, hd, capacity)] = q;
        }
    }
    if (lane == 0) {
        k_scale[cache_row] = dk;
        v_scale[cache_row] = dv;
    }
}

extern "C" __global__ void __launch_bounds__(256)
v_transpose(const int8_t* __restrict__ v_codes, int n_kv, int hd, int capacity, long long n_keys,
            int8_t* __restrict__ v_t)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // (h, key, dim)
    if (i >= (long long)n_kv * n_keys * hd) return;
    const int d = (int)(i % hd);
    const long long hj = i / hd;
    const long long j = hj % n_keys;
    const int h = (int)(hj / n_keys);
    v_t[vt_offset(h, j, d, hd, capacity)] = v_codes[((long long)h * capacity + j) * hd + d];
}
