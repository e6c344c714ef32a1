// Causal attention over the KV cache of one layer on Hopper's warpgroup tensor cores (wgmma):
// the prefill kernel attend_wgmma_hd{64,128}, and attend_wgmma_sinks_window_hd{64,128} with the
// options (sink logits, a sliding window). sm_90a only (fast/cuda/kernel_paths.py ARCH_SPECIFIC).
//
// Definition: strata_prefill.contract.attention.attend (docs/numerics.md section 5), bit for bit;
// written out in attention_common.cuh.
//
// A CTA takes 64 * WG_GROUPS queries of one head and one producer warpgroup. Consumer warpgroup
// w (128 threads) owns 64 of the queries, each of its warps 16 rows and a thread two (r0 = g,
// r1 = g + 8 of its warp's 16), as the wgmma accumulator layout hands them out.
//   The ring: the producer warpgroup stages key blocks by cp.async into WG_STAGES stages; it
//     waits for a stage's "empty" mbarrier (every consumer thread arrives once it is done with
//     the block), and once its copies of a block are complete and fenced for the async proxy it
//     arrives on the stage's "full" mbarrier, which the consumers wait for. So the warpgroups
//     walk the blocks apart, not in lockstep behind a CTA barrier. The producer keeps 24
//     registers (setmaxnreg) and hands the rest to the consumers.
//   Per key block a consumer warpgroup runs:
//   Q.K: wgmma m64n64k16 (fp16 codes, f32 accumulators; every partial sum an integer below 2^24,
//     so sumf is exact in any order), A = the warpgroup's Q codes, B = the block's K rows, both
//     from shared memory; then two float products by dk and dqs.
//   The key order: shared K row n holds the block's key sigma(n) = 16 (n >> 4) + 4 ((n >> 1) & 3)
//     + 2 (n & 1) + ((n >> 3) & 1), so accumulator (nt, e) of lane quad tq holds key
//     16 (nt >> 1) + 4 tq + 2 (e & 1) + (nt & 1). The definition's lsum tree (l with l + 32, 16,
//     8, 4, 2, 1) is then nt with nt + 4, nt with nt + 2, lanes xor 2, lanes xor 1, e with e ^ 1,
//     nt with nt ^ 1; and a lane's P codes of k-step ks (keys of parity ks) are exactly the ones
//     the transposed V blocks (v_blocks.cuh: vt_slot) pair with its A fragment's columns, so
//     P.V needs no exchange between lanes. The block maximum and amax are quad reductions.
//   P.V: wgmma m64n{HD}k32 s8, A = the P codes from registers, B = the block's transposed V rows
//     (v_t: one row a dim, in vt_row order) from shared memory, sums from zero; I2F gives each
//     exact sum as a float; then O = fma(dw, pvf, O * alpha).
// Shared memory holds Q, K and V^T in the no-swizzle core-matrix layout (8 rows of 16 bytes
// contiguous; LBO 128 bytes between a row group's core matrices along K, SBO between row groups).
// Options (OPT true): as attention_pair.cu's (a row's state starts at its head's sink; with a window
// the CTA's walk starts at the block of its smallest lo, a warpgroup skips blocks outside all its
// rows' windows, a row merges the blocks lo/64 .. pos/64 only). Every branch around a wgmma is
// uniform over the warpgroup.
// Compiled with --fmad=false; float steps are written with __fmul_rn / __fadd_rn / __fmaf_rn.

#include <stdint.h>
#include <cuda_fp16.h>
#include "strata_numerics.cuh"   // strata_exp2c, rint_nonneg_magic, row_quantize_warp, q8_*, warp reductions
#include "v_blocks.cuh"          // the transposed V blocks P.V reads
#include "attention_common.cuh"  // the definition, KEY_BLOCK, the shared steps, ATTEND_KERNEL
#include "wgmma.cuh"             // wgmma, its fences and descriptors, the core-matrix layout

#ifndef WG_GROUPS
#define WG_GROUPS 3  // consumer warpgroups per CTA, 64 queries each
#endif
#ifndef WG_STAGES
#define WG_STAGES 3  // key blocks in the ring
#endif
static_assert(WG_STAGES >= 2, "a ring of at least two key blocks");
#define WG_CONSUMERS (128 * WG_GROUPS)
#define WG_THREADS (WG_CONSUMERS + 128)  // the consumer warpgroups and a producer warpgroup
// registers a thread: the producer gives its share to the consumers (setmaxnreg), within 64K
#define WG_PRODUCER_REGS 24
#define WG_CONSUMER_REGS ((65536 / 128 - WG_PRODUCER_REGS) / WG_GROUPS / 8 * 8 > 240 ? 240 : (65536 / 128 - WG_PRODUCER_REGS) / WG_GROUPS / 8 * 8)
#define WG_TILE (64 * WG_GROUPS)

