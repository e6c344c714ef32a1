// Causal attention over the KV cache of one layer on tensor cores, the work of each
// 16-query group split between two warps: the prefill kernel attend_pair_hd{64,128}, and
// attend_pair_sinks_window_hd{64,128} with the options (sink logits, a sliding window).
//
// Definition: strata_prefill.contract.attention.attend (docs/numerics.md section 5), bit for bit; written out in
// attention_common.cuh.
//
// attend_pair_hd{64,128}: the prefill kernel with the work of a 16-query group split between two
// warps, so each holds half the registers (O of HD/2 dims, scores of 32 keys) and an SM runs
// twice the warps of a one-warp form (the float epilogue's latencies hide behind other warps).
//   Warp half hh of a pair scores the keys kappa = 2*lambda + hh (lambda = 8 nt + 2 tq + (e & 1),
//   its accumulator (nt, e)). The definition's lsum tree pairs kappa with kappa + 32, + 16, + 8,
//   + 4, + 2 (all of one parity: lambda + 16, + 8, + 4, + 2, + 1 inside the warp, in that
//   order) and only its last level, kappa with kappa + 1, joins the two halves: lsum = u_0 + u_1.
//   The block maximum and amax (exact in any order) are joined the same way. The pair trades
//   them, and its P codes (each warp's codes are one k32 A fragment), through shared memory
//   under a 64-thread named barrier; then each warp runs P.V over all 64 keys (two k-steps) for
//   its HD/2 output dims, in the definition's order per output.
//   Scores: Q.K on fp16 tensor cores (m16n8k16, float32 accumulators), the codes integers and
//   every partial sum an integer below 2^24, so sumf is exact; then two products by dk and dqs.
//   Staging: cp.async into a ring of PAIR_STAGES key blocks (no registers held across the
//   compute); K rows (float16 codes, a pitch of 2 HD + 16 bytes) land at row 32 (kappa & 1) +
//   (kappa >> 1), so each warp's keys are consecutive rows (conflict-free ldmatrix). Q's
//   fragments: ldmatrix of the tile's codes, two k16 steps at a time, read again each block
//   (8 registers instead of 32 held). K fragments: ldmatrix; V fragments: ldmatrix of
//   the cache's transposed V block (v_t, v_blocks.cuh: per dim, the block's keys in the P
//   fragment's k order), HD rows of 64 key bytes at a pitch of 80 (conflict-free), each 8-row
//   matrix one n8 tile's b0 or b1 as the mma reads it, with no byte permute; the n8 tiles of a
//   16-dim group are its even and its odd dims. A thread's K chunks of a key block share one
//   offset and one bound check, the head's row from a division done once. Q has its own shared
//   memory, so the first key blocks are in flight while it is quantized.
//   Per block and row, alpha (skipped while every row of the warp keeps a finite maximum:
//   exp2c(0) = 1) and the two divisions of the P quantization run once a lane, one row each.
// attend_pair_sinks_window_hd{64,128}: the same body with OPT true. A row's state starts at its
//   head's sink (M = sink * LOG2E_F, L = 1.0f) where sinks is not null; with a window (window > 0) a row
//   sees keys lo .. pos (lo = max(pos - window + 1, 0)), the CTA's walk starts at the block of
//   its smallest lo (the blocks before it are never loaded), a pair skips the blocks before both
//   its rows' first, and a row merges the blocks lo/64 .. pos/64 only (live). FULL also needs the
//   block to start at or after both rows' lo. OPT false compiles to the plain kernel's code.
// Compiled with --fmad=false; float steps are written with __fmul_rn / __fadd_rn / __fmaf_rn.

#include <stdint.h>
#include <cuda_fp16.h>
#include "strata_numerics.cuh"  // strata_exp2c, rint_nonneg_magic, row_quantize_warp, q8_*, warp reductions
#include "v_blocks.cuh"         // the transposed V blocks the pair kernel reads
#include "attention_common.cuh"  // the definition, KEY_BLOCK, the shared steps, ATTEND_KERNEL

#ifndef PAIR_QG
#define PAIR_QG 8      // 16-query groups per CTA (two warps each: 64 * PAIR_QG threads)
#endif
#ifndef PAIR_STAGES
#define PAIR_STAGES 2  // key blocks in flight in the cp.async ring
#endif
#ifndef PAIR_MINB
#define PAIR_MINB 1    // __launch_bounds__ minimum CTAs per SM
#endif
static_assert(PAIR_STAGES >= 2, "a ring of at least two key blocks");
#define PAIR_THREADS (64 * PAIR_QG)
#define PAIR_TILE (16 * PAIR_QG)

