// Causal attention over the KV cache of one layer for few queries (decode): split-K over
// key blocks in three launches, attend_split_{scores,pv,merge}_hd{64,128}.
//
// Definition: strata_prefill.contract.attention.attend (docs/numerics.md section 5), bit for bit; written out in
// attention_common.cuh.
//
// attend_split_{scores,pv,merge}_hd{64,128}: split-K for few queries (decode). Pass 1, one
//   CTA per (key block, KV head): scores and block maxima m_c of every (query, head of the
//   group) into scratch. Pass 2, same grid: the running max after block c is the prefix max of
//   m_0..m_c (max is exact in any order), before it the prefix max of m_0..m_{c-1}; hence
//   alpha, p, lsum, the P quantization, dw and the P.V sum pvf of each block independently.
//   Pass 3, one CTA per (query, head), one thread per output dim: the merge L = L*alpha + lsum,
//   O = fma(dw, pvf, O*alpha) in ascending block order, out = O / L. The scores' sumf: float32
//   fused multiply-adds of the integer codes (every partial sum an integer below 2^24: exact).
// attend_split_{scores,pv,merge}_sinks_window_hd{64,128}: the same bodies with OPT true, and
//   the options' parameters: window (> 0: a unit sees keys lo .. pos, lo = max(pos - window + 1,
//   0); its units skip the blocks before lo/64 as they skip those after pos/64, and the grid of
//   passes 1 and 2 starts at block c_base, the smallest lo/64 of the chunk, its blocks before it
//   never launched), sinks (not null: the running maximum of pass 2 starts at the head's sink,
//   and the merge at L = 1.0f). OPT false compiles to the plain kernels' code.
// Compiled with --fmad=false; float steps are written with __fmul_rn / __fadd_rn / __fmaf_rn.

#include <stdint.h>
#include <cuda_fp16.h>
#include "strata_numerics.cuh"  // strata_exp2c, rint_nonneg_magic, row_quantize_warp, q8_*, warp reductions
#include "attention_common.cuh"  // the definition, KEY_BLOCK, quantize_row_warp, put_v_transposed

#define SPL_WARPS 8

// V codes of keys j0 .. j0+63 transposed, 4 keys x 4 dims per step: word `slot` of dim row d
// holds (byte u) key 4 slot + u at dim d; VW words per dim row.
template <int HD, int VW>
__device__ __forceinline__ void stage_v(int* svt, const int8_t* __restrict__ vbase, int j0, int cap,
                                        int tid, int nthreads)
{
    constexpr int QW = HD / 4;
    for (int idx = tid; idx < (KEY_BLOCK / 4) * QW; idx += nthreads) {
        const int slot = idx % (KEY_BLOCK / 4);  // word within the dim row (fastest: store banks)
        const int m = idx / (KEY_BLOCK / 4);     // dims 4m .. 4m+3
        unsigned r4[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int j = j0 + 4 * slot + u;
            r4[u] = (j < cap) ? reinterpret_cast<const unsigned*>(vbase + (long long)j * HD)[m] : 0u;
        }
        put_v_transposed<VW>(svt, idx, r4);
    }
}

// ============================================================================ split-K
// Scratch (float32), for U = T * n_head units (query t, head h: unit t * n_head + h) and nblk
// blocks: S [U, nblk * 64] scores, MC [U, nblk] block maxima, OB [U, nblk, HD] the P.V sums pvf
// (exact integers as floats), LS, AL and DW [U, nblk] (lsum, alpha and the P scale dw).

// The first key a query at pos sees through a window of `window` keys (window > 0).
__device__ __forceinline__ int first_key(int pos, int window) { return max(pos - window + 1, 0); }