// mbarriers of the ring (shared::cta): init with an arrival count, arrive (release), wait for a phase
__device__ __forceinline__ void mbar_init(unsigned a, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned a)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned a, int parity)
{
    asm volatile("{\n.reg .pred P1;\nLAB_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                 "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(a), "r"(parity) : "memory");
}

// The block's key held by shared K row n (and by scale slot n); see the header.
__device__ __forceinline__ int wg_sigma(int n) { return 16 * (n >> 4) + 4 * ((n >> 1) & 3) + 2 * (n & 1) + ((n >> 3) & 1); }

// d = A.B + d over one k16 step: A 64x16 f16 (the warpgroup's Q rows), B 16x64 f16 (K rows),
// both K-major in shared memory; d[i][j]: n8 tile i, the mma.sync accumulator order
__device__ __forceinline__ void wgmma_qk_f16(float (&d)[8][4], uint64_t a_desc, uint64_t b_desc, int accumulate)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

// The dynamic shared memory of attend_wgmma_hd<HD> (bytes), and its parts' offsets.
template <int HD>
struct WgSmem {
    static constexpr int QK_ROWB = 2 * HD;                 // a Q or K row: HD float16 codes
    static constexpr int K_OFF = 0;                        // 64 K rows, core-matrix layout
    static constexpr int V_OFF = KEY_BLOCK * QK_ROWB;      // HD transposed V rows of 64 bytes
    static constexpr int KS_OFF = V_OFF + HD * KEY_BLOCK;  // k scales, slot n: key sigma(n)
    static constexpr int VS_OFF = KS_OFF + KEY_BLOCK * 4;  // v scales, likewise
    static constexpr int STAGE = VS_OFF + KEY_BLOCK * 4;
    static constexpr int Q_OFF = WG_STAGES * STAGE;        // the tile's Q codes, core-matrix layout
    static constexpr int QD_OFF = Q_OFF + WG_TILE * QK_ROWB;  // dqs, one a row
    static constexpr int POS_OFF = QD_OFF + WG_TILE * 4;
    static constexpr int BAR_OFF = POS_OFF + WG_TILE * 4;  // WG_STAGES "full" then "empty" mbarriers
    static constexpr int BYTES = BAR_OFF + 2 * WG_STAGES * 8;
    static_assert(STAGE % 128 == 0 && Q_OFF % 128 == 0, "aligned parts");
};

