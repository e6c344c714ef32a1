// Causal attention over the int8 KV cache of one layer: the tensor-core kernel (prefill) and
// the split-K kernels (decode).
//
// Definition: strata.attention.attend (docs/numerics.md section 5), bit for bit:
//   Q quantized like K: int8 codes, one float32 scale per 32 values (the q8 block quantize of
//     strata_numerics.cuh; an all-zero block: d = 0, codes 0).
//   score of key j: s = 0.0f; for b ascending: s = s + (dq_b * dk_jb) * (float)sumi_b (sumi
//     exact int32); s = s * kq_scale.
//   keys in blocks of 64 at absolute positions, c = 0 .. pos/64 ascending; key j valid iff
//     j <= pos. m_c = max valid s_j; m_new = max(M, m_c); alpha = exp(M - m_new) (exp(-inf) = 0);
//   p_j = valid ? exp(s_j - m_new) : 0; lsum = tree_sum(p[0..63]) (p_l + p_{l+32}, then the
//     halving tree 16..1); w_j = p_j * dv_j; (wq, dw) = int8 quantization of w[0..63] as one
//     block; ob_i = dw * (float)(sum_j wq_j * vq_ji) (exact int32);
//   L = L * alpha + lsum; O_i = O_i * alpha + ob_i; M = m_new; finally out_i = O_i / L.
//   exp is the shared polynomial of strata.numerics.exp (strata_exp, never expf/__expf).
// GQA: query head h reads KV head h / group (group = n_head / n_head_kv). Cache of one layer as
// strata.attention.KVCache: k_codes [n_kv, cap, HD] int8, k_scale [n_kv, cap, HD/32] f32,
// v_codes [n_kv, cap, HD] int8, v_scale [n_kv, cap] f32; keys at or past `cap` are never read.
// Integer parts are exact int32 whatever the summation order (|sum| < 2^21), so they may run
// on int8 tensor cores (mma.sync m16n8k32 s8) with any key order inside a block; every float
// step keeps the definition's operations and order.
//
// attend_mma_hd{64,128}: one CTA per (tile of 64 queries, head), 4 warps of 16 queries. Per
//   key block (staged in shared memory: K row-major, V transposed in a permuted key order that
//   matches the score fragment, so P goes from the score accumulators straight into the A
//   operand of P.V with no shuffles): S = Q.K^T as 4 x 8 mma per 32-value block b (sumi_b of
//   a 16 x 8 tile), the float epilogue per (query, key) in the thread owning the accumulator,
//   quad shuffles for the row max, the lsum tree (its last three levels: keys j / j+4, j / j+2,
//   j / j+1 sit in lanes xor 2, xor 1 and in-thread) and amax; then P.V as 2 x 16 mma.
// attend_split_{scores,pv,merge}_hd{64,128}: split-K for few queries (decode). Pass 1, one
//   CTA per (key block, KV head): scores and block maxima m_c of every (query, head of the
//   group) into scratch. Pass 2, same grid: the running max after block c is the prefix max of
//   m_0..m_c (max is exact in any order), before it the prefix max of m_0..m_{c-1}; hence
//   alpha, p, lsum, the P quantization and ob of each block independently. Pass 3, one CTA per
//   (query, head), one thread per output dim: the merge L = L*alpha + lsum, O = O*alpha + ob
//   in ascending block order, out = O / L.
// Compiled with --fmad=false; float steps are written with __fmul_rn / __fadd_rn anyway.

#include <stdint.h>
#include "strata_numerics.cuh"  // strata_exp, roundf_away_int, q8_*, warp_max, quad_max, warp_sum
#include "v_blocks.cuh"         // the transposed V blocks the pair kernel reads

#define KEY_BLOCK 64
#ifndef MMA_WARPS
#define MMA_WARPS 4  // warps of 16 queries per CTA (STRATA config: fast/cuda/attention.py)
#endif
#ifndef MMA_MINB
#define MMA_MINB 1   // __launch_bounds__ minimum CTAs per SM
#endif
// MMA_EPI: the per-(query, key) float work of the prefill kernel; both give the same bits.
//   1: p from strata_exp, P codes by roundf_away_int and byte packing, O = O * alpha + ob always.
//   2 (default): p from strata_exp_nonpos (p's argument is never above 0), P codes as the low
//      byte of round_nonneg_magic (w = p * dv >= 0: two rounded-down additions, no compare),
//      and a warp whose 16 queries all keep their maximum (alpha == 1 exactly, and
//      O * 1.0f == O) skips the 64 rescaling products of O and L.
#ifndef MMA_EPI
#define MMA_EPI 2
#endif
static_assert(MMA_EPI == 1 || MMA_EPI == 2, "MMA_EPI is 1 or 2");
#define MMA_TILE (16 * MMA_WARPS)
#define SPL_WARPS 8

__device__ __forceinline__ float magic_to_float(int acc)  // acc = MAGIC_I + exact int
{
    return __fsub_rn(__int_as_float(acc), MAGIC_F);
}

// c += a.b: A 16x32 s8 (row), B 32x8 s8 (col), C 16x8 s32; exact.
__device__ __forceinline__ void mma_s8(int (&c)[4], const int (&a)[4], int b0, int b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ int pack4(int8_t a, int8_t b, int8_t c, int8_t d)
{
    return (int)(((unsigned)(uint8_t)a) | ((unsigned)(uint8_t)b << 8) | ((unsigned)(uint8_t)c << 16) |
                 ((unsigned)(uint8_t)d << 24));
}

// One query row of HD floats -> int8 codes (qc, HD bytes) and NB scales (qd), by one warp.
// P codes of w >= 0 quantized with the row's di (d_inv, or 0 for a block whose 127/amax is not
// finite: codes 0): round_nonneg_magic(w * di), byte 0 of each float's bits is its code.
template <int NT>
__device__ __forceinline__ void p_code_bits(const float (&w)[NT][4], float di0, float di1, unsigned (&cb)[NT][4])
{
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        cb[nt][0] = __float_as_uint(round_nonneg_magic(__fmul_rn(w[nt][0], di0)));
        cb[nt][1] = __float_as_uint(round_nonneg_magic(__fmul_rn(w[nt][1], di0)));
        cb[nt][2] = __float_as_uint(round_nonneg_magic(__fmul_rn(w[nt][2], di1)));
        cb[nt][3] = __float_as_uint(round_nonneg_magic(__fmul_rn(w[nt][3], di1)));
    }
}