// Pass 1: grid (nblk, n_kv), SPL_WARPS warps; a warp per (query, head of the group).
// Passes 1 and 2 walk the (query, head) units of KV head kvh a warp a unit: body(t, h, pos) for
// each unit's token t, query head h and position, except where key block c lies wholly after
// the position (causal: the unit reads nothing of it; warp-uniform).
// With a window (window > 0), also except where block c lies wholly before the unit's first key.
template <typename Body>
__device__ __forceinline__ void for_each_unit(int T, int group, int kvh, int c, const int* __restrict__ positions,
                                              int warp, Body body, int window = 0)
{
    const int units = T * group;
    for (int un = warp; un < units; un += SPL_WARPS) {
        const int t = un / group;
        const int h = kvh * group + (un - t * group);
        const int pos = positions[t];
        if (c > pos / KEY_BLOCK) continue;  // warp-uniform
        if (window > 0 && c < first_key(pos, window) / KEY_BLOCK) continue;
        body(t, h, pos);
    }
}

template <int HD, bool OPT = false>
__device__ __forceinline__ void split_scores_body(
    const float* __restrict__ q, long long ldq, const int* __restrict__ positions, int T, int n_head,
    int group, const uint16_t* __restrict__ k_codes, const float* __restrict__ k_scale, int cap,
    float kq2, int nblk, float* __restrict__ S, float* __restrict__ MC, int window = 0, int c_base = 0)
{
    constexpr int NB = HD / 32;
    constexpr int KW = HD / 2 + 1;  // words of a key row (half2 pairs) + 1: conflict-free by key
    __shared__ __half2 sk[KEY_BLOCK * KW];
    __shared__ float skd[KEY_BLOCK];
    __shared__ float sq[SPL_WARPS * HD];
    __shared__ float sqd[SPL_WARPS];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int c = OPT ? c_base + (int)blockIdx.x : (int)blockIdx.x, kvh = blockIdx.y;
    const int j0 = c * KEY_BLOCK;
    const long long head_row0 = (long long)kvh * cap;
    const uint16_t* kbase = k_codes + head_row0 * HD;
    for (int idx = tid; idx < KEY_BLOCK * (HD / 2); idx += blockDim.x) {
        const int key = idx / (HD / 2);
        const int w = idx - key * (HD / 2);
        __half2 val = __floats2half2_rn(0.0f, 0.0f);
        if (j0 + key < cap) val = reinterpret_cast<const __half2*>(kbase + (long long)(j0 + key) * HD)[w];
        sk[key * KW + w] = val;
    }
    for (int idx = tid; idx < KEY_BLOCK; idx += blockDim.x)
        skd[idx] = (j0 + idx < cap) ? k_scale[head_row0 + j0 + idx] : 0.0f;
    __syncthreads();

    for_each_unit(T, group, kvh, c, positions, warp, [&](int t, int h, int pos) {
        float* qf = sq + warp * HD;
        {  // the unit's Q row, quantized per row (qmax 255): codes as floats, dqs = dq * kq2
            const float* qr = q + (long long)t * ldq + (long long)h * HD;
            float x[NB], code[NB];
#pragma unroll
            for (int b = 0; b < NB; ++b) x[b] = qr[32 * b + lane];
            const float d = row_quantize_warp<NB>(x, 255.0f, code);
#pragma unroll
            for (int b = 0; b < NB; ++b) qf[32 * b + lane] = code[b];
            if (lane == 0) sqd[warp] = __fmul_rn(d, kq2);
        }
        __syncwarp();
        const float dqs = sqd[warp];
        const long long unit = (long long)t * n_head + h;
        float m = __int_as_float(0xff800000);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int key = lane + 32 * u;
            const __half2* kr = sk + key * KW;
            // sumf: integer products (|q k| <= 255 * 511) summed in float32, every partial sum an
            // integer below 2^24, so exact in any order
            float acc = 0.0f;
#pragma unroll 16
            for (int w = 0; w < HD / 2; ++w) {
                const float2 kk = __half22float2(kr[w]);
                acc = __fmaf_rn(qf[2 * w], kk.x, acc);
                acc = __fmaf_rn(qf[2 * w + 1], kk.y, acc);
            }
            acc = __fmul_rn(__fmul_rn(acc, skd[key]), dqs);
            const bool valid = (j0 + key <= pos) && (!OPT || window <= 0 || j0 + key >= first_key(pos, window));
            const float s = valid ? acc : __int_as_float(0xff800000);
            S[unit * nblk * KEY_BLOCK + j0 + key] = s;
            m = fmaxf(m, s);
        }
        m = warp_max(m);
        if (lane == 0) MC[unit * nblk + c] = m;
        __syncwarp();  // this warp's Q codes are read before the next unit overwrites them
    }, OPT ? window : 0);
}

