// q8_1 quantization of float32 rows into the column-block-major block_q8_1_mmq buffer.
//
// Definitions: strata_prefill.contract.q8_1.gather_quantize (row r <- quantize(x[src[r]])) and
// strata_prefill.contract.q8_1.scatter_quantize (token t quantized once, its blocks written to rows
// slot[t*K_used + k], k < K_used); both through strata_prefill.contract.q8_1.quantize_rows
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
#include "qformats.cuh"         // LAYOUT_D4, LAYOUT_DS4, LAYOUT_D2S6 (written from contract/q8_1.py)
#include "q8_1_block.cuh"       // q8_1_block, store_block, load4, for_each_block_task

#define Q8_WARPS 8


// Quantize the kb-th 128-value block of row xr (K values). Returns this lane's 4 codes;
// hdr receives header word `lane` in lanes 0..3.
__device__ __forceinline__ uint32_t quant_block(const float* __restrict__ xr, int K, int kb, int layout,
                                                int lane, uint32_t& hdr) {
    float v[4];
    load4(xr, kb * 128 + 4 * lane, K, v);
    return q8_1_block(v[0], v[1], v[2], v[3], layout, lane, hdr);
}

// Row r (r < n_rows) of the buffer <- x[src[r]]. x: float32 rows of stride ldx; out: R_total rows.
extern "C" __global__ void __launch_bounds__(32 * Q8_WARPS)
    q8_1_gather(const float* __restrict__ x, long long ldx, const int* __restrict__ src, int n_rows, int K,
                int layout, uint8_t* __restrict__ out, int R_total) {
    const int lane = threadIdx.x & 31;
    for_each_block_task<Q8_WARPS>(n_rows, ((K + 511) / 512) * 4, [&](int r, int kb) {
        uint32_t hdr = 0;
        const uint32_t codes = quant_block(x + (long long)src[r] * ldx, K, kb, layout, lane, hdr);
        store_block(out, (long long)kb * R_total + r, lane, hdr, codes);
    });
}

// Token t (t < T) quantized once, written to rows slot[t*K_used + k] of a buffer of R_total rows.
extern "C" __global__ void __launch_bounds__(32 * Q8_WARPS)
    q8_1_scatter(const float* __restrict__ x, long long ldx, const int* __restrict__ slot, int T, int K_used,
                 int K, int layout, uint8_t* __restrict__ out, int R_total) {
    const int lane = threadIdx.x & 31;
    for_each_block_task<Q8_WARPS>(T, ((K + 511) / 512) * 4, [&](int t, int kb) {
        uint32_t hdr = 0;
        const uint32_t codes = quant_block(x + (long long)t * ldx, K, kb, layout, lane, hdr);
        const int* sl = slot + (long long)t * K_used;
        for (int k = 0; k < K_used; ++k)
            store_block(out, (long long)kb * R_total + sl[k], lane, hdr, codes);
    });
}