// bytes 0 of a, b, c, d -> one word a | b << 8 | c << 16 | d << 24
__device__ __forceinline__ int pack_lo(unsigned a, unsigned b, unsigned c, unsigned d)
{
    return (int)__byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

// The k32 A fragment of P from accumulators n0 .. n0 + 3: k = 4 tq + i <- lambda =
// 8 (i >> 1) + 2 tq + (i & 1) (accumulators n0, n0 + 1), + 16 for registers 2 and 3 (n0 + 2, + 3);
// registers 0 and 2 row r0, 1 and 3 row r1.
template <int NT>
__device__ __forceinline__ void p_fragment(const unsigned (&cb)[NT][4], int n0, int (&a)[4])
{
    a[0] = pack_lo(cb[n0][0], cb[n0][1], cb[n0 + 1][0], cb[n0 + 1][1]);
    a[1] = pack_lo(cb[n0][2], cb[n0][3], cb[n0 + 1][2], cb[n0 + 1][3]);
    a[2] = pack_lo(cb[n0 + 2][0], cb[n0 + 2][1], cb[n0 + 3][0], cb[n0 + 3][1]);
    a[3] = pack_lo(cb[n0 + 2][2], cb[n0 + 2][3], cb[n0 + 3][2], cb[n0 + 3][3]);
}

template <int HD>
__device__ __forceinline__ void quantize_row_warp(const float* __restrict__ qr, int8_t* qc, float* qd, int lane)
{
#pragma unroll
    for (int b = 0; b < HD / 32; ++b) {
        int8_t c;
        float d;
        q8_warp_block(qr[32 * b + lane], c, d);
        qc[32 * b + lane] = c;
        if (lane == 0) qd[b] = d;
    }
}

// V codes of keys j0 .. j0+63 transposed, 4 keys x 4 dims per step: word `slot` of dim row d
// holds (byte u) key key_of(slot, u) at dim d. `vw` words per dim row.
template <int HD, bool PERMUTED>
__device__ __forceinline__ void stage_v(int* svt, int vw, const int8_t* __restrict__ vbase, int j0, int cap,
                                        int tid, int nthreads)
{
    constexpr int QW = HD / 4;
    for (int idx = tid; idx < (KEY_BLOCK / 4) * QW; idx += nthreads) {
        const int slot = idx % (KEY_BLOCK / 4);  // word within the dim row (fastest: store banks)
        const int m = idx / (KEY_BLOCK / 4);     // dims 4m .. 4m+3
        int k0, kstep[4];
        if (PERMUTED) {
            // slot = 8 ks + 4 half + qq: keys 32ks + 16half + 2qq + {0, 1, 8, 9}
            k0 = 32 * (slot >> 3) + 16 * ((slot >> 2) & 1) + 2 * (slot & 3);
            kstep[0] = 0; kstep[1] = 1; kstep[2] = 8; kstep[3] = 9;
        } else {
            k0 = 4 * slot;
            kstep[0] = 0; kstep[1] = 1; kstep[2] = 2; kstep[3] = 3;
        }
        unsigned r4[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int j = j0 + k0 + kstep[u];
            r4[u] = (j < cap) ? reinterpret_cast<const unsigned*>(vbase + (long long)j * HD)[m] : 0u;
        }
        const unsigned lo01 = __byte_perm(r4[0], r4[1], 0x5140);
        const unsigned hi01 = __byte_perm(r4[0], r4[1], 0x7362);
        const unsigned lo23 = __byte_perm(r4[2], r4[3], 0x5140);
        const unsigned hi23 = __byte_perm(r4[2], r4[3], 0x7362);
        svt[(4 * m + 0) * vw + slot] = (int)__byte_perm(lo01, lo23, 0x5410);
        svt[(4 * m + 1) * vw + slot] = (int)__byte_perm(lo01, lo23, 0x7632);
        svt[(4 * m + 2) * vw + slot] = (int)__byte_perm(hi01, hi23, 0x5410);
        svt[(4 * m + 3) * vw + slot] = (int)__byte_perm(hi01, hi23, 0x7632);
    }
}

// K codes of keys j0 .. j0+63, row-major with rows of KW words (16-byte loads and stores;
// KW a multiple of 4).
template <int HD, int KW>
__device__ __forceinline__ void stage_k(int* sk, const int8_t* __restrict__ kbase, int j0, int cap,
                                        int tid, int nthreads)
{
    static_assert(KW % 4 == 0, "16-byte rows");
    for (int idx = tid; idx < KEY_BLOCK * (HD / 16); idx += nthreads) {
        const int key = idx / (HD / 16);
        const int part = idx - key * (HD / 16);
        int4 val = make_int4(0, 0, 0, 0);
        if (j0 + key < cap) val = reinterpret_cast<const int4*>(kbase + (long long)(j0 + key) * HD)[part];
        *reinterpret_cast<int4*>(sk + key * KW + part * 4) = val;
    }
}

// ============================================================================ tensor cores

template <bool B>
struct BoolTag {
    static constexpr bool value = B;
};

// ---- the per-(query, key) steps both prefill kernels share. A thread holds NT x 4 scores of a
// key block: accumulator (nt, e) is query row r0 (e < 2) or r1 (positions pos0, pos1) and the
// absolute key key(nt, e), which each kernel's key layout gives. A key past its row's position
// is invalid; FULL: the block lies below both rows, every key valid (no tests).

// s = s * kq_scale, -inf where invalid; (mc0, mc1) = the rows' maxima over the lane quad.
template <bool FULL, int NT, class Key>
__device__ __forceinline__ void scale_mask_max(float (&s)[NT][4], float kq_scale, int pos0, int pos1, Key key,
                                               float& mc0, float& mc1)
{
    const float NEG_INF = __int_as_float(0xff800000);
    mc0 = NEG_INF;
    mc1 = NEG_INF;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const bool valid = FULL || key(nt, e) <= ((e < 2) ? pos0 : pos1);
            const float sc = __fmul_rn(s[nt][e], kq_scale);
            s[nt][e] = valid ? sc : NEG_INF;
        }
        mc0 = fmaxf(mc0, fmaxf(s[nt][0], s[nt][1]));
        mc1 = fmaxf(mc1, fmaxf(s[nt][2], s[nt][3]));
    }
    mc0 = quad_max(mc0);
    mc1 = quad_max(mc1);
}

// s = p = exp(s - m_new) of the row (strata_exp_nonpos where NONPOS: the argument is never
// above 0), 0 where invalid.
template <bool FULL, bool NONPOS, int NT, class Key>
__device__ __forceinline__ void exp_masked(float (&s)[NT][4], float mn0, float mn1, int pos0, int pos1, Key key)
{
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const bool valid = FULL || key(nt, e) <= ((e < 2) ? pos0 : pos1);
            const float x = __fsub_rn(s[nt][e], (e < 2) ? mn0 : mn1);
            const float pe = NONPOS ? strata_exp_nonpos(x) : strata_exp(x);
            s[nt][e] = valid ? pe : 0.0f;
        }
    }
}