// Pass 2: grid (nblk, n_kv), SPL_WARPS warps.
template <int HD, bool OPT = false>
__device__ __forceinline__ void split_pv_body(
    const int* __restrict__ positions, int T, int n_head, int group,
    const int8_t* __restrict__ v_codes, const float* __restrict__ v_scale, int cap, int nblk,
    const float* __restrict__ S, const float* __restrict__ MC, float* __restrict__ OB,
    float* __restrict__ LS, float* __restrict__ AL, float* __restrict__ DW, const float* __restrict__ sinks = nullptr,
    int window = 0, int c_base = 0)
{
    constexpr int VW = KEY_BLOCK / 4 + 1;
    constexpr int R = HD / 32;
    __shared__ int svt[HD * VW];
    __shared__ float svd[KEY_BLOCK];
    __shared__ int swq[SPL_WARPS * (KEY_BLOCK / 4)];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int c = OPT ? c_base + (int)blockIdx.x : (int)blockIdx.x, kvh = blockIdx.y;
    const int j0 = c * KEY_BLOCK;
    const long long head_row0 = (long long)kvh * cap;
    stage_v<HD, VW>(svt, v_codes + head_row0 * HD, j0, cap, tid, blockDim.x);
    if (tid < KEY_BLOCK) svd[tid] = (j0 + tid < cap) ? v_scale[head_row0 + j0 + tid] : 0.0f;
    __syncthreads();

    for_each_unit(T, group, kvh, c, positions, warp, [&](int t, int h, int pos) {
        const long long unit = (long long)t * n_head + h;
        // running max after block c (prefix max of m_0..m_c) and before it (m_0..m_{c-1}); with
        // a window from the unit's first block (the blocks before it were not scored), with a
        // sink from the sink
        const float* mrow = MC + unit * nblk;
        float m_new = __int_as_float(0xff800000), m_old = __int_as_float(0xff800000);
        const int i0 = (OPT && window > 0) ? first_key(pos, window) / KEY_BLOCK : 0;
#pragma unroll 8
        for (int i = i0 + lane; i <= c; i += 32) {
            const float v = mrow[i];
            m_new = fmaxf(m_new, v);
            if (i < c) m_old = fmaxf(m_old, v);
        }
        m_new = warp_max(m_new);
        m_old = warp_max(m_old);
        if (OPT && sinks != nullptr) {
            const float sink2 = __fmul_rn(sinks[h], LOG2E_F);  // the sink's score in base 2
            m_new = fmaxf(m_new, sink2);
            m_old = fmaxf(m_old, sink2);
        }
        const float alpha = strata_exp2c(__fsub_rn(m_old, m_new));
        const float* srow = S + unit * nblk * KEY_BLOCK + j0;
        float p[2], w[2];
        bool valid[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            valid[u] = (j0 + lane + 32 * u) <= pos &&
                       (!OPT || window <= 0 || j0 + lane + 32 * u >= first_key(pos, window));
            p[u] = valid[u] ? strata_exp2c(__fsub_rn(srow[lane + 32 * u], m_new)) : 0.0f;
        }
        float lsum = __fadd_rn(p[0], p[1]);
        lsum = warp_sum(lsum);
#pragma unroll
        for (int u = 0; u < 2; ++u) w[u] = valid[u] ? __fmul_rn(p[u], svd[lane + 32 * u]) : 0.0f;
        const float amax = warp_max(fmaxf(fabsf(w[0]), fabsf(w[1])));
        // the P codes: rint(w * d_inv), w >= 0; a block whose 127/amax is not finite: scale 0, codes 0
        int8_t wq0 = 0, wq1 = 0;
        float wd = 0.0f;
        const float d_inv = q8_inv_scale(amax);
        if (d_inv < __int_as_float(0x7f800000)) {
            wq0 = (int8_t)(__float_as_int(rint_nonneg_magic(__fmul_rn(w[0], d_inv))) - MAGIC_I);
            wq1 = (int8_t)(__float_as_int(rint_nonneg_magic(__fmul_rn(w[1], d_inv))) - MAGIC_I);
            wd = q8_scale(d_inv);
        }
        int8_t* wqb = reinterpret_cast<int8_t*>(swq + warp * (KEY_BLOCK / 4));
        wqb[lane] = wq0;
        wqb[lane + 32] = wq1;
        __syncwarp();
        const int* wqw = swq + warp * (KEY_BLOCK / 4);
        float* obrow = OB + (unit * nblk + c) * HD;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int* vr = svt + (lane + 32 * r) * VW;
            int acc = 0;
#pragma unroll
            for (int k4 = 0; k4 < KEY_BLOCK / 4; ++k4) acc = __dp4a(wqw[k4], vr[k4], acc);
            obrow[lane + 32 * r] = (float)acc;  // pvf, exact (|acc| < 2^24)
        }
        if (lane == 0) {
            LS[unit * nblk + c] = lsum;
            AL[unit * nblk + c] = alpha;
            DW[unit * nblk + c] = wd;
        }
        __syncwarp();
    }, OPT ? window : 0);
}

