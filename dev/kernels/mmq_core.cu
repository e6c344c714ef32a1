// MMQ's product core for a sub-scaled type, in four forms side by side: the int8 tensor cores
// with production's epilogue (v1, mmq.cu's IQ2_XS arithmetic), fp16 tensor cores that sum
// the sub-scaled integers themselves (v2), and v1's arithmetic with its products on Hopper's
// asynchronous warpgroup instructions (v3 and v4, wgmma; sm_90a only). dev/kernels/mmq_core.py checks both against the NumPy
// definition byte for byte and times them. The question (docs/performance.md, "MMQ's sub-scales
// on half-precision tensor cores"): what the core gains when the epilogue falls from 6 FMA-pipe
// instructions an output and block to 3, at the price of the operands' conversion to fp16.
//
// Definition (dev/kernels/mmq_core.py: definition; mmq.cu's IQ2_XS epilogue, docs/numerics.md
// section 3): out[r][n] = fold over 32-value blocks b, ascending, of
//     acc = acc + (dw[n][b] * da[r][b]) * s,   s = (float)(u[n][2b] * S0 + u[n][2b+1] * S1)
// with S0, S1 the integer dot products of weight codes w[n] and activation codes x[r] over the
// block's two 16-value halves (|s| < 2^24: s is exact however it is summed).
//
// Not a production kernel: no decode (weights come as int8 codes and a sub-scale per 16 values),
// whole tiles only (N a multiple of 64, R of 128, K of 128), double-buffered cp.async staging the
// same in both forms. Compiled with --fmad=false as every kernel is.
//
// Tiling: a CTA multiplies 64 weight rows by 128 activation rows, 8 warps as 4 x 2: warp (wm,
// wn) holds weight rows 16 wm .. 16 wm + 15 and the n8 activation tiles wn, wn + 2, .., wn + 14.
// K in chunks of 128 values (4 blocks).
//
// v2's fp16 operands (PTX m16n8k16 .f16 fragments, g = lane / 4, t = lane % 4): the k order
// inside each 16-value half is permuted the same way for A and B, which a dot product allows:
// logical k 2t, 2t+1 is physical 4t, 4t+1 and logical 2t+8, 2t+9 is physical 4t+2, 4t+3. So
// A comes from the int8 ldmatrix fragment unchanged (its register holds physical 4t .. 4t+3 of
// a row), each byte pair widened in registers and multiplied by its half's sub-scale; B from an
// fp16 copy of the chunk's activation codes that stores each half as [its pairs (0,1), (4,5),
// (8,9), (12,13) | (2,3), (6,7), (10,11), (14,15)], read by ldmatrix.
// int8 -> fp16: the byte x ^ 0x80 under exponent 0x64 is the half 1152 + x (x + 128 in the low
// mantissa bits of 1024); (1152 + x) * u - 1152 u, one fused rounding of an exact value that
// fits fp16 (|x u| <= 127 * 31), is x u; (1152 + x) - 1152 is x.
#include <cuda_fp16.h>
#include <stdint.h>
#include "strata_numerics.cuh"  // MAGIC_I, MAGIC_F, scaled_magic
#include "wgmma.cuh"            // v3: wgmma_s8_ra, its fences, wg_desc, cm_off (used under sm_90a only)

#define BM 64
#define BN 128
#define WM 4
#define WN 2
#define NT (32 * WM * WN)
#define T8 (BN / (8 * WN))  // n8 tiles a warp
#define KC 128
#define STR 144              // int8 row stride in shared memory (128 codes + 16)
#define HSTR 272             // fp16 row stride (256 bytes + 16)
// one stage: weight codes, activation codes, dw [BM][4], u [BM][8] (bytes), da [BN][4]
#define ST_W 0
#define ST_X (ST_W + BM * STR)
#define ST_DW (ST_X + BN * STR)
#define ST_U (ST_DW + BM * 16)
#define ST_DA (ST_U + BM * 8)
#define STAGE (ST_DA + BN * 16)

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp8(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void mma_s8_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a0), "r"(a1), "r"(b0), "r"(MAGIC_I));
}
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// the halves 1152 + x of the two bytes of w (its bytes 0, 1 for SEL 0x4140, 2, 3 for 0x4342)
template <uint32_t SEL>
__device__ __forceinline__ __half2 biased(uint32_t w) {
    const uint32_t h = __byte_perm(w ^ 0x80808080u, 0x64646464u, SEL);
    return *reinterpret_cast<const __half2*>(&h);
}
template <uint32_t SEL>
__device__ __forceinline__ uint32_t times_u(uint32_t w, __half2 u, __half2 nu) {  // x * u, both bytes
    const __half2 r = __hfma2(biased<SEL>(w), u, nu);
    return *reinterpret_cast<const uint32_t*>(&r);
}