// s = w = p * dv (dv(nt): the float2 scales of keys with e & 1 = 0 and 1), 0 where invalid;
// (amax0, amax1) = the rows' max |w| over the lane quad.
template <bool FULL, int NT, class Key, class DV>
__device__ __forceinline__ void fold_v_scale(float (&s)[NT][4], int pos0, int pos1, Key key, DV dv,
                                             float& amax0, float& amax1)
{
    amax0 = 0.0f;
    amax1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const float2 d = dv(nt);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const bool valid = FULL || key(nt, e) <= ((e < 2) ? pos0 : pos1);
            const float we = __fmul_rn(s[nt][e], (e & 1) ? d.y : d.x);
            s[nt][e] = valid ? we : 0.0f;
        }
        amax0 = fmaxf(amax0, fmaxf(fabsf(s[nt][0]), fabsf(s[nt][1])));
        amax1 = fmaxf(amax1, fmaxf(fabsf(s[nt][2]), fabsf(s[nt][3])));
    }
    amax0 = quad_max(amax0);
    amax1 = quad_max(amax1);
}

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
            const int slot = idx % (KEY_BLOCK / 4);
            const int m = idx / (KEY_BLOCK / 4);
            if (idx < (KEY_BLOCK / 4) * (HD / 4)) {
                const unsigned lo01 = __byte_perm(pv[i][0], pv[i][1], 0x5140);
                const unsigned hi01 = __byte_perm(pv[i][0], pv[i][1], 0x7362);
                const unsigned lo23 = __byte_perm(pv[i][2], pv[i][3], 0x5140);
                const unsigned hi23 = __byte_perm(pv[i][2], pv[i][3], 0x7362);
                svt[(4 * m + 0) * VW + slot] = (int)__byte_perm(lo01, lo23, 0x5410);
                svt[(4 * m + 1) * VW + slot] = (int)__byte_perm(lo01, lo23, 0x7632);
                svt[(4 * m + 2) * VW + slot] = (int)__byte_perm(hi01, hi23, 0x5410);
                svt[(4 * m + 3) * VW + slot] = (int)__byte_perm(hi01, hi23, 0x7632);
            }
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
                    int acc[4] = {MAGIC_I, MAGIC_I, MAGIC_I, MAGIC_I};  // sumi_b rides on MAGIC_I
                    const int* kr = sk + (8 * nt + g) * KW + 8 * b;
                    mma_s8(acc, qa[b], kr[tq], kr[4 + tq]);
                    const float dk0 = skd[b * KEY_BLOCK + 8 * nt + 2 * tq];
                    const float dk1 = skd[b * KEY_BLOCK + 8 * nt + 2 * tq + 1];
                    s[nt][0] = __fadd_rn(s[nt][0], __fmul_rn(__fmul_rn(dq0[b], dk0), magic_to_float(acc[0])));
                    s[nt][1] = __fadd_rn(s[nt][1], __fmul_rn(__fmul_rn(dq0[b], dk1), magic_to_float(acc[1])));
                    s[nt][2] = __fadd_rn(s[nt][2], __fmul_rn(__fmul_rn(dq1[b], dk0), magic_to_float(acc[2])));
                    s[nt][3] = __fadd_rn(s[nt][3], __fmul_rn(__fmul_rn(dq1[b], dk1), magic_to_float(acc[3])));
                }
            }
            auto key = [&](int nt, int e) { return j0 + 8 * nt + 2 * tq + (e & 1); };
            float mc0, mc1;
            scale_mask_max<FULL>(s, kq_scale, pos0, pos1, key, mc0, mc1);
            const float mn0 = fmaxf(M0, mc0), mn1 = fmaxf(M1, mc1);
            const float al0 = strata_exp(__fsub_rn(M0, mn0));
            const float al1 = strata_exp(__fsub_rn(M1, mn1));

            // p (into s), the lsum tree, then w = p * dv (into s)
            exp_masked<FULL, (MMA_EPI >= 2)>(s, mn0, mn1, pos0, pos1, key);
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
            int pa[2][4];
            if constexpr (MMA_EPI >= 2) {
                // w >= 0, so roundf_away(w * d_inv) is round_nonneg_magic; a block that is not ok
                // multiplies by 0 (codes 0). Byte 0 of each float's bits is its code.
                const float di0 = ok0 ? d_inv0 : 0.0f, di1 = ok1 ? d_inv1 : 0.0f;
                unsigned cb[NT][4];
                p_code_bits(w, di0, di1, cb);
    #pragma unroll
                for (int ks = 0; ks < 2; ++ks) p_fragment(cb, 4 * ks, pa[ks]);
            } else {
                int8_t code[NT][4];
    #pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    code[nt][0] = ok0 ? (int8_t)roundf_away_int(__fmul_rn(w[nt][0], d_inv0)) : (int8_t)0;
                    code[nt][1] = ok0 ? (int8_t)roundf_away_int(__fmul_rn(w[nt][1], d_inv0)) : (int8_t)0;
                    code[nt][2] = ok1 ? (int8_t)roundf_away_int(__fmul_rn(w[nt][2], d_inv1)) : (int8_t)0;
                    code[nt][3] = ok1 ? (int8_t)roundf_away_int(__fmul_rn(w[nt][3], d_inv1)) : (int8_t)0;
                }
    #pragma unroll
                for (int ks = 0; ks < 2; ++ks) {
                    const int n0 = 4 * ks;
                    pa[ks][0] = pack4(code[n0][0], code[n0][1], code[n0 + 1][0], code[n0 + 1][1]);
                    pa[ks][1] = pack4(code[n0][2], code[n0][3], code[n0 + 1][2], code[n0 + 1][3]);
                    pa[ks][2] = pack4(code[n0 + 2][0], code[n0 + 2][1], code[n0 + 3][0], code[n0 + 3][1]);
                    pa[ks][3] = pack4(code[n0 + 2][2], code[n0 + 2][3], code[n0 + 3][2], code[n0 + 3][3]);
                }
            }

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
                    const float s0 = KEEP ? O[nd][0] : __fmul_rn(O[nd][0], al0);
                    const float s1 = KEEP ? O[nd][1] : __fmul_rn(O[nd][1], al0);
                    const float s2 = KEEP ? O[nd][2] : __fmul_rn(O[nd][2], al1);
                    const float s3 = KEEP ? O[nd][3] : __fmul_rn(O[nd][3], al1);
                    const float o0 = __fadd_rn(s0, __fmul_rn(wd0, magic_to_float(acc[0])));
                    const float o1 = __fadd_rn(s1, __fmul_rn(wd0, magic_to_float(acc[1])));
                    const float o2 = __fadd_rn(s2, __fmul_rn(wd1, magic_to_float(acc[2])));
                    const float o3 = __fadd_rn(s3, __fmul_rn(wd1, magic_to_float(acc[3])));
                    O[nd][0] = live0 ? o0 : O[nd][0];
                    O[nd][1] = live0 ? o1 : O[nd][1];
                    O[nd][2] = live1 ? o2 : O[nd][2];
                    O[nd][3] = live1 ? o3 : O[nd][3];
                }
                const float l0 = __fadd_rn(KEEP ? L0 : __fmul_rn(L0, al0), ls0);
                const float l1 = __fadd_rn(KEEP ? L1 : __fmul_rn(L1, al1), ls1);
                L0 = live0 ? l0 : L0;
                L1 = live1 ? l1 : L1;
            };
            if (MMA_EPI >= 2 && __all_sync(0xffffffffu, al0 == 1.0f && al1 == 1.0f)) pv(BoolTag<true>{});
            else pv(BoolTag<false>{});
            M0 = live0 ? mn0 : M0;
            M1 = live1 ? mn1 : M1;
        };
        if (j0 + KEY_BLOCK - 1 <= wminpos) block(BoolTag<true>{});
        else block(BoolTag<false>{});
    }

    const long long ta = t0 + r0, tb = t0 + r1;
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
        const int d = 8 * nd + 2 * tq;
        if (ta < T) {
            float* o = out + ta * ldo + (long long)h * HD + d;
            o[0] = O[nd][0] / L0;
            o[1] = O[nd][1] / L0;
        }
        if (tb < T) {
            float* o = out + tb * ldo + (long long)h * HD + d;
            o[0] = O[nd][2] / L1;
            o[1] = O[nd][3] / L1;
        }
    }
}

