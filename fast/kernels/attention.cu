// Causal attention over the int8 KV cache of one layer.
//
// Definition: strata.attention.attend (docs/numerics.md section 5), bit for bit:
//   Q quantized like K: int8 codes, one float32 scale per 32 values
//     (amax, d_inv = 127.0f / amax, roundf, d = 1.0f / d_inv; an all-zero block: d = 0, codes 0).
//   score of key j: s = 0.0f; for b ascending: s = s + (dq_b * dk_jb) * (float)sumi_b  (sumi exact
//     int32, dp4a); s = s * kq_scale.
//   keys in blocks of 64 at absolute positions, c = 0 .. pos/64 ascending; key j valid iff j <= pos.
//   m_c = max valid s_j; m_new = max(M, m_c); alpha = exp(M - m_new) (exp(-inf) = 0);
//   p_j = valid ? exp(s_j - m_new) : 0; lsum = tree_sum(p[0..63]) (p_l + p_{l+32}, then the xor
//   butterfly 16..1); w_j = p_j * dv_j; (wq, dw) = int8 quantization of w[0..63] as one block;
//   ob_i = dw * (float)(sum_j wq_j * vq_ji) (exact int32, dp4a);
//   L = L * alpha + lsum; O_i = O_i * alpha + ob_i; M = m_new; finally out_i = O_i / L.
//   exp is the shared polynomial of strata.numerics.exp (never expf/__expf).
// GQA: query head h reads KV head h / group (group = n_head / n_head_kv).
//
// Layout: q and out are T tokens of n_head head vectors of HD floats (token t at + t * ldq /
// + t * ldo, head h at + h * HD). Cache of one layer as strata.attention.KVCache:
//   k_codes [n_kv, cap, HD] int8, k_scale [n_kv, cap, HD/32] f32,
//   v_codes [n_kv, cap, HD] int8, v_scale [n_kv, cap] f32.
// Keys at or past `cap` are never read (treated as zeros; they are invalid for every query whose
// position is < cap, which the caller guarantees). Keys past a query's position may hold anything:
// they are masked before any arithmetic reaches the output.
//
// One CTA per (tile of ATT_TILE queries, head): the 64-key block is staged in shared memory once
// per tile (K row-major with padded rows, V transposed so that P.V is dp4a over keys); each warp
// owns ATT_QPW queries and runs their online softmax: lane l handles keys l and l + 32 for the
// scores and output dims l + 32 r for P.V. Compiled with --fmad=false; the float steps below are
// written with __fmul_rn / __fadd_rn where the order matters, so no contraction can happen anyway.

#include <stdint.h>
#include "strata_numerics.cuh"  // strata_exp, roundf_away, to_i8, warp_max

#define ATT_WARPS 8
#define ATT_QPW 4
#define ATT_TILE (ATT_WARPS * ATT_QPW)
#define KEY_BLOCK 64


// float -> int8 as NumPy's astype(np.int8) does on x86-64 (the reference's platform): a finite
// value through int32 (codes are within [-127, 127] anyway); +-inf and NaN give 0. They occur
// when a block's amax is below 127 / FLT_MAX: d_inv = 127 / amax overflows to inf, x * d_inv is
// +-inf (or NaN for x == 0), and d = 1 / d_inv = 0, so such a block contributes nothing.

// strata.numerics.exp