__device__ __forceinline__ void ldsm_x4(unsigned addr, int& r0, int& r1, int& r2, int& r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// The dynamic shared memory of attend_pair_hd<HD> (bytes), and its parts' offsets.
template <int HD>
struct PairSmem {
    static constexpr int KP = 2 * HD + 16;             // K / Q row pitch (bytes: float16 codes + 16)
    static constexpr int VTP = 80;                     // transposed V row pitch: 64 key bytes + 16
    static constexpr int K_OFF = 0;
    static constexpr int V_OFF = KEY_BLOCK * KP;
    static constexpr int V_BYTES = HD * VTP;
    static constexpr int KS_OFF = V_OFF + V_BYTES;     // k scales, one float a key
    static constexpr int VS_OFF = KS_OFF + KEY_BLOCK * 4;
    static constexpr int STAGE = VS_OFF + KEY_BLOCK * 4;
    static constexpr int RING = PAIR_STAGES * STAGE;
    static constexpr int Q_OFF = RING;                            // the tile's Q codes, rows of KP
    static constexpr int QD_OFF = Q_OFF + PAIR_TILE * KP;         // and dqs, one a row
    static constexpr int XCH_OFF = QD_OFF + PAIR_TILE * 4;
    static constexpr int XM_OFF = XCH_OFF;                       // [QG][2][16] block maxima
    static constexpr int XS_OFF = XM_OFF + PAIR_QG * 2 * 16 * 4;  // [QG][2][16][2] lsum halves, amax
    static constexpr int XP_OFF = XS_OFF + PAIR_QG * 2 * 32 * 4;  // [QG][2][32] int4 P fragments
    static constexpr int POS_OFF = XP_OFF + PAIR_QG * 2 * 32 * 16;
    static constexpr int BYTES = POS_OFF + PAIR_TILE * 4;
    static_assert(STAGE % 16 == 0 && XCH_OFF % 16 == 0, "16-byte aligned parts");
};

template <int HD, bool OPT = false>
__device__ __forceinline__ void attend_pair_body(
    const float* __restrict__ q, long long ldq, const int* __restrict__ positions, int T, int group,
    const uint16_t* __restrict__ k_codes, const float* __restrict__ k_scale,
    const int8_t* __restrict__ /* v_codes: V is read from v_t */, const float* __restrict__ v_scale,
    const int8_t* __restrict__ v_t, int cap,
    float kq2, float* __restrict__ out, long long ldo, const float* __restrict__ sinks = nullptr,
    int window = 0)
{
    using SM = PairSmem<HD>;
    constexpr int NB = HD / 32;  // 32-value parts of a row a lane holds
    constexpr int KS = HD / 16;  // k16 steps of the Q.K product
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
    // the group, dims 0-7 (j < 2) or 8-15 of a k16 step (32 bytes of float16 codes)
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
    // the window: each row's first key lo (0 without one) and block; the CTA's first block c_begin;
    // the pair's first block pfirst (padding rows: none) and largest lo pmaxlo (for FULL)
    const int lo0 = (OPT && window > 0) ? max(pos0 - window + 1, 0) : 0;
    const int lo1 = (OPT && window > 0) ? max(pos1 - window + 1, 0) : 0;
    int c_begin = 0, first0 = 0, first1 = 0, pfirst = 0, pmaxlo = 0;
    if constexpr (OPT) {
        if (window > 0) {
            int minlo = 0x7fffffff;
            for (int i = 0; i < PAIR_TILE; ++i)
                if (spos[i] >= 0) minlo = min(minlo, max(spos[i] - window + 1, 0));
            c_begin = maxpos < 0 ? 0 : minlo / KEY_BLOCK;
            first0 = pos0 < 0 ? 0x7fffffff : lo0 / KEY_BLOCK;
            first1 = pos1 < 0 ? 0x7fffffff : lo1 / KEY_BLOCK;
            pfirst = __reduce_min_sync(0xffffffffu, min(first0, first1));
            pmaxlo = __reduce_max_sync(0xffffffffu, max(lo0, lo1));
        }
    }

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
            constexpr int CH = HD / 8;  // 16-byte chunks of a row of float16 codes
#pragma unroll
            for (int i = 0; i < (KEY_BLOCK * CH + PAIR_THREADS - 1) / PAIR_THREADS; ++i) {
                const int idx = tid + i * PAIR_THREADS;
                if ((KEY_BLOCK * CH) % PAIR_THREADS == 0 || idx < KEY_BLOCK * CH) {
                    const int kap = idx / CH, part = idx % CH;
                    const unsigned dst = st + (32 * (kap & 1) + (kap >> 1)) * KP + 16 * part;
                    const bool ok = j0 + kap < cap;
                    const long long off = ok ? (row0 + kap) * HD + 8 * part : 0;  // float16 elements
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
                cp_async<4>(st + SM::KS_OFF + 4 * row, k_scale + key, ok);
                cp_async<4>(st + SM::VS_OFF + 4 * row, v_scale + key, ok);
            }
            stage_in = (stage_in + 1 == PAIR_STAGES) ? 0 : stage_in + 1;
        }
        cp_async_commit();  // every thread commits a group per block, empty or not
    };

    // the first key blocks are in flight while Q is quantized
#pragma unroll
    for (int s = 0; s < PAIR_STAGES - 1; ++s) issue(c_begin + s);

    // ---- Q of the tile, quantized per row (codes |q| <= 255 as float16, one scale; dqs = dq *
    // kq2) into shared memory, where it stays (its A fragments are read by ldmatrix each block)
    float* sqd = reinterpret_cast<float*>(smem + SM::QD_OFF);
    {
        unsigned short* sq = reinterpret_cast<unsigned short*>(smem + SM::Q_OFF);
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
            float code[NB];
            const float d = row_quantize_warp<NB>(x[i], 255.0f, code);
#pragma unroll
            for (int b = 0; b < NB; ++b) sq[qi * (KP / 2) + 32 * b + lane] = __half_as_ushort(__float2half_rn(code[b]));
            if (lane == 0) sqd[qi] = __fmul_rn(d, kq2);
        }
    }
    __syncthreads();  // the Q tile is written
    const float dq0 = sqd[r0], dq1 = sqd[r1];

    const float NEG_INF = __int_as_float(0xff800000);
    float M0 = NEG_INF, M1 = NEG_INF, L0 = 0.0f, L1 = 0.0f;
    if constexpr (OPT) {
        if (sinks != nullptr) {  // the sink, a key of value zero merged first: M = sink2, L = exp2c(0)
            M0 = M1 = __fmul_rn(sinks[h], LOG2E_F);  // the sink's score in base 2
            L0 = L1 = 1.0f;
        }
    }
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

    int stage_use = 0;  // block c's stage, (c - c_begin) % PAIR_STAGES
    for (int c = c_begin; c < n_blk; ++c) {
        cp_async_wait<PAIR_STAGES - 2>();
        __syncthreads();  // block c is in the ring for every thread; block c - 1's stage is free
        issue(c + PAIR_STAGES - 1);
        if (c > plast || (OPT && c < pfirst)) {  // pair-uniform: none of the pair's queries reaches block c
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
            // kappa = 2 (8 nt + 2 tq + (e & 1)) + hh; sumf exact on the fp16 tensor cores
            // (the Q fragments of two k16 steps are read again from shared memory for each 64
            // bytes of the key rows: 8 registers live instead of the whole row's 32)
            float s[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
            for (int bb = 0; bb < KS / 2; ++bb) {  // 64 bytes of a key row: two k16 steps
                int qa0[4], qa1[4];
                ldsm_x4(q_frag + 64 * bb, qa0[0], qa0[1], qa0[2], qa0[3]);
                ldsm_x4(q_frag + 64 * bb + 32, qa1[0], qa1[1], qa1[2], qa1[3]);
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    const int j = lane >> 3;
                    const unsigned a = st + SM::K_OFF + (32 * hh + 8 * nt + (lane & 7)) * KP + 64 * bb + 16 * j;
                    int kb0, kb1, kb2, kb3;
                    ldsm_x4(a, kb0, kb1, kb2, kb3);
                    mma_f16(s[nt], qa0, kb0, kb1);
                    mma_f16(s[nt], qa1, kb2, kb3);
                }
            }
            auto key = [&](int nt, int e) { return j0 + 2 * (8 * nt + 2 * tq + (e & 1)) + hh; };
            // the window's first keys (NoLow without the options: no test at all)
            auto lo = [&]() {
                if constexpr (OPT) return [&](int k, int e) { return k >= ((e < 2) ? lo0 : lo1); };
                else return NoLow{};
            }();
            float mc0, mc1;
            scale_mask_max<FULL>(s, dq0, dq1, [&](int nt) {
                return *reinterpret_cast<const float2*>(stp + SM::KS_OFF + 4 * (32 * hh + 8 * nt + 2 * tq));
            }, pos0, pos1, key, mc0, mc1, lo);
            if (tq == 0) {
                xm_own[g] = mc0;
                xm_own[g + 8] = mc1;
            }
            named_barrier<64>(bar_id);
            mc0 = fmaxf(mc0, xm_oth[g]);
            mc1 = fmaxf(mc1, xm_oth[g + 8]);
            const float mn0 = fmaxf(M0, mc0), mn1 = fmaxf(M1, mc1);
            float al0, al1;  // alpha = exp2c(M - m_new) of the quad's rows
            row_alpha(M0, M1, mn0, mn1, tq, lane, al0, al1);

            exp_masked<FULL>(s, mn0, mn1, pos0, pos1, key, lo);
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
            }, amax0, amax1, lo);
            if (tq == 0) {
                xs_own[2 * g] = ls0;
                xs_own[2 * g + 1] = amax0;
                xs_own[2 * (g + 8)] = ls1;
                xs_own[2 * (g + 8) + 1] = amax1;
            }
            named_barrier<64>(bar_id);
            {
                const float2 o0 = *reinterpret_cast<const float2*>(xs_oth + 2 * g);
                const float2 o1 = *reinterpret_cast<const float2*>(xs_oth + 2 * (g + 8));
                ls0 = __fadd_rn(ls0, o0.x);
                ls1 = __fadd_rn(ls1, o1.x);
                amax0 = fmaxf(amax0, o0.y);
                amax1 = fmaxf(amax1, o1.y);
            }
            // the P codes (w >= 0: rint_nonneg_magic; a block whose 127/amax is not finite:
            // scale 0, codes 0), packed as this warp's k32 A fragment: k = 4 tq + i <- lambda =
            // 8 (i >> 1) + 2 tq + (i & 1), + 16 for registers 2 and 3
            float di0, di1, wd0, wd1;  // 127 / amax and its inverse of the quad's rows
            p_scales(amax0, amax1, tq, lane, di0, di1, wd0, wd1);
            unsigned cb[4][4];
            p_code_bits(s, di0, di1, cb);
            int pa[2][4];  // k-step 0: the keys of half 0; 1: of half 1
            int frag[4];
            p_fragment(cb, 0, frag);
            const int4 mine = make_int4(frag[0], frag[1], frag[2], frag[3]);
            xp[(qg * 2 + hh) * 32 + lane] = mine;
            named_barrier<64>(bar_id);
            const int4 p0 = xp[(qg * 2) * 32 + lane], p1 = xp[(qg * 2 + 1) * 32 + lane];  // both, no selects
            pa[0][0] = p0.x; pa[0][1] = p0.y; pa[0][2] = p0.z; pa[0][3] = p0.w;
            pa[1][0] = p1.x; pa[1][1] = p1.y; pa[1][2] = p1.z; pa[1][3] = p1.w;

            const bool live0 = FULL || (c <= last0 && (!OPT || c >= first0));
            const bool live1 = FULL || (c <= last1 && (!OPT || c >= first1));
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
                    for (int eo = 0; eo < 2; ++eo) o_step<KEEP>(O[gr][eo], acc[eo], al0, al1, wd0, wd1, live0, live1);
                }
                l_step<KEEP>(L0, L1, al0, al1, ls0, ls1, live0, live1);
            };
            pv_keep_or_rescale(pv, al0, al1);
            M0 = live0 ? mn0 : M0;
            M1 = live1 ? mn1 : M1;
        };
        if (j0 + KEY_BLOCK - 1 <= pminpos && (!OPT || j0 >= pmaxlo)) block(BoolTag<true>{});
        else block(BoolTag<false>{});
    }
    cp_async_wait<0>();  // nothing in flight at exit

    // O[gr][0][0..1] are dims 16 G + 4 tq + {0, 2}, O[gr][1][0..1] dims 16 G + 4 tq + {1, 3} (row r0)
    store_out<HD, NG, 4>(out, ldo, T, h, t0 + r0, t0 + r1, L0, L1, [&](int gr) { return 16 * (hh * NG + gr) + 4 * tq; },
                         [&](int gr, int k) { return O[gr][k & 1][k >> 1]; });
}

ATTEND_KERNEL(pair, 64, PAIR_THREADS, PAIR_MINB)
ATTEND_KERNEL(pair, 128, PAIR_THREADS, PAIR_MINB)
ATTEND_KERNEL_SINKS_WINDOW(pair, 64, PAIR_THREADS, PAIR_MINB)
ATTEND_KERNEL_SINKS_WINDOW(pair, 128, PAIR_THREADS, PAIR_MINB)

// dynamic shared memory bytes of attend_pair_hd64 / _hd128, and the CTA's queries and threads
extern "C" __device__ int attend_pair_geometry[4] = {PairSmem<64>::BYTES, PairSmem<128>::BYTES, PAIR_TILE,
                                                     PAIR_THREADS};