// One entry point per kernel and head_dim: attend_<KIND>_hd<HD>, the same parameters, its body
// attend_<KIND>_body<HD>. v_t (v_blocks.cuh) is read by the pair kernel only.
#define ATTEND_KERNEL(KIND, HD, THREADS, MINB)                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                    \
    attend_##KIND##_hd##HD(const float* __restrict__ q, long long ldq, const int* __restrict__ positions,\
                           int T, int group, const int8_t* __restrict__ k_codes,                   \
                           const float* __restrict__ k_scale, const int8_t* __restrict__ v_codes,  \
                           const float* __restrict__ v_scale, const int8_t* __restrict__ v_t,     \
                           int cap, float kq_scale, float* __restrict__ out, long long ldo)        \
    {                                                                                              \
        attend_##KIND##_body<HD>(q, ldq, positions, T, group, k_codes, k_scale, v_codes, v_scale,  \
                                 v_t, cap, kq_scale, out, ldo);                                    \
    }

ATTEND_KERNEL(mma, 64, 32 * MMA_WARPS, MMA_MINB)
ATTEND_KERNEL(mma, 128, 32 * MMA_WARPS, MMA_MINB)

// ============================================================================ warp pairs
// attend_pair_hd{64,128}: the prefill kernel with the work of a 16-query group split between two
// warps, so each holds half the registers (O of HD/2 dims, scores of 32 keys) and an SM runs
// twice the warps of attend_mma (the float epilogue's latencies hide behind other warps).
//   Warp half hh of a pair scores the keys kappa = 2*lambda + hh (lambda = 8 nt + 2 tq + (e & 1),
//   its accumulator (nt, e)). The definition's lsum tree pairs kappa with kappa + 32, + 16, + 8,
//   + 4, + 2 (all of one parity: lambda + 16, + 8, + 4, + 2, + 1 inside the warp, in that
//   order) and only its last level, kappa with kappa + 1, joins the two halves: lsum = u_0 + u_1.
//   The block maximum and amax (exact in any order) are joined the same way. The pair trades
//   them, and its P codes (each warp's codes are one k32 A fragment), through shared memory
//   under a 64-thread named barrier; then each warp runs P.V over all 64 keys (two k-steps) for
//   its HD/2 output dims, in the definition's order per output.
//   Staging: cp.async into a ring of PAIR_STAGES key blocks (no registers held across the
//   compute); K and V rows land at row 32 (kappa & 1) + (kappa >> 1), so each warp's keys are
//   consecutive rows (conflict-free ldmatrix). K fragments: ldmatrix; V fragments: ldmatrix of
//   the cache's transposed V block (v_t, v_blocks.cuh: per dim, the block's keys in the P
//   fragment's k order), HD rows of 64 key bytes at a pitch of 80 (conflict-free), each 8-row
//   matrix one n8 tile's b0 or b1 as the mma reads it, with no byte permute; the n8 tiles of a
//   16-dim group are its even and its odd dims. A thread's K chunks of a key block share one
//   offset and one bound check, the head's row from a division done once. Q has its own shared
//   memory, so the first key blocks are in flight while it is quantized.
//   Per block and row, alpha (skipped while every row of the warp keeps a finite maximum:
//   exp(0) = 1) and the two divisions of the P quantization run once a lane, one row each.
#ifndef PAIR_QG
#define PAIR_QG 8      // 16-query groups per CTA (two warps each: 64 * PAIR_QG threads)
#endif
#ifndef PAIR_STAGES
#define PAIR_STAGES 3  // key blocks in flight in the cp.async ring
#endif
#ifndef PAIR_MINB
#define PAIR_MINB 1    // __launch_bounds__ minimum CTAs per SM
#endif
static_assert(PAIR_STAGES >= 2, "a ring of at least two key blocks");
#define PAIR_THREADS (64 * PAIR_QG)
#define PAIR_TILE (16 * PAIR_QG)

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// cp.async of `bytes` (4, 8 or 16); src_ok false: the bytes are zero-filled (nothing is read)
template <int BYTES>
__device__ __forceinline__ void cp_async(unsigned dst, const void* src, bool src_ok)
{
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_ok ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(BYTES),
                     "r"(src_ok ? BYTES : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(unsigned addr, int& r0, int& r1, int& r2, int& r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void pair_barrier(int id) { asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory"); }

// The dynamic shared memory of attend_pair_hd<HD> (bytes), and its parts' offsets.
template <int HD>
struct PairSmem {
    static constexpr int NB = HD / 32;
    static constexpr int KP = HD + 16;                 // K / V / Q row pitch (bytes)
    static constexpr int VTP = 80;                     // transposed V row pitch: 64 key bytes + 16
    static constexpr int K_OFF = 0;
    static constexpr int V_OFF = KEY_BLOCK * KP;
    static constexpr int V_BYTES = HD * VTP;
    static constexpr int KS_OFF = V_OFF + V_BYTES;     // k scales, NB floats a key
    static constexpr int VS_OFF = KS_OFF + KEY_BLOCK * NB * 4;
    static constexpr int STAGE = VS_OFF + KEY_BLOCK * 4;
    static constexpr int RING = PAIR_STAGES * STAGE;
    static constexpr int Q_OFF = RING;                            // the tile's Q codes, rows of KP
    static constexpr int QD_OFF = Q_OFF + PAIR_TILE * KP;         // and scales, NB a row
    static constexpr int XCH_OFF = QD_OFF + PAIR_TILE * NB * 4;
    static constexpr int XM_OFF = XCH_OFF;                       // [QG][2][16] block maxima
    static constexpr int XS_OFF = XM_OFF + PAIR_QG * 2 * 16 * 4;  // [QG][2][16][2] lsum halves, amax
    static constexpr int XP_OFF = XS_OFF + PAIR_QG * 2 * 32 * 4;  // [QG][2][32] int4 P fragments
    static constexpr int POS_OFF = XP_OFF + PAIR_QG * 2 * 32 * 16;
    static constexpr int BYTES = POS_OFF + PAIR_TILE * 4;
    static_assert(STAGE % 16 == 0 && XCH_OFF % 16 == 0, "16-byte aligned parts");
};

template <int HD>
__device__ __forceinline__ void attend_pair_body(
    const float* __restrict__ q, long long ldq, const int* __restrict__ positions, int T, int group,
    const int8_t* __restrict__ k_codes, const float* __restrict__ k_scale,
    const int8_t* __restrict__ /* v_codes: V is read from v_t */, const float* __restrict__ v_scale,
    const int8_t* __restrict__ v_t, int cap,
    float kq_scale, float* __restrict__ out, long long ldo)
{
    using SM = PairSmem<HD>;
    constexpr int NB = SM::NB;
    constexpr int KP = SM::KP;
    constexpr int NG = HD / 32;  // 16-dim groups of a warp's HD/2 output dims
    extern __shared__ __align__(128) unsigned char smem[];
    float* xm = reinterpret_cast<float*>(smem + SM::XM_OFF);
    float* xs = reinterpret_cast<float*>(smem + SM::XS_OFF);
    int4* xp = reinterpret_cast<int4*>(smem + SM::XP_OFF);
    int* spos = reinterpret_cast<int*>(smem + SM::POS_OFF);
    const unsigned ring = smem_u32(smem);

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;
    const int tq = lane & 3;
    const int qg = warp >> 1;  // the pair
    const int hh = warp & 1;   // the half: keys of parity hh, output dims hh * HD/2 ..
    const int h = blockIdx.y;
    const long long t0 = (long long)(gridDim.x - 1 - blockIdx.x) * PAIR_TILE;  // heaviest first

    if (tid < PAIR_TILE) spos[tid] = (t0 + tid < T) ? positions[t0 + tid] : -1;
    __syncthreads();
    const int r0 = qg * 16 + g, r1 = r0 + 8;
    // ldmatrix rows of the Q A fragments: matrix j = lane / 8 is rows 0-7 (j even) or 8-15 of
    // the group, bytes 0-15 (j < 2) or 16-31 of a 32-value block
    const unsigned q_frag = smem_u32(smem + SM::Q_OFF) +
                            (unsigned)((qg * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * KP + 16 * (lane >> 4));
    int maxpos = -1;
    for (int i = 0; i < PAIR_TILE; ++i) maxpos = max(maxpos, spos[i]);
    const int n_blk = maxpos < 0 ? 0 : maxpos / KEY_BLOCK + 1;
    const int pos0 = spos[r0], pos1 = spos[r1];
    const int last0 = pos0 < 0 ? -1 : pos0 / KEY_BLOCK;
    const int last1 = pos1 < 0 ? -1 : pos1 / KEY_BLOCK;
    const int plast = __reduce_max_sync(0xffffffffu, max(last0, last1));    // the pair's (same rows)
    const int pminpos = __reduce_min_sync(0xffffffffu, min(pos0, pos1));   // -1 with padding rows

    // key block c -> ring stage c % PAIR_STAGES (stage_in, advanced by issue); key kappa at row
    // 32 (kappa & 1) + (kappa >> 1). A thread's K chunks are the same bytes of the same keys
    // every block; the transposed V block is one contiguous run of HD * 64 bytes.
    const int kvh = blockIdx.y / group;
    int stage_in = 0;
    auto issue = [&](int c) {
        if (c < n_blk) {
            const int j0 = c * KEY_BLOCK;
            const long long row0 = (long long)kvh * cap + j0;  // the block's first key in the cache rows
            const unsigned st = ring + (unsigned)(stage_in * SM::STAGE);
            constexpr int CH = HD / 16;  // 16-byte chunks of a row
#pragma unroll
            for (int i = 0; i < (KEY_BLOCK * CH + PAIR_THREADS - 1) / PAIR_THREADS; ++i) {
                const int idx = tid + i * PAIR_THREADS;
                if ((KEY_BLOCK * CH) % PAIR_THREADS == 0 || idx < KEY_BLOCK * CH) {
                    const int kap = idx / CH, part = idx % CH;
                    const unsigned dst = st + (32 * (kap & 1) + (kap >> 1)) * KP + 16 * part;
                    const bool ok = j0 + kap < cap;
                    const long long off = ok ? (row0 + kap) * HD + 16 * part : 0;
                    cp_async<16>(dst + SM::K_OFF, k_codes + off, ok);
                }
            }
            {  // the block's transposed V: HD rows of 64 bytes, HD * 4 chunks (as many as K's)
                const int8_t* vb = v_t + ((long long)kvh * vt_blocks(cap) + c) * (HD * 64);
                const unsigned vst = st + SM::V_OFF;
#pragma unroll
                for (int i = 0; i < (HD * 4 + PAIR_THREADS - 1) / PAIR_THREADS; ++i) {
                    const int idx = tid + i * PAIR_THREADS;
                    if ((HD * 4) % PAIR_THREADS == 0 || idx < HD * 4)
                        cp_async<16>(vst + (idx >> 2) * SM::VTP + 16 * (idx & 3), vb + 16 * idx, true);
                }
            }
            if (tid < KEY_BLOCK) {
                const int row = 32 * (tid & 1) + (tid >> 1);
                const bool ok = j0 + tid < cap;
                const long long key = ok ? row0 + tid : 0;
                cp_async<4 * NB>(st + SM::KS_OFF + 4 * NB * row, k_scale + key * NB, ok);
                cp_async<4>(st + SM::VS_OFF + 4 * row, v_scale + key, ok);
            }
            stage_in = (stage_in + 1 == PAIR_STAGES) ? 0 : stage_in + 1;
        }
        cp_async_commit();  // every thread commits a group per block, empty or not
    };

    // the first key blocks are in flight while Q is quantized
#pragma unroll
    for (int s = 0; s < PAIR_STAGES - 1; ++s) issue(s);

    // ---- Q of the tile, quantized (int8, one scale per 32) into shared memory, then its A
    // fragments (ldmatrix) and scales into registers for every block
    float* sqd = reinterpret_cast<float*>(smem + SM::QD_OFF);
    {
        int8_t* sq = reinterpret_cast<int8_t*>(smem + SM::Q_OFF);
        float x[8][NB];  // the warp's 8 rows, every load in flight before the first reduction
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const long long t = t0 + qg * 16 + hh * 8 + i;
#pragma unroll
            for (int b = 0; b < NB; ++b) x[i][b] = (t < T) ? q[t * ldq + (long long)h * HD + 32 * b + lane] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int qi = qg * 16 + hh * 8 + i;
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                int8_t c;
                float d;
                q8_warp_block(x[i][b], c, d);
                sq[qi * KP + 32 * b + lane] = c;
                if (lane == 0) sqd[qi * NB + b] = d;
            }
        }
    }
    __syncthreads();  // the Q tile is written
    int qa[NB][4];
    float dq0[NB], dq1[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        ldsm_x4(q_frag + 32 * b, qa[b][0], qa[b][1], qa[b][2], qa[b][3]);
        dq0[b] = sqd[r0 * NB + b];
        dq1[b] = sqd[r1 * NB + b];
    }

    const float NEG_INF = __int_as_float(0xff800000);
    float M0 = NEG_INF, M1 = NEG_INF, L0 = 0.0f, L1 = 0.0f;
    float O[NG][2][4];
#pragma unroll
    for (int gr = 0; gr < NG; ++gr)
#pragma unroll
        for (int eo = 0; eo < 2; ++eo)
#pragma unroll
            for (int e = 0; e < 4; ++e) O[gr][eo][e] = 0.0f;

    float* xm_own = xm + (qg * 2 + hh) * 16;
    const float* xm_oth = xm + (qg * 2 + 1 - hh) * 16;
    float* xs_own = xs + (qg * 2 + hh) * 32;
    const float* xs_oth = xs + (qg * 2 + 1 - hh) * 32;
    const int bar_id = 1 + qg;

    int stage_use = 0;  // block c's stage, c % PAIR_STAGES
    for (int c = 0; c < n_blk; ++c) {
        cp_async_wait<PAIR_STAGES - 2>();
        __syncthreads();  // block c is in the ring for every thread; block c - 1's stage is free
        issue(c + PAIR_STAGES - 1);
        if (c > plast) {  // pair-uniform: none of the pair's queries reaches block c
            stage_use = (stage_use + 1 == PAIR_STAGES) ? 0 : stage_use + 1;
            continue;
        }
        const int j0 = c * KEY_BLOCK;
        const unsigned st = ring + (unsigned)(stage_use * SM::STAGE);
        const unsigned char* stp = smem + stage_use * SM::STAGE;
        stage_use = (stage_use + 1 == PAIR_STAGES) ? 0 : stage_use + 1;

        auto block = [&](auto full_tag) {
            constexpr bool FULL = decltype(full_tag)::value;
            // scores of the warp's 32 keys: accumulator (nt, e) is row r0 (e < 2) or r1, key
            // kappa = 2 (8 nt + 2 tq + (e & 1)) + hh
            float s[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                int kb[NB][2];
#pragma unroll
                for (int bb = 0; bb < NB / 2; ++bb) {
                    const int j = lane >> 3;
                    const unsigned a = st + SM::K_OFF + (32 * hh + 8 * nt + (lane & 7)) * KP + 64 * bb + 16 * j;
                    ldsm_x4(a, kb[2 * bb][0], kb[2 * bb][1], kb[2 * bb + 1][0], kb[2 * bb + 1][1]);
                }
                const float* dka = reinterpret_cast<const float*>(stp + SM::KS_OFF) + (32 * hh + 8 * nt + 2 * tq) * NB;
                float dk0[NB], dk1[NB];
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    dk0[b] = dka[b];
                    dk1[b] = dka[NB + b];
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    int acc[4] = {MAGIC_I, MAGIC_I, MAGIC_I, MAGIC_I};  // sumi_b rides on MAGIC_I
                    mma_s8(acc, qa[b], kb[b][0], kb[b][1]);
                    s[nt][0] = __fadd_rn(s[nt][0], __fmul_rn(__fmul_rn(dq0[b], dk0[b]), magic_to_float(acc[0])));
                    s[nt][1] = __fadd_rn(s[nt][1], __fmul_rn(__fmul_rn(dq0[b], dk1[b]), magic_to_float(acc[1])));
                    s[nt][2] = __fadd_rn(s[nt][2], __fmul_rn(__fmul_rn(dq1[b], dk0[b]), magic_to_float(acc[2])));
                    s[nt][3] = __fadd_rn(s[nt][3], __fmul_rn(__fmul_rn(dq1[b], dk1[b]), magic_to_float(acc[3])));
                }
            }
            auto key = [&](int nt, int e) { return j0 + 2 * (8 * nt + 2 * tq + (e & 1)) + hh; };
            float mc0, mc1;
            scale_mask_max<FULL>(s, kq_scale, pos0, pos1, key, mc0, mc1);
            if (tq == 0) {
                xm_own[g] = mc0;
                xm_own[g + 8] = mc1;
            }
            pair_barrier(bar_id);
            mc0 = fmaxf(mc0, xm_oth[g]);
            mc1 = fmaxf(mc1, xm_oth[g + 8]);
            const float mn0 = fmaxf(M0, mc0), mn1 = fmaxf(M1, mc1);
            // alpha = exp(M - m_new) of the lane's quad rows: 1.0f exactly (exp(0)) where a finite
            // M stays; else the exponential, one row a lane (tq even: r0, odd: r1), shuffled
            // to the quad
            float al0 = 1.0f, al1 = 1.0f;
            {
                const float INF = __int_as_float(0x7f800000);
                const bool keep = M0 == mn0 && fabsf(M0) < INF && M1 == mn1 && fabsf(M1) < INF;
                if (!__all_sync(0xffffffffu, keep)) {
                    const float a = strata_exp(__fsub_rn((tq & 1) ? M1 : M0, (tq & 1) ? mn1 : mn0));
                    al0 = __shfl_sync(0xffffffffu, a, lane & ~3);
                    al1 = __shfl_sync(0xffffffffu, a, (lane & ~3) | 1);
                }
            }

            exp_masked<FULL, true>(s, mn0, mn1, pos0, pos1, key);
            // the tree over lambda: + 16 (nt, nt + 2), + 8 (nt 0, 1), + 4 (lanes xor 2), + 2 (xor 1),
            // + 1 (e, e + 1); the pair's halves last
            float u[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                u[e] = __fadd_rn(__fadd_rn(s[0][e], s[2][e]), __fadd_rn(s[1][e], s[3][e]));
                u[e] = __fadd_rn(u[e], __shfl_xor_sync(0xffffffffu, u[e], 2));
                u[e] = __fadd_rn(u[e], __shfl_xor_sync(0xffffffffu, u[e], 1));
            }
            float ls0 = __fadd_rn(u[0], u[1]);
            float ls1 = __fadd_rn(u[2], u[3]);
            float amax0, amax1;
            fold_v_scale<FULL>(s, pos0, pos1, key, [&](int nt) {
                return *reinterpret_cast<const float2*>(stp + SM::VS_OFF + 4 * (32 * hh + 8 * nt + 2 * tq));
            }, amax0, amax1);
            if (tq == 0) {
                xs_own[2 * g] = ls0;
                xs_own[2 * g + 1] = amax0;
                xs_own[2 * (g + 8)] = ls1;
                xs_own[2 * (g + 8) + 1] = amax1;
            }
            pair_barrier(bar_id);
            {
                const float2 o0 = *reinterpret_cast<const float2*>(xs_oth + 2 * g);
                const float2 o1 = *reinterpret_cast<const float2*>(xs_oth + 2 * (g + 8));
                ls0 = __fadd_rn(ls0, o0.x);
                ls1 = __fadd_rn(ls1, o1.x);
                amax0 = fmaxf(amax0, o0.y);
                amax1 = fmaxf(amax1, o1.y);
            }
            // the P codes (w >= 0: round_nonneg_magic; a block whose 127/amax is not finite:
            // scale 0, codes 0), packed as this warp's k32 A fragment: k = 4 tq + i <- lambda =
            // 8 (i >> 1) + 2 tq + (i & 1), + 16 for registers 2 and 3
            // 127 / amax and its inverse, one row a lane as alpha (two divisions a lane, not four)
            float di0, di1, wd0, wd1;
            {
                const float d_inv = q8_inv_scale((tq & 1) ? amax1 : amax0);
                const bool ok = d_inv < __int_as_float(0x7f800000);
                const float wd = ok ? q8_scale(d_inv) : 0.0f, di = ok ? d_inv : 0.0f;
                di0 = __shfl_sync(0xffffffffu, di, lane & ~3);
                di1 = __shfl_sync(0xffffffffu, di, (lane & ~3) | 1);
                wd0 = __shfl_sync(0xffffffffu, wd, lane & ~3);
                wd1 = __shfl_sync(0xffffffffu, wd, (lane & ~3) | 1);
            }
            unsigned cb[4][4];
            p_code_bits(s, di0, di1, cb);
            int pa[2][4];  // k-step 0: the keys of half 0; 1: of half 1
            int frag[4];
            p_fragment(cb, 0, frag);
            const int4 mine = make_int4(frag[0], frag[1], frag[2], frag[3]);
            xp[(qg * 2 + hh) * 32 + lane] = mine;
            pair_barrier(bar_id);
            const int4 p0 = xp[(qg * 2) * 32 + lane], p1 = xp[(qg * 2 + 1) * 32 + lane];  // both, no selects
            pa[0][0] = p0.x; pa[0][1] = p0.y; pa[0][2] = p0.z; pa[0][3] = p0.w;
            pa[1][0] = p1.x; pa[1][1] = p1.y; pa[1][2] = p1.z; pa[1][3] = p1.w;

            const bool live0 = FULL || c <= last0, live1 = FULL || c <= last1;
            auto pv = [&](auto keep_tag) {
                constexpr bool KEEP = decltype(keep_tag)::value;
#pragma unroll
                for (int gr = 0; gr < NG; ++gr) {
                    const int G = hh * NG + gr;  // 16-dim group of the head row
                    int acc[2][4];
#pragma unroll
                    for (int eo = 0; eo < 2; ++eo)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[eo][e] = MAGIC_I;  // |P.V| < 2^21
#pragma unroll
                    for (int ks = 0; ks < 2; ++ks) {
                        int R0, R1, R2, R3;
                        // matrix m = lane / 8: the group's even (m < 2) or odd dims, k 0-15 (m even)
                        // or 16-31 of k-step ks: the B fragments b0, b1 of the two n8 tiles
                        ldsm_x4(st + SM::V_OFF + (16 * G + 8 * ((lane >> 4) & 1) + (lane & 7)) * SM::VTP +
                                    32 * ks + 16 * ((lane >> 3) & 1), R0, R1, R2, R3);
                        mma_s8(acc[0], pa[ks], R0, R1);
                        mma_s8(acc[1], pa[ks], R2, R3);
                    }
#pragma unroll
                    for (int eo = 0; eo < 2; ++eo) {
                        const float s0 = KEEP ? O[gr][eo][0] : __fmul_rn(O[gr][eo][0], al0);
                        const float s1 = KEEP ? O[gr][eo][1] : __fmul_rn(O[gr][eo][1], al0);
                        const float s2 = KEEP ? O[gr][eo][2] : __fmul_rn(O[gr][eo][2], al1);
                        const float s3 = KEEP ? O[gr][eo][3] : __fmul_rn(O[gr][eo][3], al1);
                        const float o0 = __fadd_rn(s0, __fmul_rn(wd0, magic_to_float(acc[eo][0])));
                        const float o1 = __fadd_rn(s1, __fmul_rn(wd0, magic_to_float(acc[eo][1])));
                        const float o2 = __fadd_rn(s2, __fmul_rn(wd1, magic_to_float(acc[eo][2])));
                        const float o3 = __fadd_rn(s3, __fmul_rn(wd1, magic_to_float(acc[eo][3])));
                        O[gr][eo][0] = live0 ? o0 : O[gr][eo][0];
                        O[gr][eo][1] = live0 ? o1 : O[gr][eo][1];
                        O[gr][eo][2] = live1 ? o2 : O[gr][eo][2];
                        O[gr][eo][3] = live1 ? o3 : O[gr][eo][3];
                    }
                }
                const float l0 = __fadd_rn(KEEP ? L0 : __fmul_rn(L0, al0), ls0);
                const float l1 = __fadd_rn(KEEP ? L1 : __fmul_rn(L1, al1), ls1);
                L0 = live0 ? l0 : L0;
                L1 = live1 ? l1 : L1;
            };
            if (__all_sync(0xffffffffu, al0 == 1.0f && al1 == 1.0f)) pv(BoolTag<true>{});
            else pv(BoolTag<false>{});
            M0 = live0 ? mn0 : M0;
            M1 = live1 ? mn1 : M1;
        };
        if (j0 + KEY_BLOCK - 1 <= pminpos) block(BoolTag<true>{});
        else block(BoolTag<false>{});
    }
    cp_async_wait<0>();  // nothing in flight at exit

    // O[gr][0][0..1] are dims 16 G + 4 tq + {0, 2}, O[gr][1][0..1] dims 16 G + 4 tq + {1, 3} (row r0)
    const long long ta = t0 + r0, tb = t0 + r1;
#pragma unroll
    for (int gr = 0; gr < NG; ++gr) {
        const int d = 16 * (hh * NG + gr) + 4 * tq;
        if (ta < T) {
            float* o = out + ta * ldo + (long long)h * HD + d;
            o[0] = O[gr][0][0] / L0;
            o[1] = O[gr][1][0] / L0;
            o[2] = O[gr][0][1] / L0;
            o[3] = O[gr][1][1] / L0;
        }
        if (tb < T) {
            float* o = out + tb * ldo + (long long)h * HD + d;
            o[0] = O[gr][0][2] / L1;
            o[1] = O[gr][1][2] / L1;
            o[2] = O[gr][0][3] / L1;
            o[3] = O[gr][1][3] / L1;
        }
    }
}

ATTEND_KERNEL(pair, 64, PAIR_THREADS, PAIR_MINB)
ATTEND_KERNEL(pair, 128, PAIR_THREADS, PAIR_MINB)

// dynamic shared memory bytes of attend_pair_hd64 / _hd128, and the CTA's queries and threads
extern "C" __device__ int attend_pair_geometry[4] = {PairSmem<64>::BYTES, PairSmem<128>::BYTES, PAIR_TILE,
                                                     PAIR_THREADS};

// ============================================================================ split-K
// Scratch (float32), for U = T * n_head units (query t, head h: unit t * n_head + h) and nblk
// blocks: S [U, nblk * 64] scores, MC [U, nblk] block maxima, OB [U, nblk, HD], LS and AL [U, nblk].

// Pass 1: grid (nblk, n_kv), SPL_WARPS warps; a warp per (query, head of the group).
template <int HD>
__device__ __forceinline__ void split_scores_body(
    const float* __restrict__ q, long long ldq, const int* __restrict__ positions, int T, int n_head,
    int group, const int8_t* __restrict__ k_codes, const float* __restrict__ k_scale, int cap,
    float kq_scale, int nblk, float* __restrict__ S, float* __restrict__ MC)
{
    constexpr int NB = HD / 32;
    constexpr int QW = HD / 4;
    constexpr int KW = QW + 1;
    constexpr int KDS = NB + 1;
    __shared__ int sk[KEY_BLOCK * KW];
    __shared__ float skd[KEY_BLOCK * KDS];
    __shared__ int sq[SPL_WARPS * QW];
    __shared__ float sqd[SPL_WARPS * NB];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int c = blockIdx.x, kvh = blockIdx.y;
    const int j0 = c * KEY_BLOCK;
    const long long head_row0 = (long long)kvh * cap;
    const int8_t* kbase = k_codes + head_row0 * HD;
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
    __syncthreads();

    const int units = T * group;
    for (int un = warp; un < units; un += SPL_WARPS) {
        const int t = un / group;
        const int h = kvh * group + (un - t * group);
        const int pos = positions[t];
        if (c > pos / KEY_BLOCK) continue;  // warp-uniform
        int* qw = sq + warp * QW;
        float* qd = sqd + warp * NB;
        quantize_row_warp<HD>(q + (long long)t * ldq + (long long)h * HD, reinterpret_cast<int8_t*>(qw), qd, lane);
        __syncwarp();
        const long long unit = (long long)t * n_head + h;
        float m = __int_as_float(0xff800000);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int key = lane + 32 * u;
            const int* kr = sk + key * KW;
            float acc = 0.0f;
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                int sumi = 0;
#pragma unroll
                for (int w = 0; w < 8; ++w) sumi = __dp4a(qw[8 * b + w], kr[8 * b + w], sumi);
                acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(qd[b], skd[key * KDS + b]), (float)sumi));
            }
            acc = __fmul_rn(acc, kq_scale);
            const float s = (j0 + key <= pos) ? acc : __int_as_float(0xff800000);
            S[unit * nblk * KEY_BLOCK + j0 + key] = s;
            m = fmaxf(m, s);
        }
        m = warp_max(m);
        if (lane == 0) MC[unit * nblk + c] = m;
        __syncwarp();  // this warp's Q codes are read before the next unit overwrites them
    }
}

