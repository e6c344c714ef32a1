// Version 1 of the prefill attention kernel: attend_mma_hd{64,128}, causal attention over the
// int8 KV cache of one layer on tensor cores, one warp per 16-query group. Version 2 is
// production's fast/cuda/kernels/attention_pair.cu. Kept here to teach the form the pair kernel
// grew from; checked and timed against it by dev/kernels/attention.py (dev/kernels/README.md).
//
// Why version 2 replaced it: here one warp holds everything of its 16 queries, the scores of all
// 64 keys of a block and O over all HD output dims, so at head_dim 128 it needs about twice the
// registers of a pair warp and an SM runs half the warps; the float epilogue's latencies then
// show (few warps to switch to). The pair kernel splits each 16-query group between two warps
// (keys by parity for the scores, output dims by half for P.V), half the registers each, at the
// price of trading the block maxima, lsum and P codes between the two. docs/performance.md has
// the figures (its ncu table's attention rows and the paragraphs on the pair kernel).
//
// Definition: strata_prefill.contract.attention.attend (docs/numerics.md section 5), bit for bit; written out in
// attention_common.cuh. It includes production's headers from fast/cuda/kernels/
// (strata_numerics.cuh, attention_common.cuh: fast/cuda/runtime.py kernel_source inlines them),
// so it computes the same shared steps as version 2; only the work's split differs.
//
// attend_mma_hd{64,128}: one CTA per (tile of 16 * MMA_WARPS queries, head), MMA_WARPS warps of
//   16 queries. Per key block (staged in shared memory: K row-major, V transposed in a permuted
//   key order that matches the score fragment, so P goes from the score accumulators straight
//   into the A operand of P.V with no shuffles): S = Q.K^T as 4 x 8 mma per 32-value block b
//   (sumi_b of a 16 x 8 tile), the float epilogue per (query, key) in the thread owning the
//   accumulator, quad shuffles for the row max, the lsum tree (its last three levels: keys j /
//   j+4, j / j+2, j / j+1 sit in lanes xor 2, xor 1 and in-thread) and amax; then P.V as 2 x 16
//   mma. The float epilogue is the lean one version 2 shares: p from strata_exp_nonpos (p's
//   argument is never above 0), P codes as the low byte of round_nonneg_magic (w = p * dv >= 0),
//   and a warp whose 16 queries all keep their maximum (alpha == 1 exactly, O * 1.0f == O) skips
//   the rescaling products of O and L.
// Compiled with --fmad=false; float steps are written with __fmul_rn / __fadd_rn anyway.

#include <stdint.h>
#include "strata_numerics.cuh"  // strata_exp, round_nonneg_magic, q8_*, quad_max, MAGIC_I
#include "attention_common.cuh"  // the definition, KEY_BLOCK, the shared steps, ATTEND_KERNEL

#ifndef MMA_WARPS
#define MMA_WARPS 4  // warps of 16 queries per CTA (dev/kernels/attention.py builds it with 8)
#endif
#ifndef MMA_MINB
#define MMA_MINB 1   // __launch_bounds__ minimum CTAs per SM
#endif
#define MMA_TILE (16 * MMA_WARPS)