template <int HD>
__device__ __forceinline__ void attend_body(
    const float* __restrict__ q, long long ldq, const int* __restrict__ positions, int T, int group,
    const int8_t* __restrict__ k_codes, const float* __restrict__ k_scale,
    const int8_t* __restrict__ v_codes, const float* __restrict__ v_scale, int cap,
    float kq_scale, float* __restrict__ out, long long ldo)
{
    constexpr int NB = HD / 32;        // Q/K scale blocks per head vector
    constexpr int QW = HD / 4;         // 32-bit words per head vector of codes
    constexpr int KW = QW + 1;         // padded K row (words): lanes hit distinct banks
    constexpr int KDS = NB + 1;        // padded K-scale row
    constexpr int VW = KEY_BLOCK / 4 + 1;  // padded row of V transposed (words)
    constexpr int R = HD / 32;         // output dims per lane

    __shared__ int sq[ATT_TILE * QW];
    __shared__ float sqd[ATT_TILE * NB];
    __shared__ int sk[KEY_BLOCK * KW];
    __shared__ float skd[KEY_BLOCK * KDS];
    __shared__ int svt[HD * VW];
    __shared__ float svd[KEY_BLOCK];
    __shared__ int swq[ATT_WARPS * (KEY_BLOCK / 4)];
    __shared__ int spos[ATT_TILE];

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int h = blockIdx.y;
    const int kvh = h / group;
    const long long t0 = (long long)blockIdx.x * ATT_TILE;

    if (tid < ATT_TILE) spos[tid] = (t0 + tid < T) ? positions[t0 + tid] : -1;

    // Q: int8 per 32 values (strata.attention.quantize_int8), one warp per query
#pragma unroll
    for (int jq = 0; jq < ATT_QPW; ++jq) {
        const int qi = warp * ATT_QPW + jq;
        const long long t = t0 + qi;
        if (t >= T) break;
        const float* qr = q + t * ldq + (long long)h * HD;
        int8_t* qc = reinterpret_cast<int8_t*>(sq + qi * QW);
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const float x = qr[32 * b + lane];
            const float amax = warp_max(fabsf(x));
            int8_t c = 0;
            float d = 0.0f;
            if (amax > 0.0f) {
                const float d_inv = 127.0f / amax;
                c = to_i8(roundf_away(x * d_inv));
                d = 1.0f / d_inv;
            }
            qc[32 * b + lane] = c;
            if (lane == 0) sqd[qi * NB + b] = d;
        }
    }
    __syncthreads();

    int maxpos = -1;
    for (int i = 0; i < ATT_TILE; ++i) maxpos = max(maxpos, spos[i]);
    const int n_blk = maxpos < 0 ? 0 : maxpos / KEY_BLOCK + 1;

    int mypos[ATT_QPW];
    float M[ATT_QPW], L[ATT_QPW], O[ATT_QPW][R];
#pragma unroll
    for (int jq = 0; jq < ATT_QPW; ++jq) {
        mypos[jq] = spos[warp * ATT_QPW + jq];
        M[jq] = __int_as_float(0xff800000);  // -inf
        L[jq] = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) O[jq][r] = 0.0f;
    }

    const long long head_row0 = (long long)kvh * cap;
    const int8_t* kbase = k_codes + head_row0 * HD;
    const int8_t* vbase = v_codes + head_row0 * HD;

    for (int c = 0; c < n_blk; ++c) {
        const int j0 = c * KEY_BLOCK;
        __syncthreads();  // the previous block's shared data is no longer read
        // K codes: 16-byte loads into padded rows
        for (int idx = tid; idx < KEY_BLOCK * (HD / 16); idx += blockDim.x) {
            const int key = idx / (HD / 16);
            const int part = idx - key * (HD / 16);
            int4 val = make_int4(0, 0, 0, 0);
            if (j0 + key < cap) val = reinterpret_cast<const int4*>(kbase + (long long)(j0 + key) * HD)[part];
            int* dst = sk + key * KW + part * 4;
            dst[0] = val.x;
            dst[1] = val.y;
            dst[2] = val.z;
            dst[3] = val.w;
        }
        for (int idx = tid; idx < KEY_BLOCK * NB; idx += blockDim.x) {
            const int key = idx / NB;
            const int b = idx - key * NB;
            skd[key * KDS + b] = (j0 + key < cap) ? k_scale[(head_row0 + j0 + key) * NB + b] : 0.0f;
        }
        // V codes transposed, 4 keys x 4 dims at a time: svt[dim][key]
        for (int idx = tid; idx < (KEY_BLOCK / 4) * QW; idx += blockDim.x) {
            const int a = idx % (KEY_BLOCK / 4);  // key group: keys 4a .. 4a+3
            const int m = idx / (KEY_BLOCK / 4);  // dim group: dims 4m .. 4m+3
            unsigned r4[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int j = j0 + 4 * a + u;
                r4[u] = (j < cap) ? reinterpret_cast<const unsigned*>(vbase + (long long)j * HD)[m] : 0u;
            }
            const unsigned lo01 = __byte_perm(r4[0], r4[1], 0x5140);
            const unsigned hi01 = __byte_perm(r4[0], r4[1], 0x7362);
            const unsigned lo23 = __byte_perm(r4[2], r4[3], 0x5140);
            const unsigned hi23 = __byte_perm(r4[2], r4[3], 0x7362);
            svt[(4 * m + 0) * VW + a] = (int)__byte_perm(lo01, lo23, 0x5410);
            svt[(4 * m + 1) * VW + a] = (int)__byte_perm(lo01, lo23, 0x7632);
            svt[(4 * m + 2) * VW + a] = (int)__byte_perm(hi01, hi23, 0x5410);
            svt[(4 * m + 3) * VW + a] = (int)__byte_perm(hi01, hi23, 0x7632);
        }
        if (tid < KEY_BLOCK) svd[tid] = (j0 + tid < cap) ? v_scale[head_row0 + j0 + tid] : 0.0f;
        __syncthreads();

#pragma unroll
        for (int jq = 0; jq < ATT_QPW; ++jq) {
            const int pos = mypos[jq];
            if (pos < 0 || c > pos / KEY_BLOCK) continue;  // warp-uniform
            const int qi = warp * ATT_QPW + jq;
            const int* qr = sq + qi * QW;
            const float* qd = sqd + qi * NB;

            float s[2];
            bool valid[2];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int key = lane + 32 * u;
                const int* kr = sk + key * KW;
                float acc = 0.0f;
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    int sumi = 0;
#pragma unroll
                    for (int w = 0; w < 8; ++w) sumi = __dp4a(qr[8 * b + w], kr[8 * b + w], sumi);
                    acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(qd[b], skd[key * KDS + b]), (float)sumi));
                }
                acc = __fmul_rn(acc, kq_scale);
                valid[u] = (j0 + key) <= pos;
                s[u] = valid[u] ? acc : __int_as_float(0xff800000);
            }
            const float m_c = warp_max(fmaxf(s[0], s[1]));
            const float m_new = fmaxf(M[jq], m_c);
            const float alpha = strata_exp(__fsub_rn(M[jq], m_new));
            float p[2], w[2];