// Pass 2: grid (nblk, n_kv), SPL_WARPS warps.
template <int HD>
__device__ __forceinline__ void split_pv_body(
    const int* __restrict__ positions, int T, int n_head, int group,
    const int8_t* __restrict__ v_codes, const float* __restrict__ v_scale, int cap, int nblk,
    const float* __restrict__ S, const float* __restrict__ MC, float* __restrict__ OB,
    float* __restrict__ LS, float* __restrict__ AL)
{
    constexpr int VW = KEY_BLOCK / 4 + 1;
    constexpr int R = HD / 32;
    __shared__ int svt[HD * VW];
    __shared__ float svd[KEY_BLOCK];
    __shared__ int swq[SPL_WARPS * (KEY_BLOCK / 4)];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int c = blockIdx.x, kvh = blockIdx.y;
    const int j0 = c * KEY_BLOCK;
    const long long head_row0 = (long long)kvh * cap;
    stage_v<HD, false>(svt, VW, v_codes + head_row0 * HD, j0, cap, tid, blockDim.x);
    if (tid < KEY_BLOCK) svd[tid] = (j0 + tid < cap) ? v_scale[head_row0 + j0 + tid] : 0.0f;
    __syncthreads();

    const int units = T * group;
    for (int un = warp; un < units; un += SPL_WARPS) {
        const int t = un / group;
        const int h = kvh * group + (un - t * group);
        const int pos = positions[t];
        if (c > pos / KEY_BLOCK) continue;  // warp-uniform
        const long long unit = (long long)t * n_head + h;
        // running max after block c (prefix max of m_0..m_c) and before it (m_0..m_{c-1})
        const float* mrow = MC + unit * nblk;
        float m_new = __int_as_float(0xff800000), m_old = __int_as_float(0xff800000);
#pragma unroll 8
        for (int i = lane; i <= c; i += 32) {
            const float v = mrow[i];
            m_new = fmaxf(m_new, v);
            if (i < c) m_old = fmaxf(m_old, v);
        }
        m_new = warp_max(m_new);
        m_old = warp_max(m_old);
        const float alpha = strata_exp(__fsub_rn(m_old, m_new));
        const float* srow = S + unit * nblk * KEY_BLOCK + j0;
        float p[2], w[2];
        bool valid[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            valid[u] = (j0 + lane + 32 * u) <= pos;
            p[u] = valid[u] ? strata_exp(__fsub_rn(srow[lane + 32 * u], m_new)) : 0.0f;
        }
        float lsum = __fadd_rn(p[0], p[1]);
        lsum = warp_sum(lsum);
#pragma unroll
        for (int u = 0; u < 2; ++u) w[u] = valid[u] ? __fmul_rn(p[u], svd[lane + 32 * u]) : 0.0f;
        const float amax = warp_max(fmaxf(fabsf(w[0]), fabsf(w[1])));
        int8_t wq0 = 0, wq1 = 0;
        float wd = 0.0f;
        if (amax > 0.0f) {
            const float d_inv = q8_inv_scale(amax);
            wq0 = q8_code(w[0], d_inv);
            wq1 = q8_code(w[1], d_inv);
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
            obrow[lane + 32 * r] = __fmul_rn(wd, (float)acc);
        }
        if (lane == 0) {
            LS[unit * nblk + c] = lsum;
            AL[unit * nblk + c] = alpha;
        }
        __syncwarp();
    }
}