template <int HD>
__device__ __forceinline__ void attend_mma_body(
    const float* __restrict__ q, long long ldq, const int* __restrict__ positions, int T, int group,
    const int8_t* __restrict__ k_codes, const float* __restrict__ k_scale,
    const int8_t* __restrict__ v_codes, const float* __restrict__ v_scale,
    const int8_t* __restrict__ /* v_t: the pair kernel's */, int cap,
    float kq_scale, float* __restrict__ out, long long ldo)
{
    constexpr int NB = HD / 32;              // Q/K scale blocks = score k-steps
    constexpr int KW = HD / 4 + 4;           // padded K / Q row (words): conflict-free fragments
    constexpr int VW = KEY_BLOCK / 4 + 4;    // padded V^T row (words)
    constexpr int ND = HD / 8;               // P.V n-tiles
    constexpr int NT = KEY_BLOCK / 8;        // score n-tiles
    constexpr int NTH = 32 * MMA_WARPS;

    __shared__ __align__(16) int sk[KEY_BLOCK * KW];
    __shared__ float skd[NB * KEY_BLOCK];
    __shared__ int svt[HD * VW];
    __shared__ float svd[KEY_BLOCK];
    __shared__ __align__(16) int sq[MMA_TILE * KW];
    __shared__ float sqd[MMA_TILE * NB];
    __shared__ int spos[MMA_TILE];

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;   // fragment row / column group
    const int tq = lane & 3;   // thread in group
    const int h = blockIdx.y;
    const int kvh = h / group;
    // heaviest tiles (latest positions, most key blocks) first
    const long long t0 = (long long)(gridDim.x - 1 - blockIdx.x) * MMA_TILE;

    if (tid < MMA_TILE) spos[tid] = (t0 + tid < T) ? positions[t0 + tid] : -1;
    for (int i = 0; i < 16; ++i) {
        const int qi = warp * 16 + i;
        const long long t = t0 + qi;
        int8_t* qc = reinterpret_cast<int8_t*>(sq + qi * KW);
        if (t < T) {
            quantize_row_warp<HD>(q + t * ldq + (long long)h * HD, qc, sqd + qi * NB, lane);
        } else {
#pragma unroll
            for (int b = 0; b < NB; ++b) qc[32 * b + lane] = 0;
            if (lane < NB) sqd[qi * NB + lane] = 0.0f;
        }
    }
    __syncthreads();

    int maxpos = -1;
    for (int i = 0; i < MMA_TILE; ++i) maxpos = max(maxpos, spos[i]);
    const int n_blk = maxpos < 0 ? 0 : maxpos / KEY_BLOCK + 1;

    const int r0 = warp * 16 + g, r1 = r0 + 8;
    const int pos0 = spos[r0], pos1 = spos[r1];
    const int last0 = pos0 < 0 ? -1 : pos0 / KEY_BLOCK;
    const int last1 = pos1 < 0 ? -1 : pos1 / KEY_BLOCK;
    const int wlast = __reduce_max_sync(0xffffffffu, max(last0, last1));
    const int wminpos = __reduce_min_sync(0xffffffffu, min(pos0, pos1));  // -1 with padding rows

    int qa[NB][4];
    float dq0[NB], dq1[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        qa[b][0] = sq[r0 * KW + 8 * b + tq];
        qa[b][1] = sq[r1 * KW + 8 * b + tq];
        qa[b][2] = sq[r0 * KW + 8 * b + 4 + tq];
        qa[b][3] = sq[r1 * KW + 8 * b + 4 + tq];
        dq0[b] = sqd[r0 * NB + b];
        dq1[b] = sqd[r1 * NB + b];
    }

    const float NEG_INF = __int_as_float(0xff800000);
    float M0 = NEG_INF, M1 = NEG_INF, L0 = 0.0f, L1 = 0.0f;
    float O[ND][4];
#pragma unroll
    for (int nd = 0; nd < ND; ++nd)
#pragma unroll
        for (int e = 0; e < 4; ++e) O[nd][e] = 0.0f;

    const long long head_row0 = (long long)kvh * cap;
    const int8_t* kbase = k_codes + head_row0 * HD;
    const int8_t* vbase = v_codes + head_row0 * HD;

    // The next key block is fetched from global memory into registers while this one is computed
    // (loads in flight across the compute), then stored to shared memory (V transposed).
    constexpr int KITER = (KEY_BLOCK * (HD / 16) + NTH - 1) / NTH;
    constexpr int VITER = ((KEY_BLOCK / 4) * (HD / 4) + NTH - 1) / NTH;
    constexpr int SITER = (KEY_BLOCK * NB + NTH - 1) / NTH;
    int4 pk[KITER];
    unsigned pv[VITER][4];
    float pks[SITER];
    float pvs = 0.0f;
    auto fetch = [&](int j0) {
#pragma unroll
        for (int i = 0; i < KITER; ++i) {
            const int idx = tid + i * NTH;
            const int key = idx / (HD / 16);
            const int part = idx - key * (HD / 16);
            pk[i] = make_int4(0, 0, 0, 0);
            if (idx < KEY_BLOCK * (HD / 16) && j0 + key < cap)
                pk[i] = reinterpret_cast<const int4*>(kbase + (long long)(j0 + key) * HD)[part];
        }
#pragma unroll
        for (int i = 0; i < VITER; ++i) {
            const int idx = tid + i * NTH;
            const int slot = idx % (KEY_BLOCK / 4);  // slot = 8 ks + 4 half + qq
            const int m = idx / (KEY_BLOCK / 4);     // dims 4m .. 4m+3
            const int k0 = j0 + 32 * (slot >> 3) + 16 * ((slot >> 2) & 1) + 2 * (slot & 3);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int j = k0 + (u & 1) + 8 * (u >> 1);  // keys k0, k0+1, k0+8, k0+9
                pv[i][u] = (idx < (KEY_BLOCK / 4) * (HD / 4) && j < cap)
                               ? reinterpret_cast<const unsigned*>(vbase + (long long)j * HD)[m] : 0u;
            }
        }
#pragma unroll
        for (int i = 0; i < SITER; ++i) {
            const int idx = tid + i * NTH;
            const int key = idx / NB;
            const int b = idx - key * NB;
            pks[i] = (idx < KEY_BLOCK * NB && j0 + key < cap) ? k_scale[(head_row0 + j0 + key) * NB + b] : 0.0f;
        }
        if (tid < KEY_BLOCK) pvs = (j0 + tid < cap) ? v_scale[head_row0 + j0 + tid] : 0.0f;
    };
    auto put = [&]() {
#pragma unroll
        for (int i = 0; i < KITER; ++i) {
            const int idx = tid + i * NTH;
            const int key = idx / (HD / 16);
            const int part = idx - key * (HD / 16);
            if (idx < KEY_BLOCK * (HD / 16)) *reinterpret_cast<int4*>(sk + key * KW + part * 4) = pk[i];
        }
#pragma unroll
        for (int i = 0; i < VITER; ++i) {
            const int idx = tid + i * NTH;
            if (idx < (KEY_BLOCK / 4) * (HD / 4)) put_v_transposed<VW>(svt, idx, pv[i]);
        }
#pragma unroll
        for (int i = 0; i < SITER; ++i) {
            const int idx = tid + i * NTH;
            const int key = idx / NB;
            const int b = idx - key * NB;
            if (idx < KEY_BLOCK * NB) skd[b * KEY_BLOCK + key] = pks[i];
        }
        if (tid < KEY_BLOCK) svd[tid] = pvs;
    };

    if (n_blk > 0) fetch(0);
    for (int c = 0; c < n_blk; ++c) {
        const int j0 = c * KEY_BLOCK;
        __syncthreads();  // the previous block's shared data is no longer read
        put();
        __syncthreads();
        if (c + 1 < n_blk) fetch(j0 + KEY_BLOCK);
        if (c > wlast) continue;  // warp-uniform: none of this warp's queries reaches block c

        // A block below every query of the warp (all but the diagonal ones) needs no masking:
        // the body is instantiated twice, FULL = true without the key <= position tests.
        auto block = [&](auto full_tag) {
            constexpr bool FULL = decltype(full_tag)::value;
            // scores: accumulator (nt, e) is query row r0 (e < 2) or r1, key 8 nt + 2 tq + (e & 1)
            float s[NT][4];
    #pragma unroll
            for (int nt = 0; nt < NT; ++nt)
    #pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    #pragma unroll
            for (int b = 0; b < NB; ++b) {
    #pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int* kr = sk + (8 * nt + g) * KW + 8 * b;
                    score_step(s[nt], qa[b], kr[tq], kr[4 + tq], [&](int r) { return r ? dq1[b] : dq0[b]; },
                               [&](int k) { return skd[b * KEY_BLOCK + 8 * nt + 2 * tq + k]; });
                }
            }
            auto key = [&](int nt, int e) { return j0 + 8 * nt + 2 * tq + (e & 1); };
            float mc0, mc1;
            scale_mask_max<FULL>(s, kq_scale, pos0, pos1, key, mc0, mc1);
            const float mn0 = fmaxf(M0, mc0), mn1 = fmaxf(M1, mc1);
            const float al0 = strata_exp(__fsub_rn(M0, mn0));
            const float al1 = strata_exp(__fsub_rn(M1, mn1));

            // p (into s), the lsum tree, then w = p * dv (into s)
            exp_masked<FULL>(s, mn0, mn1, pos0, pos1, key);
            float u[4];
    #pragma unroll
            for (int e = 0; e < 4; ++e) {
                float t4[4];
    #pragma unroll
                for (int nt = 0; nt < 4; ++nt) t4[nt] = __fadd_rn(s[nt][e], s[nt + 4][e]);  // j, j + 32
                const float t2a = __fadd_rn(t4[0], t4[2]);                                   // j, j + 16
                const float t2b = __fadd_rn(t4[1], t4[3]);
                u[e] = __fadd_rn(t2a, t2b);                                                  // j, j + 8
                u[e] = __fadd_rn(u[e], __shfl_xor_sync(0xffffffffu, u[e], 2));               // j, j + 4
                u[e] = __fadd_rn(u[e], __shfl_xor_sync(0xffffffffu, u[e], 1));               // j, j + 2
            }
            const float ls0 = __fadd_rn(u[0], u[1]);                                         // j, j + 1
            const float ls1 = __fadd_rn(u[2], u[3]);
            float amax0, amax1;
            fold_v_scale<FULL>(s, pos0, pos1, key,
                               [&](int nt) { return make_float2(svd[8 * nt + 2 * tq], svd[8 * nt + 2 * tq + 1]); },
                               amax0, amax1);
            float (&w)[NT][4] = s;

            // int8 P per (query, block), straight into the A fragments of P.V (k-slot order matches
            // the permuted V^T staging: slots 4tq+i <- keys 32ks + 8(i/2) + 2tq + (i%2), +16 for a2/a3)
            // a block whose 127/amax is not finite (amax 0 or tiny): scale 0, codes 0 (the bytes
            // q8_code and q8_scale give such a block in the split kernel)
            const float d_inv0 = q8_inv_scale(amax0), d_inv1 = q8_inv_scale(amax1);
            const bool ok0 = d_inv0 < __int_as_float(0x7f800000), ok1 = d_inv1 < __int_as_float(0x7f800000);
            const float wd0 = ok0 ? q8_scale(d_inv0) : 0.0f, wd1 = ok1 ? q8_scale(d_inv1) : 0.0f;
            // w >= 0, so roundf_away(w * d_inv) is round_nonneg_magic; a block that is not ok
            // multiplies by 0 (codes 0). Byte 0 of each float's bits is its code.
            const float di0 = ok0 ? d_inv0 : 0.0f, di1 = ok1 ? d_inv1 : 0.0f;
            unsigned cb[NT][4];
            p_code_bits(w, di0, di1, cb);
            int pa[2][4];
    #pragma unroll
            for (int ks = 0; ks < 2; ++ks) p_fragment(cb, 4 * ks, pa[ks]);

            const bool live0 = FULL || c <= last0, live1 = FULL || c <= last1;
            // O = O * alpha + ob; KEEP (alpha == 1 in every row of the warp): O + ob, the same bits
            auto pv = [&](auto keep_tag) {
                constexpr bool KEEP = decltype(keep_tag)::value;
    #pragma unroll
                for (int nd = 0; nd < ND; ++nd) {
                    int acc[4] = {MAGIC_I, MAGIC_I, MAGIC_I, MAGIC_I};  // |P.V| < 2^21
                    const int* vr = svt + (8 * nd + g) * VW;
    #pragma unroll
                    for (int ks = 0; ks < 2; ++ks) mma_s8(acc, pa[ks], vr[8 * ks + tq], vr[8 * ks + 4 + tq]);
                    o_step<KEEP>(O[nd], acc, al0, al1, wd0, wd1, live0, live1);
                }
                l_step<KEEP>(L0, L1, al0, al1, ls0, ls1, live0, live1);
            };
            pv_keep_or_rescale(pv, al0, al1);  // skip the rescaling where alpha is 1 in every row
            M0 = live0 ? mn0 : M0;
            M1 = live1 ? mn1 : M1;
        };
        if (j0 + KEY_BLOCK - 1 <= wminpos) block(BoolTag<true>{});
        else block(BoolTag<false>{});
    }

    store_out<HD, ND, 2>(out, ldo, T, h, t0 + r0, t0 + r1, L0, L1, [&](int nd) { return 8 * nd + 2 * tq; },
                         [&](int nd, int k) { return O[nd][k]; });
}

ATTEND_KERNEL(mma, 64, 32 * MMA_WARPS, MMA_MINB)
ATTEND_KERNEL(mma, 128, 32 * MMA_WARPS, MMA_MINB)

// the CTA's warps and queries, read by the host (dev/kernels/attention.py)
extern "C" __device__ int attend_mma_geometry[2] = {MMA_WARPS, MMA_TILE};