#pragma unroll
            for (int u = 0; u < 2; ++u) p[u] = valid[u] ? strata_exp(__fsub_rn(s[u], m_new)) : 0.0f;
            float lsum = __fadd_rn(p[0], p[1]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) lsum = __fadd_rn(lsum, __shfl_xor_sync(0xffffffffu, lsum, o));
#pragma unroll
            for (int u = 0; u < 2; ++u) w[u] = valid[u] ? __fmul_rn(p[u], svd[lane + 32 * u]) : 0.0f;
            const float amax = warp_max(fmaxf(fabsf(w[0]), fabsf(w[1])));
            int8_t wq0 = 0, wq1 = 0;
            float wd = 0.0f;
            if (amax > 0.0f) {
                const float d_inv = 127.0f / amax;
                wq0 = to_i8(roundf_away(__fmul_rn(w[0], d_inv)));
                wq1 = to_i8(roundf_away(__fmul_rn(w[1], d_inv)));
                wd = 1.0f / d_inv;
            }
            int8_t* wqb = reinterpret_cast<int8_t*>(swq + warp * (KEY_BLOCK / 4));
            wqb[lane] = wq0;
            wqb[lane + 32] = wq1;
            __syncwarp();
            const int* wqw = swq + warp * (KEY_BLOCK / 4);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int* vr = svt + (lane + 32 * r) * VW;
                int acc = 0;
#pragma unroll
                for (int k4 = 0; k4 < KEY_BLOCK / 4; ++k4) acc = __dp4a(wqw[k4], vr[k4], acc);
                const float ob = __fmul_rn(wd, (float)acc);
                O[jq][r] = __fadd_rn(__fmul_rn(O[jq][r], alpha), ob);
            }
            L[jq] = __fadd_rn(__fmul_rn(L[jq], alpha), lsum);
            M[jq] = m_new;
            __syncwarp();  // wq of this query read by every lane before the next overwrites it
        }
    }

#pragma unroll
    for (int jq = 0; jq < ATT_QPW; ++jq) {
        const long long t = t0 + warp * ATT_QPW + jq;
        if (t >= T) break;
        float* orow = out + t * ldo + (long long)h * HD;
#pragma unroll
        for (int r = 0; r < R; ++r) orow[lane + 32 * r] = O[jq][r] / L[jq];
    }
}

#define ATTEND_KERNEL(HD)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS)                                   \
    attend_hd##HD(const float* __restrict__ q, long long ldq, const int* __restrict__ positions,   \
                  int T, int group, const int8_t* __restrict__ k_codes,                            \
                  const float* __restrict__ k_scale, const int8_t* __restrict__ v_codes,           \
                  const float* __restrict__ v_scale, int cap, float kq_scale,                      \
                  float* __restrict__ out, long long ldo)                                          \
    {                                                                                              \
        attend_body<HD>(q, ldq, positions, T, group, k_codes, k_scale, v_codes, v_scale, cap,      \
                        kq_scale, out, ldo);                                                       \
    }

ATTEND_KERNEL(64)
ATTEND_KERNEL(128)
ATTEND_KERNEL(256)

extern "C" __device__ int attend_geometry[3] = {ATT_WARPS, ATT_QPW, KEY_BLOCK};