// Pass 3: grid (T, n_head), MERGE_G * HD threads: per chunk of CH blocks all of them load the
// block values into shared memory (many loads in flight), then the first HD threads (one per
// output dim) run the ordered chain L = L*alpha + lsum, O = O*alpha + ob.
#define MERGE_G 4
template <int HD>
__device__ __forceinline__ void split_merge_body(
    const int* __restrict__ positions, int n_head, int nblk, const float* __restrict__ OB,
    const float* __restrict__ LS, const float* __restrict__ AL, float* __restrict__ out, long long ldo)
{
    constexpr int CH = 8192 / HD;  // 32 KB of ob per chunk
    __shared__ float sob[CH * HD];
    __shared__ float sa[CH], sl[CH];
    const int t = blockIdx.x, h = blockIdx.y;
    const int tid = threadIdx.x, d = tid % HD, g = tid / HD;
    const int last = positions[t] / KEY_BLOCK;
    const long long unit = (long long)t * n_head + h;
    const float* al = AL + unit * nblk;
    const float* ls = LS + unit * nblk;
    const float* ob = OB + unit * nblk * HD + d;
    float O = 0.0f, L = 0.0f;
    for (int c0 = 0; c0 <= last; c0 += CH) {
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
        }
        __syncthreads();
        if (g == 0) {
            const int n = min(CH, last + 1 - c0);
            for (int i = 0; i < n; ++i) {
                const float a = sa[i];
                L = __fadd_rn(__fmul_rn(L, a), sl[i]);
                O = __fadd_rn(__fmul_rn(O, a), sob[i * HD + d]);
            }
        }
    }
    if (g == 0) out[(long long)t * ldo + (long long)h * HD + d] = O / L;
}