// Pass 3: grid (T, n_head), MERGE_G * HD threads: per chunk of CH blocks all of them load the
// block values into shared memory (many loads in flight), then the first HD threads (one per
// output dim) run the ordered chain L = L*alpha + lsum, O = O*alpha + ob.
#define MERGE_G 4
template <int HD, bool OPT = false>
__device__ __forceinline__ void split_merge_body(
    const int* __restrict__ positions, int n_head, int nblk, const float* __restrict__ OB,
    const float* __restrict__ LS, const float* __restrict__ AL, const float* __restrict__ DW, float* __restrict__ out,
    long long ldo, const float* __restrict__ sinks = nullptr, int window = 0)
{
    constexpr int CH = 8192 / HD;  // 32 KB of ob per chunk
    __shared__ float sob[CH * HD];
    __shared__ float sa[CH], sl[CH], sw[CH];
    const int t = blockIdx.x, h = blockIdx.y;
    const int tid = threadIdx.x, d = tid % HD, g = tid / HD;
    const int last = positions[t] / KEY_BLOCK;
    const long long unit = (long long)t * n_head + h;
    const float* al = AL + unit * nblk;
    const float* ls = LS + unit * nblk;
    const float* dw = DW + unit * nblk;
    const float* ob = OB + unit * nblk * HD + d;
    float O = 0.0f, L = 0.0f;
    int first = 0;  // the unit's first block: 0, or its window's
    if constexpr (OPT) {
        if (sinks != nullptr) L = 1.0f;  // the sink merged first: L = exp2c(sink2 - sink2)
        if (window > 0) first = first_key(positions[t], window) / KEY_BLOCK;
    }
    for (int c0 = first; c0 <= last; c0 += CH) {
        __syncthreads();  // the previous chunk is no longer read
#pragma unroll
        for (int k = 0; k < CH / MERGE_G; ++k) {
            const int i = g + MERGE_G * k;
            sob[i * HD + d] = ob[(long long)min(c0 + i, last) * HD];
        }
        for (int i = tid; i < CH; i += MERGE_G * HD) {
            const int c = min(c0 + i, last);
            sa[i] = al[c];
            sl[i] = ls[c];
            sw[i] = dw[c];
        }
        __syncthreads();
        if (g == 0) {
            const int n = min(CH, last + 1 - c0);
            for (int i = 0; i < n; ++i) {
                const float a = sa[i];
                L = __fadd_rn(__fmul_rn(L, a), sl[i]);
                O = __fmaf_rn(sw[i], sob[i * HD + d], __fmul_rn(O, a));
            }
        }
    }
    if (g == 0) out[(long long)t * ldo + (long long)h * HD + d] = O / L;
}

