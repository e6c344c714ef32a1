// The warp's quantize of one 128-value block of a q8_1 row into its 144 bytes
// (block_q8_1_mmq), with the guarded load and the task loop around it, shared by
// quantize_q8_1.cu and swiglu_q8_1.cu so that both write the same bytes from the same floats:
// strata_prefill.contract.q8_1.quantize_rows, docs/numerics.md section 2.
// Include strata_numerics.cuh (q8_inv_scale, q8_round, q8_scale) and cuda_fp16.h first:
// fast/cuda/runtime.py inlines one level of local headers, so this file includes none.
#ifndef STRATA_Q8_1_BLOCK_CUH
#define STRATA_Q8_1_BLOCK_CUH
#ifndef LAYOUT_D4
#error "include qformats.cuh (the q8_1 layouts' numbers) before q8_1_block.cuh"
#endif

__device__ __forceinline__ uint32_t h16(float v) {
    return (uint32_t)__half_as_ushort(__float2half_rn(v));
}

// Lane l holds values 4l..4l+3 of the block (0.0f past the row's end). Returns this lane's 4
// codes; hdr receives header word `lane` in lanes 0..3. layout: LAYOUT_D4, LAYOUT_DS4 or LAYOUT_D2S6
// (qformats.cuh, written from contract/q8_1.py's Layout: the includer includes it first).
__device__ __forceinline__ uint32_t q8_1_block(float v0, float v1, float v2, float v3, int layout, int lane,
                                               uint32_t& hdr) {
    float amax = fmaxf(fmaxf(fabsf(v0), fabsf(v1)), fmaxf(fabsf(v2), fabsf(v3)));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
    if (layout == LAYOUT_D2S6) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 8));

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
    if (layout == LAYOUT_DS4) s = s + __shfl_xor_sync(0xffffffffu, s, 4);
    s = s + __shfl_xor_sync(0xffffffffu, s, 2);
    s = s + __shfl_xor_sync(0xffffffffu, s, 1);

    const int w = lane & 3;
    if (layout == LAYOUT_D4) {
        const float dw = __shfl_sync(0xffffffffu, d, 8 * w);
        hdr = __float_as_uint(dw);
    } else if (layout == LAYOUT_DS4) {
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

// Values c0..c0+3 of a row of n floats (0.0f past n): one 16-byte load where they are all
// inside the row and aligned, else one guarded load each (the same values either way).
__device__ __forceinline__ void load4(const float* __restrict__ row, int c0, int n, float (&v)[4]) {
    if (c0 + 3 < n && (((uintptr_t)(row + c0)) & 15) == 0) {
        const float4 f = *reinterpret_cast<const float4*>(row + c0);
        v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = (c0 + i < n) ? row[c0 + i] : 0.0f;
    }
}

// The q8_1 writers' work split: one warp per (row r, 128-value block kb) task, rows x nkb
// tasks strided over the grid (WARPS warps a CTA); fn(r, kb) does one.
template <int WARPS, class F>
__device__ __forceinline__ void for_each_block_task(long long rows, int nkb, F fn) {
    const long long tasks = rows * nkb;
    for (long long task = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5); task < tasks;
         task += (long long)gridDim.x * WARPS) {
        const int r = (int)(task / nkb);
        fn(r, (int)(task - (long long)r * nkb));
    }
}

__device__ __forceinline__ void store_block(uint8_t* __restrict__ out, long long blk, int lane, uint32_t hdr,
                                            uint32_t codes) {
    uint32_t* b = reinterpret_cast<uint32_t*>(out + blk * 144);
    if (lane < 4) b[lane] = hdr;
    b[4 + lane] = codes;
}

#endif  // STRATA_Q8_1_BLOCK_CUH