#define ATTEND_SPLIT_KERNELS(HD)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * SPL_WARPS)                                   \
    attend_split_scores_hd##HD(const float* __restrict__ q, long long ldq,                         \
                               const int* __restrict__ positions, int T, int n_head, int group,    \
                               const int8_t* __restrict__ k_codes, const float* __restrict__ k_scale,\
                               int cap, float kq_scale, int nblk, float* __restrict__ S,           \
                               float* __restrict__ MC)                                             \
    {                                                                                              \
        split_scores_body<HD>(q, ldq, positions, T, n_head, group, k_codes, k_scale, cap, kq_scale,\
                              nblk, S, MC);                                                        \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * SPL_WARPS)                                   \
    attend_split_pv_hd##HD(const int* __restrict__ positions, int T, int n_head, int group,        \
                           const int8_t* __restrict__ v_codes, const float* __restrict__ v_scale,  \
                           int cap, int nblk, const float* __restrict__ S,                         \
                           const float* __restrict__ MC, float* __restrict__ OB,                   \
                           float* __restrict__ LS, float* __restrict__ AL)                         \
    {                                                                                              \
        split_pv_body<HD>(positions, T, n_head, group, v_codes, v_scale, cap, nblk, S, MC, OB, LS, AL);\
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MERGE_G * HD)                                     \
    attend_split_merge_hd##HD(const int* __restrict__ positions, int n_head, int nblk,             \
                              const float* __restrict__ OB, const float* __restrict__ LS,          \
                              const float* __restrict__ AL, float* __restrict__ out, long long ldo)\
    {                                                                                              \
        split_merge_body<HD>(positions, n_head, nblk, OB, LS, AL, out, ldo);                       \
    }

ATTEND_SPLIT_KERNELS(64)
ATTEND_SPLIT_KERNELS(128)

extern "C" __device__ int attend_mma_geometry[3] = {MMA_WARPS, MMA_TILE, SPL_WARPS};