#define ATTEND_SPLIT_KERNELS(HD)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * SPL_WARPS)                                   \
    attend_split_scores_hd##HD(const float* __restrict__ q, long long ldq,                         \
                               const int* __restrict__ positions, int T, int n_head, int group,    \
                               const uint16_t* __restrict__ k_codes, const float* __restrict__ k_scale,\
                               int cap, float kq2, int nblk, float* __restrict__ S,                \
                               float* __restrict__ MC)                                             \
    {                                                                                              \
        split_scores_body<HD>(q, ldq, positions, T, n_head, group, k_codes, k_scale, cap, kq2,     \
                              nblk, S, MC);                                                        \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * SPL_WARPS)                                   \
    attend_split_pv_hd##HD(const int* __restrict__ positions, int T, int n_head, int group,        \
                           const int8_t* __restrict__ v_codes, const float* __restrict__ v_scale,  \
                           int cap, int nblk, const float* __restrict__ S,                         \
                           const float* __restrict__ MC, float* __restrict__ OB,                   \
                           float* __restrict__ LS, float* __restrict__ AL, float* __restrict__ DW) \
    {                                                                                              \
        split_pv_body<HD>(positions, T, n_head, group, v_codes, v_scale, cap, nblk, S, MC, OB, LS, AL, DW);\
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MERGE_G * HD)                                     \
    attend_split_merge_hd##HD(const int* __restrict__ positions, int n_head, int nblk,             \
                              const float* __restrict__ OB, const float* __restrict__ LS,          \
                              const float* __restrict__ AL, const float* __restrict__ DW,          \
                              float* __restrict__ out, long long ldo)                              \
    {                                                                                              \
        split_merge_body<HD>(positions, n_head, nblk, OB, LS, AL, DW, out, ldo);                   \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * SPL_WARPS)                                   \
    attend_split_scores_sinks_window_hd##HD(const float* __restrict__ q, long long ldq,            \
                               const int* __restrict__ positions, int T, int n_head, int group,    \
                               const uint16_t* __restrict__ k_codes, const float* __restrict__ k_scale,\
                               int cap, float kq2, int nblk, float* __restrict__ S,                \
                               float* __restrict__ MC, int window, int c_base)                     \
    {                                                                                              \
        split_scores_body<HD, true>(q, ldq, positions, T, n_head, group, k_codes, k_scale, cap,    \
                                    kq2, nblk, S, MC, window, c_base);                             \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * SPL_WARPS)                                   \
    attend_split_pv_sinks_window_hd##HD(const int* __restrict__ positions, int T, int n_head,      \
                           int group, const int8_t* __restrict__ v_codes,                          \
                           const float* __restrict__ v_scale, int cap, int nblk,                   \
                           const float* __restrict__ S, const float* __restrict__ MC,              \
                           float* __restrict__ OB, float* __restrict__ LS, float* __restrict__ AL, \
                           float* __restrict__ DW, const float* __restrict__ sinks, int window,    \
                           int c_base)                                                             \
    {                                                                                              \
        split_pv_body<HD, true>(positions, T, n_head, group, v_codes, v_scale, cap, nblk, S, MC,   \
                                OB, LS, AL, DW, sinks, window, c_base);                            \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MERGE_G * HD)                                     \
    attend_split_merge_sinks_window_hd##HD(const int* __restrict__ positions, int n_head,          \
                              int nblk, const float* __restrict__ OB,                              \
                              const float* __restrict__ LS, const float* __restrict__ AL,          \
                              const float* __restrict__ DW, float* __restrict__ out, long long ldo,\
                              const float* __restrict__ sinks, int window)                         \
    {                                                                                              \
        split_merge_body<HD, true>(positions, n_head, nblk, OB, LS, AL, DW, out, ldo, sinks, window);\
    }

ATTEND_SPLIT_KERNELS(64)
ATTEND_SPLIT_KERNELS(128)

// the warps of a scores or P.V CTA and the merge's threads per output dim, read by the host
// (fast/cuda/attention.py)
extern "C" __device__ int attend_split_geometry[2] = {SPL_WARPS, MERGE_G};
