// q8_1 quantization of float32 rows into the column-block-major block_q8_1_mmq buffer.
//
// Definitions: strata.q8_1.gather_quantize (row r <- quantize(x[src[r]])) and
// strata.q8_1.scatter_quantize (token t quantized once, its blocks written to rows
// slot[t*K_used + k], k < K_used); both through strata.q8_1.quantize_rows
// (docs/numerics.md section 2). Same bytes, every byte, all three layouts:
//   D4   (layout 0): float d[4]                one scale per 32 values
//   DS4  (layout 1): half2 (d, s)[4]           scale and float sum per 32 values
//   D2S6 (layout 2): half d0, d1, s0..s5       scale per 64 values, sums of 16-value groups 0..5
// A group of values: amax = max|x|; amax == 0 -> d = 0, q = 0; else d_inv = 127 / amax,
// q = roundf(x * d_inv) (half away from zero, exact), d = 1 / d_inv. Sums over the float
// inputs: runs of 4 left to right, then a halving tree (an xor butterfly here: float addition
// is commutative, so every lane holds the tree's bits). Rows are padded with zeros to a
// multiple of 512 values; padding blocks come out as zeros (d = 0, sums 0, codes 0).
// Buffer: block (kb, r) of 144 bytes at index kb * R_total + r.
//
// One warp quantizes one 128-value block: lane l holds values 4l..4l+3.
// Compiled with --fmad=false; IEEE division.

#include <cuda_fp16.h>
#include <stdint.h>
#include "strata_numerics.cuh"  // q8_inv_scale, q8_round, q8_scale

#define Q8_WARPS 8


__device__ __forceinline__ uint32_t h16(float v) {
    return (uint32_t)__half_as_ushort(__float2half_rn(v));
}

// Quantize the kb-th 128-value block of row xr (K values). Returns this lane's 4 codes;
// hdr receives header word `lane` in lanes 0..3.
__device__ __forceinline__ uint32_t quant_block(const float* __restrict__ xr, int K, int kb, int layout,
                                                int lane, uint32_t& hdr) {
    const int c0 = kb * 128 + 4 * lane;
    float v0 = 0.0f, v1 = 0.0f, v2 = 0.0f, v3 = 0.0f;
    if (c0 + 3 < K && ((((uintptr_t)(xr + c0)) & 15) == 0)) {
        const float4 f = *reinterpret_cast<const float4*>(xr + c0);
        v0 = f.x; v1 = f.y; v2 = f.z; v3 = f.w;
    } else {
        if (c0 + 0 < K) v0 = xr[c0 + 0];
        if (c0 + 1 < K) v1 = xr[c0 + 1];
        if (c0 + 2 < K) v2 = xr[c0 + 2];
        if (c0 + 3 < K) v3 = xr[c0 + 3];
    }
    float amax = fmaxf(fmaxf(fabsf(v0), fabsf(v1)), fmaxf(fabsf(v2), fabsf(v3)));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
    if (layout == 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 8));

    float d = 0.0f;
    uint32_t codes = 0;
    if (amax != 0.0f) {
        const float d_inv = q8_inv_scale(amax);
        const int q0 = (int)q8_round(v0, d_inv);
        const int q1 = (int)q8_round(v1, d_inv);
        const int q2 = (int)q8_round(v2, d_inv);
        const int q3 = (int)q8_round(v3, d_inv);
        codes = (uint32_t)(q0 & 0xFF) | ((uint32_t)(q1 & 0xFF) << 8) | ((uint32_t)(q2 & 0xFF) << 16) |
                ((uint32_t)(q3 & 0xFF) << 24);
        d = q8_scale(d_inv);
    }

    // sums: run of 4, then the halving tree over 8 (DS4) or 4 (D2S6) runs
    float s = ((v0 + v1) + v2) + v3;
    if (layout == 1) s = s + __shfl_xor_sync(0xffffffffu, s, 4);
    s = s + __shfl_xor_sync(0xffffffffu, s, 2);
    s = s + __shfl_xor_sync(0xffffffffu, s, 1);

    const int w = lane & 3;
    if (layout == 0) {
        const float dw = __shfl_sync(0xffffffffu, d, 8 * w);
        hdr = __float_as_uint(dw);
    } else if (layout == 1) {
        const float dw = __shfl_sync(0xffffffffu, d, 8 * w);
        const float sw = __shfl_sync(0xffffffffu, s, 8 * w);
        hdr = h16(dw) | (h16(sw) << 16);
    } else {
        // word 0: d0 d1; word 1: s0 s1; word 2: s2 s3; word 3: s4 s5
        const float d0 = __shfl_sync(0xffffffffu, d, 0);
        const float d1 = __shfl_sync(0xffffffffu, d, 16);
        const int ga = (w == 0) ? 0 : 2 * w - 2;  // 16-value group of the low half
        const float sa = __shfl_sync(0xffffffffu, s, 4 * ga);
        const float sb = __shfl_sync(0xffffffffu, s, 4 * ga + 4);
        hdr = (w == 0) ? (h16(d0) | (h16(d1) << 16)) : (h16(sa) | (h16(sb) << 16));
    }
    return codes;
}