template <int HD, bool OPT = false>
__device__ __forceinline__ void attend_wgmma_body(
    const float* __restrict__ q, long long ldq, const int* __restrict__ positions, int T, int group,
    const uint16_t* __restrict__ k_codes, const float* __restrict__ k_scale,
    const int8_t* __restrict__ /* v_codes: V is read from v_t */, const float* __restrict__ v_scale,
    const int8_t* __restrict__ v_t, int cap,
    float kq2, float* __restrict__ out, long long ldo, const float* __restrict__ sinks = nullptr,
    int window = 0)
{
    using SM = WgSmem<HD>;
    constexpr int NB = HD / 32;   // 32-value parts of a row a lane holds (Q's quantization)
    constexpr int KS = HD / 16;   // k16 steps of Q.K
    constexpr int NO = HD / 8;    // n8 tiles of P.V's output
    constexpr int QK_SBO = 8 * SM::QK_ROWB;
    constexpr int V_SBO = 8 * KEY_BLOCK;
    extern __shared__ __align__(128) unsigned char smem[];
    int* spos = reinterpret_cast<int*>(smem + SM::POS_OFF);
    const unsigned base = smem_u32(smem);

    const int tid = threadIdx.x;
    const int wg = min(tid >> 7, WG_GROUPS - 1);  // the warpgroup (the producer: the last one's rows, unused)
    const int warp = (tid >> 5) & 3; // its warp
    const int lane = tid & 31;
    const int g = lane >> 2;
    const int tq = lane & 3;
    const int h = blockIdx.y;
    const long long t0 = (long long)(gridDim.x - 1 - blockIdx.x) * WG_TILE;  // heaviest first

    if (tid < WG_TILE) spos[tid] = (t0 + tid < T) ? positions[t0 + tid] : -1;
    if (tid == 0) {
        for (int s = 0; s < WG_STAGES; ++s) {
            mbar_init(base + SM::BAR_OFF + 8 * s, 128);                           // full: the producer's threads
            mbar_init(base + SM::BAR_OFF + 8 * (WG_STAGES + s), WG_CONSUMERS);  // empty: every consumer thread
        }
    }
    __syncthreads();
    const int r0 = wg * 64 + warp * 16 + g, r1 = r0 + 8;  // the thread's tile rows
    int maxpos = -1;
    for (int i = 0; i < WG_TILE; ++i) maxpos = max(maxpos, spos[i]);
    const int n_blk = maxpos < 0 ? 0 : maxpos / KEY_BLOCK + 1;
    // the warpgroup's last block and smallest position (-1 with padding rows): uniform over it
    int wmax = -1, wmin = 0x7fffffff;
    for (int i = 0; i < 64; ++i) {
        wmax = max(wmax, spos[wg * 64 + i]);
        wmin = min(wmin, spos[wg * 64 + i]);
    }
    const int wlast = wmax < 0 ? -1 : wmax / KEY_BLOCK;
    const int pos0 = spos[r0], pos1 = spos[r1];
    const int last0 = pos0 < 0 ? -1 : pos0 / KEY_BLOCK;
    const int last1 = pos1 < 0 ? -1 : pos1 / KEY_BLOCK;
    // the window: each row's first key lo and block; the CTA's first block c_begin; the
    // warpgroup's first block wfirst (padding rows: none) and largest lo wmaxlo (for FULL)
    const int lo0 = (OPT && window > 0) ? max(pos0 - window + 1, 0) : 0;
    const int lo1 = (OPT && window > 0) ? max(pos1 - window + 1, 0) : 0;
    int c_begin = 0, first0 = 0, first1 = 0, wfirst = 0, wmaxlo = 0;
    if constexpr (OPT) {
        if (window > 0) {
            int minlo = 0x7fffffff;
            for (int i = 0; i < WG_TILE; ++i)
                if (spos[i] >= 0) minlo = min(minlo, max(spos[i] - window + 1, 0));
            c_begin = maxpos < 0 ? 0 : minlo / KEY_BLOCK;
            first0 = pos0 < 0 ? 0x7fffffff : lo0 / KEY_BLOCK;
            first1 = pos1 < 0 ? 0x7fffffff : lo1 / KEY_BLOCK;
            int wminlo = 0x7fffffff;
            for (int i = 0; i < 64; ++i) {
                const int p = spos[wg * 64 + i];
                if (p >= 0) {
                    const int l = max(p - window + 1, 0);
                    wminlo = min(wminlo, l);
                    wmaxlo = max(wmaxlo, l);
                }
            }
            wfirst = wminlo == 0x7fffffff ? 0x7fffffff : wminlo / KEY_BLOCK;
        }
    }

    // key block c -> ring stage (c - c_begin) % WG_STAGES; K row n and scale slot n hold the
    // block's key sigma(n); the transposed V block is one contiguous run of HD * 64 bytes.
    // Producer thread lt of NL copies every NL-th 16-byte chunk; eight consecutive threads fill
    // one core matrix (128 contiguous bytes: no bank conflict).
    const int kvh = blockIdx.y / group;
    constexpr int NL = 128;  // the producer warpgroup's threads
    auto issue = [&](int c, int stage, int lt) {
        if (c < n_blk) {
            const int j0 = c * KEY_BLOCK;
            const long long row0 = (long long)kvh * cap + j0;
            const unsigned st = base + (unsigned)(stage * SM::STAGE);
            constexpr int CH = HD / 8;  // 16-byte chunks of a K row
#pragma unroll 1  // no addresses hoisted out of the walk: the producer keeps few registers
            for (int i = 0; i < (KEY_BLOCK * CH + NL - 1) / NL; ++i) {
                const int idx = lt + i * NL;
                if ((KEY_BLOCK * CH) % NL == 0 || idx < KEY_BLOCK * CH) {
                    const int n = idx % KEY_BLOCK, part = idx / KEY_BLOCK;
                    const int kap = wg_sigma(n);
                    const bool ok = j0 + kap < cap;
                    const long long off = ok ? (row0 + kap) * HD + 8 * part : 0;  // float16 elements
                    cp_async<16>(st + SM::K_OFF + cm_off<SM::QK_ROWB>(n, part), k_codes + off, ok);
                }
            }
            const int8_t* vb = v_t + ((long long)kvh * vt_blocks(cap) + c) * (HD * 64);
#pragma unroll 1
            for (int i = 0; i < (HD * 4 + NL - 1) / NL; ++i) {
                const int idx = lt + i * NL;
                if ((HD * 4) % NL == 0 || idx < HD * 4) {
                    const int n = idx % HD, part = idx / HD;
                    cp_async<16>(st + SM::V_OFF + cm_off<KEY_BLOCK>(n, part), vb + n * 64 + 16 * part, true);
                }
            }
#pragma unroll 1
            for (int i = 0; i < (KEY_BLOCK + NL - 1) / NL; ++i) {
                const int n = lt + i * NL;
                if (KEY_BLOCK % NL == 0 || n < KEY_BLOCK) {
                    const int kap = wg_sigma(n);
                    const bool ok = j0 + kap < cap;
                    const long long key = ok ? row0 + kap : 0;
                    cp_async<4>(st + SM::KS_OFF + 4 * n, k_scale + key, ok);
                    cp_async<4>(st + SM::VS_OFF + 4 * n, v_scale + key, ok);
                }
            }
        }
        cp_async_commit();  // a group per block, empty or not
    };
    const unsigned bar_full = base + SM::BAR_OFF, bar_empty = bar_full + 8 * WG_STAGES;

    if (tid >= WG_CONSUMERS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WG_PRODUCER_REGS));
        const int pt = tid - WG_CONSUMERS;
        // ---- the producer warpgroup: block i of the walk into stage i % WG_STAGES once every
        // consumer warpgroup released its previous use; its copies complete (cp.async groups, in
        // order), fenced for wgmma's proxy, before the stage's "full" barrier hears of them
        for (int c = c_begin, i = 0; c < n_blk; ++c, ++i) {
            const int stg = i % WG_STAGES;
            if (i >= WG_STAGES) mbar_wait(bar_empty + 8 * stg, (i / WG_STAGES - 1) & 1);
            issue(c, stg, pt);
            if (i >= WG_STAGES - 2) {
                cp_async_wait<WG_STAGES - 2>();
                fence_proxy_async();
                mbar_arrive(bar_full + 8 * ((i - (WG_STAGES - 2)) % WG_STAGES));
            }
        }
        cp_async_wait<0>();
        fence_proxy_async();
        for (int i = max(n_blk - c_begin - (WG_STAGES - 2), 0); i < n_blk - c_begin; ++i) mbar_arrive(bar_full + 8 * (i % WG_STAGES));
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WG_CONSUMER_REGS));
    // ---- Q of the tile, quantized per row (codes |q| <= 255 as float16, one scale; dqs = dq *
    // kq2) into shared memory in the core-matrix layout, 8 rows a warp at a time
    float* sqd = reinterpret_cast<float*>(smem + SM::QD_OFF);
    {
        unsigned char* sq = smem + SM::Q_OFF;
        constexpr int ROWS = WG_TILE / (WG_CONSUMERS / 32);  // rows a warp quantizes
        const int wq = tid >> 5;
#pragma unroll 1
        for (int i0 = 0; i0 < ROWS; i0 += 8) {
            float x[8][NB];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const long long t = t0 + wq * ROWS + i0 + i;
#pragma unroll
                for (int b = 0; b < NB; ++b) x[i][b] = (t < T) ? q[t * ldq + (long long)h * HD + 32 * b + lane] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int qi = wq * ROWS + i0 + i;
                float code[NB];
                const float d = row_quantize_warp<NB>(x[i], 255.0f, code);
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    const int dim = 32 * b + lane;
                    *reinterpret_cast<unsigned short*>(sq + cm_off<SM::QK_ROWB>(qi, dim >> 3) + 2 * (dim & 7)) =
                        __half_as_ushort(__float2half_rn(code[b]));
                }
                if (lane == 0) sqd[qi] = __fmul_rn(d, kq2);
            }
        }
    }
    fence_proxy_async();
    named_barrier<WG_CONSUMERS>(1);  // the Q tile is written, and visible to wgmma
    const float dq0 = sqd[r0], dq1 = sqd[r1];
    const unsigned q_base = base + SM::Q_OFF + (unsigned)(wg * 8 * QK_SBO);  // the warpgroup's 64 rows

    const float NEG_INF = __int_as_float(0xff800000);
    float M0 = NEG_INF, M1 = NEG_INF, L0 = 0.0f, L1 = 0.0f;
    if constexpr (OPT) {
        if (sinks != nullptr) {  // the sink, a key of value zero merged first: M = sink2, L = exp2c(0)
            M0 = M1 = __fmul_rn(sinks[h], LOG2E_F);
            L0 = L1 = 1.0f;
        }
    }
    float O[NO][4];