template <bool F16>
__device__ __forceinline__ void core(const int8_t* __restrict__ w, const uint8_t* __restrict__ u,
                                     const float* __restrict__ dw, const int8_t* __restrict__ x,
                                     const float* __restrict__ da, float* __restrict__ out, int N, int K) {
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM, g = lane >> 2, t4 = lane & 3;
    const int n0 = blockIdx.x * BM, r0 = blockIdx.y * BN;
    const int nch = K / KC, nb = K / 32;
    uint8_t* xh = smem + 2 * STAGE;  // v2: the chunk's activation codes as fp16

    auto issue = [&](int kc) {
        if (kc < nch) {
            uint8_t* st = smem + (kc & 1) * STAGE;
            for (int i = tid; i < BM * 8; i += NT) {
                const int row = i >> 3, p = i & 7;
                cp16(smem_u32(st + ST_W + row * STR + p * 16), w + (long long)(n0 + row) * K + kc * KC + p * 16);
            }
            for (int i = tid; i < BN * 8; i += NT) {
                const int row = i >> 3, p = i & 7;
                cp16(smem_u32(st + ST_X + row * STR + p * 16), x + (long long)(r0 + row) * K + kc * KC + p * 16);
            }
            for (int i = tid; i < BM; i += NT) {
                cp16(smem_u32(st + ST_DW + i * 16), dw + (long long)(n0 + i) * nb + kc * 4);
                cp8(smem_u32(st + ST_U + i * 8), u + (long long)(n0 + i) * (K / 16) + kc * 8);
            }
            for (int i = tid; i < BN; i += NT)
                cp16(smem_u32(st + ST_DA + i * 16), da + (long long)(r0 + i) * nb + kc * 4);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };

    float acc[T8][4];
#pragma unroll
    for (int s = 0; s < T8; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.0f;
    const int rA = wm * 16 + g, rB = rA + 8;
    const uint32_t a_off = (uint32_t)((wm * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * STR + (lane >> 4) * 16);
    const __half2 bias = __float2half2_rn(1152.0f);

    issue(0);
    for (int kc = 0; kc < nch; ++kc) {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();  // chunk kc has landed; every warp is done with chunk kc - 1
        issue(kc + 1);
        const uint8_t* st = smem + (kc & 1) * STAGE;
        const float* dws = reinterpret_cast<const float*>(st + ST_DW);
        const float* das = reinterpret_cast<const float*>(st + ST_DA);
        const uint8_t* us = st + ST_U;
        if constexpr (F16) {
            // the activation codes as halves, each 16-value half in the permuted order above
            for (int i = tid; i < BN * 8; i += NT) {
                const int row = i >> 3, hv = i & 7;
                const uint4 c = *reinterpret_cast<const uint4*>(st + ST_X + row * STR + hv * 16);
                const uint32_t cw[4] = {c.x, c.y, c.z, c.w};
                uint32_t lo[4], hi[4];
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const __half2 l = __hsub2(biased<0x4140>(cw[q]), bias), h = __hsub2(biased<0x4342>(cw[q]), bias);
                    lo[q] = *reinterpret_cast<const uint32_t*>(&l);
                    hi[q] = *reinterpret_cast<const uint32_t*>(&h);
                }
                uint4* dst = reinterpret_cast<uint4*>(xh + row * HSTR + hv * 32);
                dst[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
                dst[1] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            }
            __syncthreads();
        }
#pragma unroll 1
        for (int j = 0; j < 4; ++j) {  // not unrolled: the block's operands stay in registers, no spills
            uint32_t a[4];
            ldsm_x4(a, smem_u32(st + ST_W) + a_off + j * 32);
            const float dwA = dws[rA * 4 + j], dwB = dws[rB * 4 + j];
            const float uA0 = us[rA * 8 + 2 * j], uA1 = us[rA * 8 + 2 * j + 1];
            const float uB0 = us[rB * 8 + 2 * j], uB1 = us[rB * 8 + 2 * j + 1];
            if constexpr (F16) {
                const __half2 hA0 = __float2half2_rn(uA0), hA1 = __float2half2_rn(uA1);
                const __half2 hB0 = __float2half2_rn(uB0), hB1 = __float2half2_rn(uB1);
                const __half2 nA0 = __float2half2_rn(-1152.0f * uA0), nA1 = __float2half2_rn(-1152.0f * uA1);
                const __half2 nB0 = __float2half2_rn(-1152.0f * uB0), nB1 = __float2half2_rn(-1152.0f * uB1);
                // a[0] row g, a[1] row g + 8 (first half: physical k 0 .. 15); a[2], a[3] the second half
                const uint32_t h0[4] = {times_u<0x4140>(a[0], hA0, nA0), times_u<0x4140>(a[1], hB0, nB0),
                                        times_u<0x4342>(a[0], hA0, nA0), times_u<0x4342>(a[1], hB0, nB0)};
                const uint32_t h1[4] = {times_u<0x4140>(a[2], hA1, nA1), times_u<0x4140>(a[3], hB1, nB1),
                                        times_u<0x4342>(a[2], hA1, nA1), times_u<0x4342>(a[3], hB1, nB1)};
#pragma unroll
                for (int s = 0; s < T8; ++s) {
                    const int tile = wn + WN * s;
                    uint32_t b[4];
                    ldsm_x4(b, smem_u32(xh) + (tile * 8 + (lane & 7)) * HSTR + j * 64 + (lane >> 3) * 16);
                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_f16(d, h0, b[0], b[1]);
                    mma_f16(d, h1, b[2], b[3]);
                    const int c = tile * 8 + 2 * t4;
                    const float dx = das[c * 4 + j], dy = das[(c + 1) * 4 + j];
                    acc[s][0] = acc[s][0] + (dwA * dx) * d[0];
                    acc[s][1] = acc[s][1] + (dwA * dy) * d[1];
                    acc[s][2] = acc[s][2] + (dwB * dx) * d[2];
                    acc[s][3] = acc[s][3] + (dwB * dy) * d[3];
                }
            } else {
                const float mA0 = uA0 * -MAGIC_F, mA1 = uA1 * -MAGIC_F, mB0 = uB0 * -MAGIC_F, mB1 = uB1 * -MAGIC_F;
#pragma unroll
                for (int p = 0; p < T8 / 2; ++p) {
                    // tiles 2p and 2p + 1 (n8 tiles wn + WN 2p and + WN): lanes 0-15 the first, 16-31 the second
                    uint32_t b[4];
                    const int tile0 = wn + WN * 2 * p;
                    const int row = (tile0 + ((lane >> 4) ? WN : 0)) * 8 + (lane & 7);
                    ldsm_x4(b, smem_u32(st + ST_X) + row * STR + j * 32 + ((lane >> 3) & 1) * 16);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int s = 2 * p + h;
                        int d0[4], d1[4];
                        mma_s8_k16(d0, a[0], a[1], b[2 * h]);
                        mma_s8_k16(d1, a[2], a[3], b[2 * h + 1]);
                        const int c = (wn + WN * s) * 8 + 2 * t4;
                        const float dx = das[c * 4 + j], dy = das[(c + 1) * 4 + j];
                        acc[s][0] = acc[s][0] + (dwA * dx) * (scaled_magic(uA0, mA0, d0[0]) + scaled_magic(uA1, mA1, d1[0]));
                        acc[s][1] = acc[s][1] + (dwA * dy) * (scaled_magic(uA0, mA0, d0[1]) + scaled_magic(uA1, mA1, d1[1]));
                        acc[s][2] = acc[s][2] + (dwB * dx) * (scaled_magic(uB0, mB0, d0[2]) + scaled_magic(uB1, mB1, d1[2]));
                        acc[s][3] = acc[s][3] + (dwB * dy) * (scaled_magic(uB0, mB0, d0[3]) + scaled_magic(uB1, mB1, d1[3]));
                    }
                }
            }
        }
    }
#pragma unroll
    for (int s = 0; s < T8; ++s) {
        const int c = r0 + (wn + WN * s) * 8 + 2 * t4;
        out[(long long)c * N + n0 + rA] = acc[s][0];
        out[(long long)(c + 1) * N + n0 + rA] = acc[s][1];
        out[(long long)c * N + n0 + rB] = acc[s][2];
        out[(long long)(c + 1) * N + n0 + rB] = acc[s][3];
    }
}

// v3: v1's arithmetic, each 32-value block's products on wgmma (m64n64k32 s8, asynchronous).
// The question: does taking the products off the epilogue's instruction stream pay for what
// wgmma adds (docs/performance.md, "What limits each kernel": v1's main loop waits on each
// IMMA's result and on its ldmatrix, with 40% of issue slots idle)?
//   Warpgroup wg (warps 4 wg .. 4 wg + 3) multiplies all 64 weight rows of the CTA by
//   activation rows 64 wg .. 64 wg + 63; warp wi of it holds weight rows 16 wi .. 16 wi + 15,
//   whose A fragment comes from ldmatrix (v1's) into registers. The sub-scales want each
//   16-value half's sum apart (S0, S1): two wgmma a block, one with the A fragment's second
//   half zeroed, one with its first, into two accumulator sets; sums start from zero, and one
//   integer add of MAGIC_I gives scaled_magic its bits (v1's mma adds MAGIC_I as its C).
//   DBUF (v3): block b + 1's two wgmma are issued before block b's epilogue and waited for
//   after it (two buffers of accumulators, 1 CTA an SM), so the tensor cores work under the
//   float steps. Without (v4): one buffer, each block's wgmma waited for before its epilogue,
//   2 CTAs an SM: the other warps' epilogues are what runs under a warpgroup's products, as
//   under v1's mma.
//   The activation chunk is staged in the core-matrix layout wgmma reads (cm_off: 8-row groups
//   of eight 16-byte pieces), a ring of V3_STAGES chunks, one CTA barrier a chunk.
#define V3_STAGES 3
#define V3_SBO (8 * 128)  // bytes between 8-row groups of the staged activation chunk

template <bool DBUF>
__device__ __forceinline__ void core_wgmma(const int8_t* __restrict__ w, const uint8_t* __restrict__ u,
                                           const float* __restrict__ dw, const int8_t* __restrict__ x,
                                           const float* __restrict__ da, float* __restrict__ out, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wi = warp & 3, g = lane >> 2, t4 = lane & 3;
    const int n0 = blockIdx.x * BM, r0 = blockIdx.y * BN;
    const int nch = K / KC, nb = K / 32;

    auto issue = [&](int kc) {
        if (kc < nch) {
            uint8_t* st = smem + (kc % V3_STAGES) * STAGE;
            for (int i = tid; i < BM * 8; i += NT) {
                const int row = i >> 3, p = i & 7;
                cp16(smem_u32(st + ST_W + row * STR + p * 16), w + (long long)(n0 + row) * K + kc * KC + p * 16);
            }
            for (int i = tid; i < BN * 8; i += NT) {
                const int row = i >> 3, p = i & 7;
                cp16(smem_u32(st + ST_X + cm_off<KC>(row, p)), x + (long long)(r0 + row) * K + kc * KC + p * 16);
            }
            for (int i = tid; i < BM; i += NT) {
                cp16(smem_u32(st + ST_DW + i * 16), dw + (long long)(n0 + i) * nb + kc * 4);
                cp8(smem_u32(st + ST_U + i * 8), u + (long long)(n0 + i) * (K / 16) + kc * 8);
            }
            for (int i = tid; i < BN; i += NT)
                cp16(smem_u32(st + ST_DA + i * 16), da + (long long)(r0 + i) * nb + kc * 4);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };

    float acc[8][4];
#pragma unroll
    for (int s = 0; s < 8; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.0f;
    const int rA = wi * 16 + g, rB = rA + 8;
    const uint32_t a_off = (uint32_t)((wi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * STR + (lane >> 4) * 16);
    int d[DBUF ? 2 : 1][2][8][4];  // [buffer][half][n8 tile][element]

    // block b's two wgmma (halves 0 and 1) into dd, one group
    auto products = [&](int b, int (&dd)[2][8][4]) {
        const uint8_t* st = smem + ((b >> 2) % V3_STAGES) * STAGE;
        const int j = b & 3;
        uint32_t a[4];
        ldsm_x4(a, smem_u32(st + ST_W) + a_off + j * 32);
        const int h0[4] = {(int)a[0], (int)a[1], 0, 0}, h1[4] = {0, 0, (int)a[2], (int)a[3]};
        const uint64_t bd = wg_desc(smem_u32(st + ST_X) + wg * 8 * V3_SBO + 2 * j * 128, V3_SBO);
        wgmma_fence();
        wgmma_s8_ra(dd[0], h0, bd, 0);
        wgmma_s8_ra(dd[1], h1, bd, 0);
        wgmma_commit();
    };
    auto epilogue = [&](int b, int (&dd)[2][8][4]) {
        const uint8_t* st = smem + ((b >> 2) % V3_STAGES) * STAGE;
        const int j = b & 3;
        const float* dws = reinterpret_cast<const float*>(st + ST_DW);
        const float* das = reinterpret_cast<const float*>(st + ST_DA);
        const uint8_t* us = st + ST_U;
        const float dwA = dws[rA * 4 + j], dwB = dws[rB * 4 + j];
        const float uA0 = us[rA * 8 + 2 * j], uA1 = us[rA * 8 + 2 * j + 1];
        const float uB0 = us[rB * 8 + 2 * j], uB1 = us[rB * 8 + 2 * j + 1];
        const float mA0 = uA0 * -MAGIC_F, mA1 = uA1 * -MAGIC_F, mB0 = uB0 * -MAGIC_F, mB1 = uB1 * -MAGIC_F;
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const int c = wg * 64 + s * 8 + 2 * t4;
            const float dx = das[c * 4 + j], dy = das[(c + 1) * 4 + j];
            const int* e0 = dd[0][s];
            const int* e1 = dd[1][s];
            acc[s][0] = acc[s][0] + (dwA * dx) * (scaled_magic(uA0, mA0, e0[0] + MAGIC_I) + scaled_magic(uA1, mA1, e1[0] + MAGIC_I));
            acc[s][1] = acc[s][1] + (dwA * dy) * (scaled_magic(uA0, mA0, e0[1] + MAGIC_I) + scaled_magic(uA1, mA1, e1[1] + MAGIC_I));
            acc[s][2] = acc[s][2] + (dwB * dx) * (scaled_magic(uB0, mB0, e0[2] + MAGIC_I) + scaled_magic(uB1, mB1, e1[2] + MAGIC_I));
            acc[s][3] = acc[s][3] + (dwB * dy) * (scaled_magic(uB0, mB0, e0[3] + MAGIC_I) + scaled_magic(uB1, mB1, e1[3] + MAGIC_I));
        }
    };
    // pins dd's registers after the wait that completes their wgmma (no read moves above it)
    auto pin = [&](int (&dd)[2][8][4]) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int s = 0; s < 8; ++s)
#pragma unroll
                for (int e = 0; e < 4; ++e) reg_fence(dd[h][s][e]);
    };
    // block b's step: issue block b + 1 into the other buffer (opening its chunk behind the CTA
    // barrier where it starts one), block b's epilogue while those run, then wait for them. No
    // wgmma is in flight across a step: its registers are never copied while it writes them
    // (ptxas would serialize the wgmma otherwise).
    auto step = [&](int b, int (&mine)[2][8][4], int (&other)[2][8][4]) {  // DBUF
        if (b + 1 < nb) {
            if (((b + 1) & 3) == 0) {  // chunk (b + 1) / 4 must have landed; the one after it is staged
                asm volatile("cp.async.wait_group 0;\n" ::: "memory");
                fence_proxy_async();
                __syncthreads();
                issue((b + 1) / 4 + 1);
            }
            products(b + 1, other);
        }
        epilogue(b, mine);
        wgmma_wait<0>();
        pin(other);
    };

    issue(0);
    issue(1);
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    fence_proxy_async();
    __syncthreads();
    if constexpr (DBUF) {
        products(0, d[0]);
        wgmma_wait<0>();
        pin(d[0]);
#pragma unroll 1
        for (int b = 0; b < nb; b += 2) {  // nb is even (K a multiple of 128): the buffers alternate
            step(b, d[0], d[1]);
            step(b + 1, d[1], d[0]);
        }
    } else {
#pragma unroll 1
        for (int b = 0; b < nb; ++b) {
            if (b > 0 && (b & 3) == 0) {  // chunk b / 4 must have landed; the one after it is staged
                asm volatile("cp.async.wait_group 0;\n" ::: "memory");
                fence_proxy_async();
                __syncthreads();
                issue(b / 4 + 1);
            }
            products(b, d[0]);
            wgmma_wait<0>();
            pin(d[0]);
            epilogue(b, d[0]);
        }
    }
#pragma unroll
    for (int s = 0; s < 8; ++s) {
        const int c = r0 + wg * 64 + s * 8 + 2 * t4;
        out[(long long)c * N + n0 + rA] = acc[s][0];
        out[(long long)(c + 1) * N + n0 + rA] = acc[s][1];
        out[(long long)c * N + n0 + rB] = acc[s][2];
        out[(long long)(c + 1) * N + n0 + rB] = acc[s][3];
    }
#else
    __trap();  // v3 and v4 are built for sm_90a only (dev/kernels/mmq_core.py loads this file so where it runs)
#endif
}

// w int8 [N][K], u uint8 [N][K/16], dw float [N][K/32], x int8 [R][K], da float [R][K/32],
// out float [R][N]; grid (N / 64, R / 128), 256 threads, mmq_core_smem[form] bytes of dynamic
// shared memory
extern "C" __global__ void __launch_bounds__(NT, 2)
    mmq_core_v1(const int8_t* __restrict__ w, const uint8_t* __restrict__ u, const float* __restrict__ dw,
                const int8_t* __restrict__ x, const float* __restrict__ da, float* __restrict__ out, int N, int K) {
    core<false>(w, u, dw, x, da, out, N, K);
}
extern "C" __global__ void __launch_bounds__(NT, 2)
    mmq_core_v2(const int8_t* __restrict__ w, const uint8_t* __restrict__ u, const float* __restrict__ dw,
                const int8_t* __restrict__ x, const float* __restrict__ da, float* __restrict__ out, int N, int K) {
    core<true>(w, u, dw, x, da, out, N, K);
}
extern "C" __global__ void __launch_bounds__(NT, 1)
    mmq_core_v3(const int8_t* __restrict__ w, const uint8_t* __restrict__ u, const float* __restrict__ dw,
                const int8_t* __restrict__ x, const float* __restrict__ da, float* __restrict__ out, int N, int K) {
    core_wgmma<true>(w, u, dw, x, da, out, N, K);
}
extern "C" __global__ void __launch_bounds__(NT, 2)
    mmq_core_v4(const int8_t* __restrict__ w, const uint8_t* __restrict__ u, const float* __restrict__ dw,
                const int8_t* __restrict__ x, const float* __restrict__ da, float* __restrict__ out, int N, int K) {
    core_wgmma<false>(w, u, dw, x, da, out, N, K);
}

// {BM, BN, threads, v1's dynamic shared memory, v2's, v3's, v4's}
extern "C" __device__ int mmq_core_geometry[7] = {BM, BN, NT, 2 * STAGE, 2 * STAGE + BN * HSTR, V3_STAGES * STAGE,
                                                  V3_STAGES * STAGE};