__device__ __forceinline__ void store_block(uint8_t* __restrict__ out, long long blk, int lane, uint32_t hdr,
                                            uint32_t codes) {
    uint32_t* b = reinterpret_cast<uint32_t*>(out + blk * 144);
    if (lane < 4) b[lane] = hdr;
    b[4 + lane] = codes;
}

// Row r (r < n_rows) of the buffer <- x[src[r]]. x: float32 rows of stride ldx; out: R_total rows.
extern "C" __global__ void __launch_bounds__(32 * Q8_WARPS)
    q8_1_gather(const float* __restrict__ x, long long ldx, const int* __restrict__ src, int n_rows, int K,
                int layout, uint8_t* __restrict__ out, int R_total) {
    const int lane = threadIdx.x & 31;
    const int nkb = ((K + 511) / 512) * 4;
    const long long tasks = (long long)n_rows * nkb;
    for (long long task = (long long)blockIdx.x * Q8_WARPS + (threadIdx.x >> 5); task < tasks;
         task += (long long)gridDim.x * Q8_WARPS) {
        const int r = (int)(task / nkb), kb = (int)(task - (long long)r * nkb);
        const float* xr = x + (long long)src[r] * ldx;
        uint32_t hdr = 0;
        const uint32_t codes = quant_block(xr, K, kb, layout, lane, hdr);
        store_block(out, (long long)kb * R_total + r, lane, hdr, codes);
    }
}

// Token t (t < T) quantized once, written to rows slot[t*K_used + k] of a buffer of R_total rows.
extern "C" __global__ void __launch_bounds__(32 * Q8_WARPS)
    q8_1_scatter(const float* __restrict__ x, long long ldx, const int* __restrict__ slot, int T, int K_used,
                 int K, int layout, uint8_t* __restrict__ out, int R_total) {
    const int lane = threadIdx.x & 31;
    const int nkb = ((K + 511) / 512) * 4;
    const long long tasks = (long long)T * nkb;
    for (long long task = (long long)blockIdx.x * Q8_WARPS + (threadIdx.x >> 5); task < tasks;
         task += (long long)gridDim.x * Q8_WARPS) {
        const int t = (int)(task / nkb), kb = (int)(task - (long long)t * nkb);
        uint32_t hdr = 0;
        const uint32_t codes = quant_block(x + (long long)t * ldx, K, kb, layout, lane, hdr);
        const int* sl = slot + (long long)t * K_used;
        for (int k = 0; k < K_used; ++k)
            store_block(out, (long long)kb * R_total + sl[k], lane, hdr, codes);
    }
}