#pragma unroll
    for (int i = 0; i < NO; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) O[i][e] = 0.0f;

    // The warpgroup's blocks are c_first .. c_last (some of its queries reach each: uniform over it); the
    // others of the walk it only waits for and releases, in order.
    const int c_first = OPT ? max(c_begin, wfirst) : c_begin;
    const int c_last = min(n_blk - 1, wlast);
    // block c of the walk: its ring stage, and the wait for it
    auto stage_of = [&](int c) { return (c - c_begin) % WG_STAGES; };
    auto wait_full = [&](int c) { mbar_wait(bar_full + 8 * stage_of(c), ((c - c_begin) / WG_STAGES) & 1); };
    auto release = [&](int c) { mbar_arrive(bar_empty + 8 * stage_of(c)); };  // the warpgroup's reads are done
    // Q.K of block c into s, issued (a wgmma group), not waited for
    auto qk_issue = [&](int c, float (&s)[8][4]) {
        const unsigned st = base + (unsigned)(stage_of(c) * SM::STAGE);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
            wgmma_qk_f16(s, wg_desc(q_base + 256 * ks, QK_SBO), wg_desc(st + SM::K_OFF + 256 * ks, QK_SBO), ks > 0);
        wgmma_commit();
    };
    // the rest of block c once its scores s are in: softmax, P codes, P.V, O and L
    auto finish = [&](int c, float (&s)[8][4], auto full_tag) {
        const int j0 = c * KEY_BLOCK;
        constexpr bool FULL = decltype(full_tag)::value;
        const unsigned st = base + (unsigned)(stage_of(c) * SM::STAGE);
        const unsigned char* stp = smem + stage_of(c) * SM::STAGE;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) reg_fence(s[nt][e]);

        auto key = [&](int nt, int e) { return j0 + 16 * (nt >> 1) + 4 * tq + 2 * (e & 1) + (nt & 1); };
        auto lo = [&]() {
            if constexpr (OPT) return [&](int k, int e) { return k >= ((e < 2) ? lo0 : lo1); };
            else return NoLow{};
        }();
        float mc0, mc1;
        scale_mask_max<FULL>(s, dq0, dq1, [&](int nt) {
            return *reinterpret_cast<const float2*>(stp + SM::KS_OFF + 4 * (8 * nt + 2 * tq));
        }, pos0, pos1, key, mc0, mc1, lo);
        const float mn0 = fmaxf(M0, mc0), mn1 = fmaxf(M1, mc1);
        float al0, al1;  // alpha = exp2c(M - m_new) of the quad's rows
        row_alpha(M0, M1, mn0, mn1, tq, lane, al0, al1);
        exp_masked<FULL>(s, mn0, mn1, pos0, pos1, key, lo);
        // the lsum tree: + 32 (nt, nt + 4), + 16 (nt, nt + 2), + 8 (lanes xor 2), + 4 (xor 1),
        // + 2 (e, e ^ 1), + 1 (nt 0, 1)
        float u[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                u[nt][e] = __fadd_rn(__fadd_rn(s[nt][e], s[nt + 4][e]), __fadd_rn(s[nt + 2][e], s[nt + 6][e]));
                u[nt][e] = __fadd_rn(u[nt][e], __shfl_xor_sync(0xffffffffu, u[nt][e], 2));
                u[nt][e] = __fadd_rn(u[nt][e], __shfl_xor_sync(0xffffffffu, u[nt][e], 1));
            }
        const float ls0 = __fadd_rn(__fadd_rn(u[0][0], u[0][1]), __fadd_rn(u[1][0], u[1][1]));
        const float ls1 = __fadd_rn(__fadd_rn(u[0][2], u[0][3]), __fadd_rn(u[1][2], u[1][3]));
        float amax0, amax1;
        fold_v_scale<FULL>(s, pos0, pos1, key, [&](int nt) {
            return *reinterpret_cast<const float2*>(stp + SM::VS_OFF + 4 * (8 * nt + 2 * tq));
        }, amax0, amax1, lo);
        float di0, di1, wd0, wd1;
        p_scales(amax0, amax1, tq, lane, di0, di1, wd0, wd1);
        unsigned cb[8][4];
        p_code_bits(s, di0, di1, cb);
        // k-step ks's A fragment: column 4 tq + i holds key 16 (i >> 1) + 4 tq + 2 (i & 1) + ks
        // (accumulator nt = 2 (i >> 1) + ks, e = i & 1), + 32 for registers 2 and 3
        int pa[2][4];
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            pa[ks][0] = pack_lo(cb[ks][0], cb[ks][1], cb[2 + ks][0], cb[2 + ks][1]);
            pa[ks][1] = pack_lo(cb[ks][2], cb[ks][3], cb[2 + ks][2], cb[2 + ks][3]);
            pa[ks][2] = pack_lo(cb[4 + ks][0], cb[4 + ks][1], cb[6 + ks][0], cb[6 + ks][1]);
            pa[ks][3] = pack_lo(cb[4 + ks][2], cb[4 + ks][3], cb[6 + ks][2], cb[6 + ks][3]);
        }
        int acc[NO][4];  // from zero (scale-d 0 on the first k-step)
        wgmma_fence();
        wgmma_s8_ra(acc, pa[0], wg_desc(st + SM::V_OFF, V_SBO), 0);
        wgmma_s8_ra(acc, pa[1], wg_desc(st + SM::V_OFF + 256, V_SBO), 1);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < NO; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) reg_fence(acc[i][e]);

        const bool live0 = FULL || (c <= last0 && (!OPT || c >= first0));
        const bool live1 = FULL || (c <= last1 && (!OPT || c >= first1));
        pv_keep_or_rescale([&](auto keep_tag) {
            constexpr bool KEEP = decltype(keep_tag)::value;
#pragma unroll
            for (int i = 0; i < NO; ++i) {
                // I2F, exact (|P.V| < 2^21), on the conversion pipe: one issue slot, where MAGIC_I
                // accumulators took a move and a subtraction on the float pipe
                const float pv[4] = {__int2float_rn(acc[i][0]), __int2float_rn(acc[i][1]), __int2float_rn(acc[i][2]),
                                     __int2float_rn(acc[i][3])};
                o_step_f<KEEP>(O[i], pv, al0, al1, wd0, wd1, live0, live1);
            }
            l_step<KEEP>(L0, L1, al0, al1, ls0, ls1, live0, live1);
        }, al0, al1);
        M0 = live0 ? mn0 : M0;
        M1 = live1 ? mn1 : M1;
    };
    // FULL (no masks) is uniform over the warpgroup: the wgmma calls are in both branches
    auto finish_block = [&](int c, float (&s)[8][4]) {
        if (c * KEY_BLOCK + KEY_BLOCK - 1 <= wmin && (!OPT || c * KEY_BLOCK >= wmaxlo)) finish(c, s, BoolTag<true>{});
        else finish(c, s, BoolTag<false>{});
        release(c);
    };

    for (int c = c_begin; c < min(c_first, n_blk); ++c) {
        wait_full(c);
        release(c);
    }
    if (c_first <= c_last) {
        float sc[8][4];
        for (int c = c_first; c <= c_last; ++c) {
            wait_full(c);
            qk_issue(c, sc);
            wgmma_wait<0>();
            finish_block(c, sc);
        }
    }
    for (int c = max(c_last + 1, c_first); c < n_blk; ++c) {
        wait_full(c);
        release(c);
    }
    // output column n of P.V is transposed-V row n, dim 16 (n >> 4) + 2 (n & 7) + ((n >> 3) & 1):
    // tile i = 2 G + eo holds dims 16 G + 4 tq + 2 (e & 1) + eo
    store_out<HD, HD / 16, 4>(out, ldo, T, h, t0 + r0, t0 + r1, L0, L1, [&](int gr) { return 16 * gr + 4 * tq; },
                              [&](int gr, int k) { return O[2 * gr + (k & 1)][k >> 1]; });
}

ATTEND_KERNEL(wgmma, 64, WG_THREADS, 1)
ATTEND_KERNEL(wgmma, 128, WG_THREADS, 1)
ATTEND_KERNEL_SINKS_WINDOW(wgmma, 64, WG_THREADS, 1)
ATTEND_KERNEL_SINKS_WINDOW(wgmma, 128, WG_THREADS, 1)

// dynamic shared memory bytes of attend_wgmma_hd64 / _hd128, and the CTA's queries and threads
extern "C" __device__ int attend_wgmma_geometry[4] = {WgSmem<64>::BYTES, WgSmem<128>::BYTES, WG_TILE, WG_THREADS};
