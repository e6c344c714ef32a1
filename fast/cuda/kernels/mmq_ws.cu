// Grouped MMQ products on int8 tensor cores, warp-specialized (issue 27): producer warps stage and
// decode, consumer warps only multiply.
//
// Definition: strata.mmq.mmq_prepared (strata.mmq.mmq for raw weight rows) (docs/numerics.md
// section 3), exactly as fast/cuda/kernels/mmq.cu: every output element is
//   acc = 0.0f; for each 32-value block b of the weight row, ascending:
//     acc = acc + <the type's epilogue>(dw, da, sumi [, mw, sa, mi])
// with sumi exact integers from the tensor cores, the same per-element float operations in the
// same order as mmq.cu (its decode_unit, epi_one, epi_split and products body are copied here
// verbatim for now, marked below; the merge with mmq.cu comes after the A/B). Compiled with
// --fmad=false. The output bytes are mmq.cu's, for every tile edge and configuration
// (verify/test_mmq_ws_cuda.py checks them against mmq.cu's tile-list kernel and strata.mmq).
//
// Launch: mmq.cu's tile-list form only (tiles != NULL; bounds, n_exp, w_stride, tile_rows unused;
// a launch without tiles writes nothing), with the 16 parameters mmq.cu took before its MmqArgs
// struct (fast/cuda/products_ws.py packs them by name from this file's own signature), so that
// fast/cuda/products_ws.py mmq_tiles_ws takes what products.mmq_tiles takes. The block is
// MMQ_NT threads (mmq_ws_geometry[2]); under MMQ_WS_MAXREG the register cap must fit them (the
// static_assert on MMQ_WS_REG_CAP below). Entry i of tiles
// (int4) is activation rows [x, y) (y - x <= MMQ_BN) of one expert whose matrix starts at
// w + (z | (long long)w << 32); CTA tile t multiplies entry t / ceil(N / MMQ_BM) with weight-row
// tile t % ceil(N / MMQ_BM); gridDim.y = 2 multiplies the pair (w + w_pair into out2). A CTA
// walks tiles blockIdx.x, + gridDim.x, ... (persistent when the grid is smaller than the tile
// count): which CTA computes an element never changes its arithmetic. Up to 15 bytes are read
// before a matrix's first row and after its last one (16-byte pieces), as mmq.cu does.
//
// Roles (MMQ_NC = MMQ_WM * MMQ_WN consumer warps, then MMQ_WS_PW producer warps):
// - producers: per K chunk of 128 values (CTA-wide chunk index g over all of its tiles), the raw
//   weight bytes go by cp.async into a producer-private ring of MMQ_WS_RS slots and the
//   activation blocks straight into decoded stage g % MMQ_WS_DS, MMQ_WS_LA chunks ahead; then
//   the weights are decoded to int8 codes + float scales and the activation scales read out, into
//   the same stage; the stage is published with bar.arrive FULL[s].
// - consumers: bar.sync FULL[s]; ldmatrix + mma.sync m16n8k32 (k16 pairs for the split types)
//   + the contract's epilogue over the stage's 4 blocks; bar.arrive EMPTY[s]. Outputs are stored
//   at each tile's end. No CTA-wide barrier anywhere in the main loop.
// Named barriers (bar.sync / bar.arrive with counts, never __syncthreads in the loop): id 1 the
// producers among themselves (all their copies of chunk g landed; all of them done with chunk
// g - 1's raw slot), 2 + s FULL[s] and 2 + DS + s EMPTY[s] (count: every thread of the CTA);
// the producer drains the EMPTY arrivals of the last DS chunks before it exits, so no barrier is
// left half-arrived. DS >= LA + 2 keeps the producer off the consumers' heels (it fills stage
// g + LA, freed by chunk g + LA - DS <= g - 2, while the consumers multiply chunk g - 1); RS >=
// LA + 1 raw slots (2 at least: with LA 0 a chunk is copied while the others still decode the last).

#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>
#include "strata_numerics.cuh"  // MAGIC_I, MAGIC_F
// QT_*, LAYOUT_*, TAB_*, QFormat<QT> and MMQ_KERNELS: written from strata/qformats.py at compile
// time (fast/cuda/generated.py), as in mmq.cu.
#include "qformats.cuh"

// consumer warps MMQ_WM x MMQ_WN, each 16 weight rows x NT8 n8 tiles, as mmq.cu
#ifndef MMQ_WM
#define MMQ_WM 4
#endif
#ifndef MMQ_WN
#define MMQ_WN 2
#endif
#ifndef MMQ_BN
#define MMQ_BN 128
#endif
// producer warps
#ifndef MMQ_WS_PW
#define MMQ_WS_PW 2
#endif
// chunks the producers copy ahead of the one they decode
#ifndef MMQ_WS_LA
#define MMQ_WS_LA 1
#endif
// decoded stages (activation blocks, int8 weight codes, weight and activation scales)
#ifndef MMQ_WS_DS
#define MMQ_WS_DS (MMQ_WS_LA + 2)
#endif
// raw weight slots of the producers' ring (at least 2)
#ifndef MMQ_WS_RS
#define MMQ_WS_RS (MMQ_WS_LA > 0 ? MMQ_WS_LA + 1 : 2)
#endif
// CTAs per SM asked of the compiler (__launch_bounds__ min blocks): caps registers per thread;
// MMQ_WS_MAXREG (if set, > 0) caps them directly instead (__maxnreg__)
#ifndef MMQ_MINB
#define MMQ_MINB 1
#endif
#ifndef MMQ_WS_MAXREG
#define MMQ_WS_MAXREG 0
#endif
#if MMQ_WS_MAXREG > 0
#define MMQ_WS_BOUNDS __maxnreg__(MMQ_WS_MAXREG)
#else
#define MMQ_WS_BOUNDS __launch_bounds__(MMQ_NT, MMQ_MINB)
#endif
static_assert(MMQ_WS_DS >= MMQ_WS_LA + 2, "MMQ_WS_DS >= MMQ_WS_LA + 2");
static_assert(MMQ_WS_RS >= MMQ_WS_LA + 1 && MMQ_WS_RS >= 2, "MMQ_WS_RS >= max(MMQ_WS_LA + 1, 2)");
static_assert(2 + 2 * MMQ_WS_DS <= 16, "named barriers: 2 + 2 * MMQ_WS_DS ids of 16");
#define MMQ_NC (MMQ_WM * MMQ_WN)
#define MMQ_NT (32 * (MMQ_NC + MMQ_WS_PW))
// The launch's register check (the driver's, cuda_occupancy.h cudaOccMaxBlocksPerSMRegsLimit):
// registers go to warps in units of 256 (8 a thread), and the hardware counts a CTA's warps
// rounded up to the SM's 4 sub-partitions: regs-per-warp x roundup(warps, 4) <= 65536, else every
// launch fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES ("too many resources requested"). With
// __launch_bounds__ ptxas keeps to it; a __maxnreg__ cap must: 10 warps (8 + 2) allow 168 a
// thread (200 x 32 x 12 = 76800 > 65536: the first form's failure), 20 warps 96.
#define MMQ_WS_WARPS4 (((MMQ_NT / 32) + 3) / 4 * 4)
#define MMQ_WS_REG_CAP ((65536 / MMQ_WS_WARPS4 / 32) / 8 * 8)
#ifndef MMQ_WS_UNCHECKED  // dev/ws_probe.py builds the failing form on purpose, to show the driver refuse it
static_assert(MMQ_WS_MAXREG <= MMQ_WS_REG_CAP,
              "MMQ_WS_MAXREG over what MMQ_NT threads may hold at launch (MMQ_WS_REG_CAP): every launch would fail");
#endif
#define MMQ_PT (32 * MMQ_WS_PW)
#define MMQ_BM (16 * MMQ_WM)
#define MMQ_NT8 (MMQ_BN / (8 * MMQ_WN))
#define MMQ_MAX_EXP 16
#define MMQ_SMEM_MAX (232448 - 1024)
static_assert(MMQ_NT8 % 2 == 0, "need an even number of n8 tiles per warp");

// ---- copied from fast/cuda/kernels/mmq.cu (HEAD 924b689) until the merge: Tr, the PTX helpers,
// ---- the decode helpers, decode_unit, epi_one, epi_split. Unchanged.
template <int QT> struct Tr;
// The format's facts (QFormat: BS, VPB, LAY, TAB, HALF_*, DW_FACTOR), and what only this kernel
// knows of it: SPLIT, the two 16-value halves need separate sums; NAUX, float weight scales
// besides dw; ASUM, the activation's integer 32-block sums are computed here from its codes (a
// DMIN type reading the D4 layout, whose header holds no sums: Q4_K, Q5_K).
template <> struct Tr<QT_Q8_0>    : QFormat<QT_Q8_0>    { enum { SPLIT = 0, NAUX = 0, ASUM = 0 }; };
template <> struct Tr<QT_Q4_1>    : QFormat<QT_Q4_1>    { enum { SPLIT = 0, NAUX = 1, ASUM = 0 }; };
template <> struct Tr<QT_Q2_K>    : QFormat<QT_Q2_K>    { enum { SPLIT = 1, NAUX = 5, ASUM = 0 }; };
template <> struct Tr<QT_IQ2_XS>  : QFormat<QT_IQ2_XS>  { enum { SPLIT = 1, NAUX = 2, ASUM = 0 }; };
template <> struct Tr<QT_IQ3_XXS> : QFormat<QT_IQ3_XXS> { enum { SPLIT = 0, NAUX = 1, ASUM = 0 }; };
template <> struct Tr<QT_IQ3_S>   : QFormat<QT_IQ3_S>   { enum { SPLIT = 0, NAUX = 1, ASUM = 0 }; };
// llama-quantize's mixes (strata/kquants.py). Q4_0, Q5_0: PLAIN with signed codes, as Q8_0.
// Q5_1: MIN, as Q4_1 (aux: m). Q4_K, Q5_K: DMIN with one scale and one min per 32 values, so one
// k32 sum (aux: u, v, dmin). Q6_K, Q3_K: PLAIN with a signed sub-scale per 16 values, split as
// IQ2_XS (aux: u0, u1).
template <> struct Tr<QT_Q4_0>    : QFormat<QT_Q4_0>    { enum { SPLIT = 0, NAUX = 0, ASUM = 0 }; };
template <> struct Tr<QT_Q5_0>    : QFormat<QT_Q5_0>    { enum { SPLIT = 0, NAUX = 0, ASUM = 0 }; };
template <> struct Tr<QT_Q5_1>    : QFormat<QT_Q5_1>    { enum { SPLIT = 0, NAUX = 1, ASUM = 0 }; };
template <> struct Tr<QT_Q4_K>    : QFormat<QT_Q4_K>    { enum { SPLIT = 0, NAUX = 3, ASUM = 1 }; };
template <> struct Tr<QT_Q5_K>    : QFormat<QT_Q5_K>    { enum { SPLIT = 0, NAUX = 3, ASUM = 1 }; };
template <> struct Tr<QT_Q6_K>    : QFormat<QT_Q6_K>    { enum { SPLIT = 1, NAUX = 2, ASUM = 0 }; };
template <> struct Tr<QT_Q3_K>    : QFormat<QT_Q3_K>    { enum { SPLIT = 1, NAUX = 2, ASUM = 0 }; };

// ------------------------------------------------------------------ PTX helpers

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// D = A(16x32 s8, row) * B(32x8 s8, col) + C, C = MAGIC_I in every element.
__device__ __forceinline__ void mma_k32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(MAGIC_I));
}
// D = A(16x16 s8, row) * B(16x8 s8, col) + MAGIC_I.
__device__ __forceinline__ void mma_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(MAGIC_I));
}

__device__ __forceinline__ float ifl(int d) { return __int_as_float(d) - MAGIC_F; }
// Sub-scale u = x[i] (an integer 0..31, exact in float; a Q2_K sub-scale may be 0) times the
// k16 or k32 sum in d: u * S in one fused multiply-add (scaled_magic: exact, |u * S| < 2^24 for
// every type here: IQ2_XS 31 * 16 * 127 * 43, IQ3_XXS 31 * 32 * 127 * 62, Q2_K 15 * 16 * 127 * 3).
// -u * MAGIC_F is the same product for every tile of a block: the compiler computes it once.
// The K-quants widen u: Q4_K and Q5_K 0..63 (k32: 63 * 32 * 127 * 15 and * 31); Q3_K -32..31
// (k16: 32 * 16 * 127 * 4); Q6_K -128..127, the widest (k16: 128 * 16 * 127 * 32 = 8323072, and
// the two halves' sum at most twice that, 16646144, still below 2^24 = 16777216, so sumi is
// exact too). A negative u changes nothing: -u * MAGIC_F is exact for |u| <= 128 (an 8-bit
// integer times 1.5 * 2^23), and the fma's exact value is the integer u * S.
template <int NX>
__device__ __forceinline__ float sub_sum(const float (&x)[NX], int i, int d) {
    return scaled_magic(x[i], x[i] * -MAGIC_F, d);
}

// ------------------------------------------------------------------ decode helpers

// Unaligned little-endian u32 from a 4-aligned staged row (byteoff any).
__device__ __forceinline__ uint32_t ldw(const uint8_t* rowb, int byteoff) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(rowb);
    const int wi = byteoff >> 2;
    return __funnelshift_r(w[wi], w[wi + 1], (byteoff & 3) * 8);
}
__device__ __forceinline__ uint32_t ldh(const uint8_t* rowb, int byteoff) {  // byteoff even
    return *reinterpret_cast<const uint16_t*>(rowb + byteoff);
}
__device__ __forceinline__ uint32_t ldb(const uint8_t* rowb, int byteoff) { return rowb[byteoff]; }
__device__ __forceinline__ float h2f(uint32_t h) {
    return __half2float(__ushort_as_half((unsigned short)h));
}
// Negate the bytes of g (all in 1..127) where the byte mask m is 0xFF: ~g + 1, no carries.
__device__ __forceinline__ uint32_t sgn(uint32_t g, uint32_t m) { return (g ^ m) + (m & 0x01010101u); }
// 4 bits -> 4 byte masks (0x00 / 0xFF), bit i -> byte i.
__device__ __forceinline__ uint32_t expand4(uint32_t b) {
    return ((b * 0x00204081u) & 0x01010101u) * 0xFFu;
}

// Bit i of b (4 bits) as bit 4 of byte i (the fifth code bit of Q5_0, Q5_1): expand4's spread
// without the byte masks.
__device__ __forceinline__ uint32_t bit4_bytes(uint32_t b) { return ((b * 0x00204081u) & 0x01010101u) << 4; }
// q - B in each byte, for bytes q in 0 .. 2B-1 (B <= 64): q + (128 - B) stays inside its byte (no
// carry into the next), and flipping bit 7 then subtracts the 128 as a signed byte.
template <uint32_t B>
__device__ __forceinline__ uint32_t minus_bytes(uint32_t q) {
    return (q + (0x80u - B) * 0x01010101u) ^ 0x80808080u;
}
// The 6-bit scale (MIN: false) or min (true) of 32-block j of a Q4_K or Q5_K block whose 12
// scale bytes are at sc: j < 4, the low 6 bits of byte j (scale) or 4 + j (min); j >= 4, a
// nibble of byte 4 + j (low: scale, high: min) under bits 6..7 of byte j - 4 (scale) or j (min).
template <bool MIN>
__device__ __forceinline__ uint32_t k_scale(const uint8_t* rowb, int sc, int j) {
    if (j < 4) return ldb(rowb, sc + j + (MIN ? 4 : 0)) & 63;
    const uint32_t lo = ldb(rowb, sc + j + 4), hi = ldb(rowb, sc + j - (MIN ? 0 : 4)) >> 6;
    return (MIN ? lo >> 4 : lo & 15) | (hi << 4);
}

// Decode 32-block j (of this chunk) of one staged row. rowb: staged words of the row;
// o: byte offset of the chunk's first byte in rowb. tab: IQ tables in shared memory.
template <int QT>
__device__ __forceinline__ void decode_unit(const uint8_t* rowb, int o, int j, const uint8_t* tab,
                                            uint32_t (&c)[8], float& dw, float (&aux)[5]) {
    if constexpr (QT == QT_Q8_0) {
        const int p = o + Tr<QT>::BS * j;
        dw = h2f(ldh(rowb, p + Tr<QT>::HALF_D));
        // the 32 codes at bytes p + 2 .. p + 33: nine aligned words from the one holding byte
        // p + 2, each code word two of them shifted by the one offset (ldw per word would
        // recompute both addresses eight times)
        const uint32_t* wd = reinterpret_cast<const uint32_t*>(rowb) + ((p + 2) >> 2);
        const int sh = ((p + 2) & 3) * 8;
        uint32_t v[9];
#pragma unroll
        for (int k = 0; k < 9; ++k) v[k] = wd[k];
#pragma unroll
        for (int k = 0; k < 8; ++k) c[k] = __funnelshift_r(v[k], v[k + 1], sh);
    } else if constexpr (QT == QT_Q4_1) {
        const int p = o + Tr<QT>::BS * j;
        dw = h2f(ldh(rowb, p + Tr<QT>::HALF_D));
        aux[0] = h2f(ldh(rowb, p + Tr<QT>::HALF_M));
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t w = ldw(rowb, p + 4 + 4 * k);
            c[k] = w & 0x0F0F0F0Fu;
            c[k + 4] = (w >> 4) & 0x0F0F0F0Fu;
        }
    } else if constexpr (QT == QT_Q2_K) {
        const int h = j >> 2, sh = 2 * (j & 3);
#pragma unroll
        for (int k = 0; k < 8; ++k) c[k] = (ldw(rowb, o + 16 + 32 * h + 4 * k) >> sh) & 0x03030303u;
        const uint32_t s0 = ldb(rowb, o + 2 * j), s1 = ldb(rowb, o + 2 * j + 1);
        dw = h2f(ldh(rowb, o + Tr<QT>::HALF_D));
        aux[0] = (float)(s0 & 15);  // u0
        aux[1] = (float)(s1 & 15);  // u1
        aux[2] = (float)(s0 >> 4);  // v0
        aux[3] = (float)(s1 >> 4);  // v1
        aux[4] = h2f(ldh(rowb, o + Tr<QT>::HALF_DMIN));  // mw = dmin
    } else if constexpr (QT == QT_IQ2_XS) {
        dw = h2f(ldh(rowb, o + Tr<QT>::HALF_D)) * Tr<QT>::DW_FACTOR;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t q = ldh(rowb, o + 2 + 2 * (4 * j + l));
            const uint2 g = *reinterpret_cast<const uint2*>(tab + TAB_IQ2XS + 8 * (q & 511));
            const uint2 m = *reinterpret_cast<const uint2*>(tab + TAB_SIGN + 8 * (q >> 9));
            c[2 * l] = sgn(g.x, m.x);
            c[2 * l + 1] = sgn(g.y, m.y);
        }
        const uint32_t sc = ldb(rowb, o + 66 + j);
        aux[0] = (float)(2 * (sc & 15) + 1);
        aux[1] = (float)(2 * (sc >> 4) + 1);
    } else if constexpr (QT == QT_IQ3_XXS) {
        dw = h2f(ldh(rowb, o + Tr<QT>::HALF_D)) * Tr<QT>::DW_FACTOR;
        const uint32_t a32 = ldw(rowb, o + 66 + 4 * j);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint2 m = *reinterpret_cast<const uint2*>(tab + TAB_SIGN + 8 * ((a32 >> (7 * l)) & 127));
            const uint32_t i1 = ldb(rowb, o + 2 + 8 * j + 2 * l);
            const uint32_t i2 = ldb(rowb, o + 2 + 8 * j + 2 * l + 1);
            const uint32_t g1 = *reinterpret_cast<const uint32_t*>(tab + TAB_IQ3XXS + 4 * i1);
            const uint32_t g2 = *reinterpret_cast<const uint32_t*>(tab + TAB_IQ3XXS + 4 * i2);
            c[2 * l] = sgn(g1, m.x);
            c[2 * l + 1] = sgn(g2, m.y);
        }
        aux[0] = (float)(2 * (a32 >> 28) + 1);
    } else if constexpr (QT == QT_IQ3_S) {
        dw = h2f(ldh(rowb, o + Tr<QT>::HALF_D));
        const uint32_t qh = ldb(rowb, o + 66 + j);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t i1 = ldb(rowb, o + 2 + 8 * j + 2 * l) | (((qh >> (2 * l)) & 1) << 8);
            const uint32_t i2 = ldb(rowb, o + 2 + 8 * j + 2 * l + 1) | (((qh >> (2 * l + 1)) & 1) << 8);
            const uint32_t sb = ldb(rowb, o + 74 + 4 * j + l);
            const uint32_t g1 = *reinterpret_cast<const uint32_t*>(tab + TAB_IQ3S + 4 * i1);
            const uint32_t g2 = *reinterpret_cast<const uint32_t*>(tab + TAB_IQ3S + 4 * i2);
            c[2 * l] = sgn(g1, expand4(sb & 15));
            c[2 * l + 1] = sgn(g2, expand4(sb >> 4));
        }
        const uint32_t sc = ldb(rowb, o + 106 + (j >> 1));
        aux[0] = (float)(2 * ((sc >> (4 * (j & 1))) & 15) + 1);
    } else if constexpr (QT == QT_Q4_0) {
        // d, qs[16]: value i < 16 the low nibble of qs[i], 16 + i its high nibble; code q - 8
        const int p = o + Tr<QT>::BS * j;
        dw = h2f(ldh(rowb, p + Tr<QT>::HALF_D));
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t w = ldw(rowb, p + 2 + 4 * k);
            c[k] = minus_bytes<8>(w & 0x0F0F0F0Fu);
            c[k + 4] = minus_bytes<8>((w >> 4) & 0x0F0F0F0Fu);
        }
    } else if constexpr (QT == QT_Q5_0 || QT == QT_Q5_1) {
        // [d, m,] qh u32, qs[16]: Q4_0's nibbles, bit i of qh the fifth bit of value i; Q5_0's
        // code q - 16, Q5_1's q with its min m
        constexpr int QH = (QT == QT_Q5_1) ? 4 : 2;
        const int p = o + Tr<QT>::BS * j;
        dw = h2f(ldh(rowb, p + Tr<QT>::HALF_D));
        if constexpr (QT == QT_Q5_1) aux[0] = h2f(ldh(rowb, p + Tr<QT>::HALF_M));
        const uint32_t qh = ldw(rowb, p + QH);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t w = ldw(rowb, p + QH + 4 + 4 * k);
            const uint32_t lo = (w & 0x0F0F0F0Fu) | bit4_bytes((qh >> (4 * k)) & 15);
            const uint32_t hi = ((w >> 4) & 0x0F0F0F0Fu) | bit4_bytes((qh >> (16 + 4 * k)) & 15);
            c[k] = (QT == QT_Q5_0) ? minus_bytes<16>(lo) : lo;
            c[k + 4] = (QT == QT_Q5_0) ? minus_bytes<16>(hi) : hi;
        }
    } else if constexpr (QT == QT_Q4_K || QT == QT_Q5_K) {
        // d, dmin, scales[12], [qh[32],] qs[128]: 32-block j is nibble j & 1 of qs[32 (j >> 1) ..
        // + 31]; Q5_K's fifth bit of value i is bit j of qh[i]
        constexpr int QS = (QT == QT_Q5_K) ? 48 : 16;
        const int nib = 4 * (j & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            uint32_t q = (ldw(rowb, o + QS + 32 * (j >> 1) + 4 * k) >> nib) & 0x0F0F0F0Fu;
            if constexpr (QT == QT_Q5_K) q |= ((ldw(rowb, o + 16 + 4 * k) >> j) & 0x01010101u) << 4;
            c[k] = q;
        }
        dw = h2f(ldh(rowb, o + Tr<QT>::HALF_D));
        aux[0] = (float)k_scale<false>(rowb, o + 4, j);  // u (both halves)
        aux[1] = (float)k_scale<true>(rowb, o + 4, j);   // v (both halves)
        aux[2] = h2f(ldh(rowb, o + Tr<QT>::HALF_DMIN));  // mw = dmin
    } else if constexpr (QT == QT_Q6_K) {
        // ql[128], qh[64], scales i8[16], d: 32-block j = 4h + 2n + e (h, n, e bits) takes value
        // i's low four bits from nibble n of ql[64h + 32e + i] and its high two from bits
        // 2 (j & 3) .. + 1 of qh[32h + i]; code q - 32
        const int h = j >> 2;
        const int lsh = 4 * ((j >> 1) & 1), hsh = 2 * (j & 3);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t lo = (ldw(rowb, o + 64 * h + 32 * (j & 1) + 4 * k) >> lsh) & 0x0F0F0F0Fu;
            const uint32_t hi = (ldw(rowb, o + 128 + 32 * h + 4 * k) >> hsh) & 0x03030303u;
            c[k] = minus_bytes<32>(lo | (hi << 4));
        }
        dw = h2f(ldh(rowb, o + Tr<QT>::HALF_D));
        aux[0] = (float)(int8_t)ldb(rowb, o + 192 + 2 * j);      // u0, -128..127
        aux[1] = (float)(int8_t)ldb(rowb, o + 192 + 2 * j + 1);  // u1
    } else if constexpr (QT == QT_Q3_K) {
        // hmask[32], qs[64], scales[12], d: 32-block j = 4h + s takes value i's two low bits
        // from bits 2s .. 2s+1 of qs[32h + i]; 4 is subtracted where bit j of hmask[i] is clear
        const int h = j >> 2, sh = 2 * (j & 3);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t lo = (ldw(rowb, o + 32 + 32 * h + 4 * k) >> sh) & 0x03030303u;
            const uint32_t clear = ~(ldw(rowb, o + 4 * k) >> j) & 0x01010101u;
            c[k] = lo | (clear * 0xFCu);  // lo - 4 = lo | 0xFC as a byte, where the bit is clear
        }
        dw = h2f(ldh(rowb, o + Tr<QT>::HALF_D));
        // sub-scale n (0..15, n = 2j + half): the low nibble n >> 3 of byte n & 7, bits
        // 2 (n >> 2) .. + 1 of byte 8 + (n & 3) above it, minus 32
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int n = 2 * j + e;
            const uint32_t lo = (ldb(rowb, o + 96 + (n & 7)) >> (4 * (n >> 3))) & 15;
            const uint32_t hi = (ldb(rowb, o + 104 + (n & 3)) >> (2 * (n >> 2))) & 3;
            aux[e] = (float)((int)(lo | (hi << 4)) - 32);  // -32..31
        }
    }
}

// ------------------------------------------------------------------ epilogues
// One n8 tile of one 32-block: ac[e] for (weight row A|B, activation column col|col+1).
// xA/xB: the weight rows' extra scales (see decode_unit); asc: activation scales [a][j][BN].

template <int QT, int NX>
__device__ __forceinline__ void epi_one(float (&ac)[4], const int (&d)[4], float dwA, float dwB,
                                        const float (&xA)[NX], const float (&xB)[NX], float2 da,
                                        const float* asc, int j, int col) {
    if constexpr (QT == QT_Q8_0 || QT == QT_Q4_0 || QT == QT_Q5_0) {
        ac[0] = ac[0] + (dwA * da.x) * ifl(d[0]);
        ac[1] = ac[1] + (dwA * da.y) * ifl(d[1]);
        ac[2] = ac[2] + (dwB * da.x) * ifl(d[2]);
        ac[3] = ac[3] + (dwB * da.y) * ifl(d[3]);
    } else if constexpr (QT == QT_IQ3_XXS || QT == QT_IQ3_S) {
        ac[0] = ac[0] + (dwA * da.x) * sub_sum(xA, 0, d[0]);
        ac[1] = ac[1] + (dwA * da.y) * sub_sum(xA, 0, d[1]);
        ac[2] = ac[2] + (dwB * da.x) * sub_sum(xB, 0, d[2]);
        ac[3] = ac[3] + (dwB * da.y) * sub_sum(xB, 0, d[3]);
    } else if constexpr (QT == QT_Q4_1 || QT == QT_Q5_1) {
        const float2 sa = *reinterpret_cast<const float2*>(asc + (4 + j) * MMQ_BN + col);
        ac[0] = ac[0] + ((dwA * da.x) * ifl(d[0]) + xA[0] * sa.x);
        ac[1] = ac[1] + ((dwA * da.y) * ifl(d[1]) + xA[0] * sa.y);
        ac[2] = ac[2] + ((dwB * da.x) * ifl(d[2]) + xB[0] * sa.x);
        ac[3] = ac[3] + ((dwB * da.y) * ifl(d[3]) + xB[0] * sa.y);
    } else if constexpr (QT == QT_Q4_K || QT == QT_Q5_K) {
        // x: u v mw; asc[1]: the activation's integer 32-block sums (prep, ASUM). mi = v * sum is
        // exact (63 * 32 * 127 < 2^24), as sumi = u * S is (63 * 32 * 31 * 127 < 2^24, Q5_K's)
        const float2 s = *reinterpret_cast<const float2*>(asc + (4 + j) * MMQ_BN + col);
        const float mi0 = xA[1] * s.x, mi1 = xA[1] * s.y, mi2 = xB[1] * s.x, mi3 = xB[1] * s.y;
        ac[0] = ac[0] + ((dwA * da.x) * sub_sum(xA, 0, d[0]) - (xA[2] * da.x) * mi0);
        ac[1] = ac[1] + ((dwA * da.y) * sub_sum(xA, 0, d[1]) - (xA[2] * da.y) * mi1);
        ac[2] = ac[2] + ((dwB * da.x) * sub_sum(xB, 0, d[2]) - (xB[2] * da.x) * mi2);
        ac[3] = ac[3] + ((dwB * da.y) * sub_sum(xB, 0, d[3]) - (xB[2] * da.y) * mi3);
    }
}

template <int QT, int NX>
__device__ __forceinline__ void epi_split(float (&ac)[4], const int (&d0)[4], const int (&d1)[4], float dwA,
                                          float dwB, const float (&xA)[NX], const float (&xB)[NX], float2 da,
                                          const float* asc, int j, int col) {
    if constexpr (QT == QT_IQ2_XS || QT == QT_Q6_K || QT == QT_Q3_K) {
        ac[0] = ac[0] + (dwA * da.x) * (sub_sum(xA, 0, d0[0]) + sub_sum(xA, 1, d1[0]));
        ac[1] = ac[1] + (dwA * da.y) * (sub_sum(xA, 0, d0[1]) + sub_sum(xA, 1, d1[1]));
        ac[2] = ac[2] + (dwB * da.x) * (sub_sum(xB, 0, d0[2]) + sub_sum(xB, 1, d1[2]));
        ac[3] = ac[3] + (dwB * da.y) * (sub_sum(xB, 0, d0[3]) + sub_sum(xB, 1, d1[3]));
    } else if constexpr (QT == QT_Q2_K) {
        // x: u0 u1 v0 v1 mw; asc[1], asc[2]: integer sums of the activation halves
        const float2 s0 = *reinterpret_cast<const float2*>(asc + (4 + j) * MMQ_BN + col);
        const float2 s1 = *reinterpret_cast<const float2*>(asc + (8 + j) * MMQ_BN + col);
        const float mi0 = xA[2] * s0.x + xA[3] * s1.x, mi1 = xA[2] * s0.y + xA[3] * s1.y;
        const float mi2 = xB[2] * s0.x + xB[3] * s1.x, mi3 = xB[2] * s0.y + xB[3] * s1.y;
        ac[0] = ac[0] + ((dwA * da.x) * (sub_sum(xA, 0, d0[0]) + sub_sum(xA, 1, d1[0])) - (xA[4] * da.x) * mi0);
        ac[1] = ac[1] + ((dwA * da.y) * (sub_sum(xA, 0, d0[1]) + sub_sum(xA, 1, d1[1])) - (xA[4] * da.y) * mi1);
        ac[2] = ac[2] + ((dwB * da.x) * (sub_sum(xB, 0, d0[2]) + sub_sum(xB, 1, d1[2])) - (xB[4] * da.x) * mi2);
        ac[3] = ac[3] + ((dwB * da.y) * (sub_sum(xB, 0, d0[3]) + sub_sum(xB, 1, d1[3])) - (xB[4] * da.y) * mi3);
    }
}

// ---- end of the copy from mmq.cu

template <int QT> struct GeoWS {
    enum {
        KC = 128,
        NBLK = 4,
        CB = (Tr<QT>::VPB == 32) ? 4 * Tr<QT>::BS : Tr<QT>::BS,  // raw bytes of one chunk of one row
        PMAX = (CB + 14 + 15) / 16,                               // 16-byte pieces (start 0..14 off)
        RAWB = PMAX * 16 + ((PMAX % 2) ? 0 : 16),                 // staged bytes per row (odd x 16)
        ASTR = 144,                                               // act row stride in smem
        WSTR = KC + 16,                                           // decoded weight row stride
        NAA = (Tr<QT>::LAY == LAYOUT_D4) ? 1 + Tr<QT>::ASUM : ((Tr<QT>::LAY == LAYOUT_DS4) ? 2 : 3),
        TABB = Tr<QT>::TAB ? TAB_BYTES : 0,
        RAW_B = MMQ_BM * RAWB,                                    // one raw slot
        ACT_B = MMQ_BN * ASTR,                                    // a stage's activation blocks
        WDEC_B = MMQ_BM * WSTR,                                   // a stage's int8 weight codes
        WSC_F = (1 + Tr<QT>::NAUX) * NBLK * MMQ_BM,               // a stage's weight scales (floats)
        ASC_F = NAA * NBLK * MMQ_BN,                              // a stage's activation scales
        STAGE_B = ACT_B + WDEC_B + 4 * WSC_F + 4 * ASC_F,
        S_ACT = 0, S_WDEC = ACT_B, S_WSC = ACT_B + WDEC_B, S_ASC = S_WSC + 4 * WSC_F,
        OFF_RAW = TABB,
        OFF_STAGE = OFF_RAW + MMQ_WS_RS * RAW_B,
        SMEM = OFF_STAGE + MMQ_WS_DS * STAGE_B,
    };
    static_assert(SMEM <= MMQ_SMEM_MAX, "shared memory over the sm_90 limit: fewer MMQ_WS_DS / MMQ_WS_RS");
    static_assert(STAGE_B % 16 == 0 && RAW_B % 16 == 0, "16-byte aligned stages");
};

// Named barriers: sync waits until `count` threads (this one included) have arrived; arrive
// counts this warp's threads and goes on. Both order this thread's earlier shared-memory writes
// before the other participants' later reads (the barrier's memory ordering).
__device__ __forceinline__ void nb_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void nb_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
#define WS_BAR_PROD 1
#define WS_BAR_FULL(s) (2 + (s))
#define WS_BAR_EMPTY(s) (2 + MMQ_WS_DS + (s))

// ---- the products of one chunk: mmq.cu's mmq2_chunk without the mixed decode (MID false), the
// ---- same instructions in the same order per output element.
template <int QT, int T, bool FULL>
__device__ __forceinline__ void ws_chunk(float (&acc)[MMQ_NT8][4], uint32_t wdec_s, const float* wsc,
                                         const float* asc, uint32_t act_s, int jlim, uint32_t a_off,
                                         int lane, int wn, int rA, int rB) {
    constexpr int NBLK = 4, BM = MMQ_BM, BN = MMQ_BN, WN = MMQ_WN, ASTR = 144;
    constexpr int NAUX = Tr<QT>::NAUX;
    constexpr bool SPL = Tr<QT>::SPLIT;
    constexpr int P = (T + 1) / 2;  // ldmatrix x4 loads (tile pairs)
    const int t4 = lane & 3;
#pragma unroll
    for (int j = 0; j < NBLK; ++j) {
        if (!FULL && j >= jlim) break;
        uint32_t a[4];
        ldsm_x4(a, wdec_s + a_off + j * 32);
        const int acode = 16 + j * 32 + ((lane >> 3) & 1) * 16;
        const uint32_t bbase = act_s + (((lane >> 4) ? WN : 0) + wn) * 8 * ASTR + (lane & 7) * ASTR + acode;
        constexpr uint32_t BSTEP = 2 * WN * 8 * ASTR;
        uint32_t b[P][4];
        ldsm_x4(b[0], bbase);
        if constexpr (P > 1) ldsm_x4(b[1], bbase + BSTEP);
        const float dwA = wsc[j * BM + rA], dwB = wsc[j * BM + rB];
        float xA[NAUX > 0 ? NAUX : 1], xB[NAUX > 0 ? NAUX : 1];
#pragma unroll
        for (int x = 0; x < NAUX; ++x) {
            xA[x] = wsc[((1 + x) * NBLK + j) * BM + rA];
            xB[x] = wsc[((1 + x) * NBLK + j) * BM + rB];
        }
        constexpr int NM = SPL ? 2 : 1;
        int d[2][NM][4];
        auto mma_tile = [&](int t, int (&dd)[NM][4]) {
            const int h = (t & 1) * 2;
            if constexpr (SPL) {
                mma_k16(dd[0], a[0], a[1], b[t >> 1][h]);
                mma_k16(dd[NM - 1], a[2], a[3], b[t >> 1][h + 1]);
            } else {
                mma_k32(dd[0], a, b[t >> 1][h], b[t >> 1][h + 1]);
            }
        };
        mma_tile(0, d[0]);
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (t + 1 < T) mma_tile(t + 1, d[(t + 1) & 1]);
            if ((t & 1) && (t >> 1) + 2 < P) ldsm_x4(b[(t >> 1) + 2 < P ? (t >> 1) + 2 : 0], bbase + ((t >> 1) + 2) * BSTEP);
            const int c = (wn + WN * t) * 8 + 2 * t4;
            const float2 da = *reinterpret_cast<const float2*>(asc + j * BN + c);
            if constexpr (SPL)
                epi_split<QT>(acc[t], d[t & 1][0], d[t & 1][NM - 1], dwA, dwB, xA, xB, da, asc, j, c);
            else
                epi_one<QT>(acc[t], d[t & 1][0], dwA, dwB, xA, xB, da, asc, j, c);
        }
    }
}

// Dispatch on the warp's n8 tile count (1 .. NT8; 0: no products).
template <int QT, int T>
__device__ __forceinline__ void ws_dispatch(int nt, float (&acc)[MMQ_NT8][4], uint32_t wdec_s, const float* wsc,
                                            const float* asc, uint32_t act_s, int jlim, uint32_t a_off, int lane,
                                            int wn, int rA, int rB) {
    if constexpr (T >= 1) {
        if (nt == T) {
            if (jlim >= 4)
                ws_chunk<QT, T, true>(acc, wdec_s, wsc, asc, act_s, jlim, a_off, lane, wn, rA, rB);
            else
                ws_chunk<QT, T, false>(acc, wdec_s, wsc, asc, act_s, jlim, a_off, lane, wn, rA, rB);
        } else {
            ws_dispatch<QT, T - 1>(nt, acc, wdec_s, wsc, asc, act_s, jlim, a_off, lane, wn, rA, rB);
        }
    }
}

// One row tile x weight-row tile of the list.
struct WsTile {
    int rbase, rend, n0;
    long long woff;
};
__device__ __forceinline__ WsTile ws_tile(const int4* __restrict__ tiles, int tile, int NTm) {
    const int ti = tile / NTm;
    const int nt = tile - ti * NTm;
    const int4 e = tiles[ti];
    WsTile r;
    r.rbase = e.x;
    r.rend = e.y;
    r.n0 = nt * MMQ_BM;
    r.woff = (long long)(((unsigned long long)(unsigned)e.w << 32) | (unsigned)e.z);
    return r;
}

template <int QT>
__device__ __forceinline__ void mmq_ws_body(const uint8_t* __restrict__ W, int N, int K,
                                            const uint8_t* __restrict__ A, int R_total,
                                            float* __restrict__ out, long long ldo,
                                            const uint8_t* __restrict__ tabg,
                                            const int4* __restrict__ tiles, int n_tiles) {
    using G = GeoWS<QT>;
    constexpr int NBLK = G::NBLK, CB = G::CB, PMAX = G::PMAX, RAWB = G::RAWB, ASTR = G::ASTR, WSTR = G::WSTR;
    constexpr int DS = MMQ_WS_DS, RS = MMQ_WS_RS, LA = MMQ_WS_LA;
    constexpr int NAUX = Tr<QT>::NAUX, LAY = Tr<QT>::LAY;
    constexpr int BM = MMQ_BM, BN = MMQ_BN, NT = MMQ_NT, NT8 = MMQ_NT8, WN = MMQ_WN, WM = MMQ_WM;
    constexpr int NCT = 32 * MMQ_NC, PT = MMQ_PT;

    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t* tab = smem;
    uint8_t* raw = smem + G::OFF_RAW;
    uint8_t* stage0 = smem + G::OFF_STAGE;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int NTm = (N + BM - 1) / BM;
    const int nb = K / 32;
    const int nch = (K + 127) / 128;
    const int row_bytes = (K / Tr<QT>::VPB) * Tr<QT>::BS;
    const int total = n_tiles * NTm;
    const int my_tiles = (int)blockIdx.x < total ? (total - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int nG = my_tiles * nch;  // this CTA's chunks, in order: its tiles, each K chunk ascending

    if constexpr (Tr<QT>::TAB) {
        for (int i = tid; i < TAB_BYTES / 16; i += NT)
            reinterpret_cast<uint4*>(tab)[i] = reinterpret_cast<const uint4*>(tabg)[i];
    }
    __syncthreads();  // the tables, before the roles part; the last CTA-wide barrier
    if (nG == 0) return;

    if (warp >= MMQ_NC) {
        // ============================================================ producers
        const int ptid = tid - NCT;
        const long long achunk = (long long)R_total * 144;
        // chunk h: copies of its raw weights (raw slot h % RS) and activation blocks (stage h % DS)
        auto issue = [&](int h) {
            const WsTile tl = ws_tile(tiles, (int)blockIdx.x + (h / nch) * (int)gridDim.x, NTm);
            const int kc = h % nch;
            const int nvalid = tl.rend - tl.rbase;
            const int nrow_ok = min(BM, N - tl.n0);
            const uint8_t* wtile = W + tl.woff + (long long)tl.n0 * row_bytes;
            const int coff = (Tr<QT>::VPB == 32) ? kc * CB : (kc >> 1) * CB;
            const int cbytes = (Tr<QT>::VPB == 32) ? min(CB, row_bytes - kc * CB) : CB;
            const uint32_t rawb = smem_u32(raw + (h % RS) * G::RAW_B);
            const uint8_t* wc = wtile + coff;
            for (int idx = ptid; idx < BM * PMAX; idx += PT) {
                const int i = idx / PMAX, pc = idx - i * PMAX;  // row, 16-byte piece
                if (i < nrow_ok) {
                    const uint8_t* p = wc + (long long)i * row_bytes;
                    const int o = (int)((uintptr_t)p & 15);
                    if (pc * 16 < o + cbytes) cp_async16(rawb + i * RAWB + pc * 16, p - o + pc * 16);
                }
            }
            const uint32_t actb = smem_u32(stage0 + (h % DS) * G::STAGE_B + G::S_ACT);
            const uint8_t* src = A + (long long)tl.rbase * 144 + kc * achunk;
            for (int idx = ptid; idx < nvalid * 9; idx += PT) cp_async16(actb + idx * 16, src + idx * 16);
        };
        // chunk g: decode its raw slot into stage g % DS (checked: the chunk's blocks, the tile's
        // weight rows, its activation rows; what lies past them stays stale and feeds only
        // outputs that are never stored, as in mmq.cu)
        auto prep = [&](int g) {
            const WsTile tl = ws_tile(tiles, (int)blockIdx.x + (g / nch) * (int)gridDim.x, NTm);
            const int kc = g % nch;
            const int nvalid = tl.rend - tl.rbase;
            const int nrow_ok = min(BM, N - tl.n0);
            const uint8_t* wtile = W + tl.woff + (long long)tl.n0 * row_bytes;
            uint8_t* st = stage0 + (g % DS) * G::STAGE_B;
            uint8_t* wdec = st + G::S_WDEC;
            float* wsc = reinterpret_cast<float*>(st + G::S_WSC);
            float* asc = reinterpret_cast<float*>(st + G::S_ASC);
            const int coff = (Tr<QT>::VPB == 32) ? kc * CB : (kc >> 1) * CB;
            const int jbase = (Tr<QT>::VPB == 32) ? 0 : (kc & 1) * 4;
            const int jlim = min(NBLK, nb - kc * NBLK);
            const uint8_t* rawb = raw + (g % RS) * G::RAW_B;
            const uint8_t* wc = wtile + coff;
#pragma unroll 2
            for (int u = ptid; u < BM * NBLK; u += PT) {
                const int i = u % BM, j = u / BM;
                if (i >= nrow_ok || j >= jlim) continue;
                const int o = (int)((uintptr_t)(wc + (long long)i * row_bytes) & 15);
                uint32_t c[8];
                float dw, aux[5];
                decode_unit<QT>(rawb + i * RAWB, o, jbase + j, tab, c, dw, aux);
                uint4* dst = reinterpret_cast<uint4*>(wdec + i * WSTR + j * 32);
                dst[0] = make_uint4(c[0], c[1], c[2], c[3]);
                dst[1] = make_uint4(c[4], c[5], c[6], c[7]);
                wsc[j * BM + i] = dw;
#pragma unroll
                for (int a = 0; a < NAUX; ++a) wsc[((1 + a) * NBLK + j) * BM + i] = aux[a];
            }
            const uint8_t* actb = st + G::S_ACT;
            for (int u = ptid; u < BN * NBLK; u += PT) {
                const int r = u % BN, j = u / BN;
                if (r >= nvalid) continue;
                const uint8_t* hb = actb + r * ASTR;
                if constexpr (LAY == LAYOUT_D4) {
                    asc[j * BN + r] = *reinterpret_cast<const float*>(hb + 4 * j);
                    if constexpr (Tr<QT>::ASUM) {  // the 32 codes' sum, exact (|sum| <= 32 * 127)
                        const uint4* cw = reinterpret_cast<const uint4*>(hb + 16 + 32 * j);
                        const uint4 x0 = cw[0], x1 = cw[1];
                        int sum = 0;
                        sum = __dp4a((int)x0.x, 0x01010101, sum);
                        sum = __dp4a((int)x0.y, 0x01010101, sum);
                        sum = __dp4a((int)x0.z, 0x01010101, sum);
                        sum = __dp4a((int)x0.w, 0x01010101, sum);
                        sum = __dp4a((int)x1.x, 0x01010101, sum);
                        sum = __dp4a((int)x1.y, 0x01010101, sum);
                        sum = __dp4a((int)x1.z, 0x01010101, sum);
                        sum = __dp4a((int)x1.w, 0x01010101, sum);
                        asc[(NBLK + j) * BN + r] = (float)sum;
                    }
                } else if constexpr (LAY == LAYOUT_DS4) {
                    asc[j * BN + r] = h2f(*reinterpret_cast<const uint16_t*>(hb + 4 * j));
                    asc[(NBLK + j) * BN + r] = h2f(*reinterpret_cast<const uint16_t*>(hb + 4 * j + 2));
                } else {
                    asc[j * BN + r] = h2f(*reinterpret_cast<const uint16_t*>(hb + 2 * (j >> 1)));
                    const uint4* cw = reinterpret_cast<const uint4*>(hb + 16 + 32 * j);
                    const uint4 x0 = cw[0], x1 = cw[1];
                    int s0 = 0, s1 = 0;
                    s0 = __dp4a((int)x0.x, 0x01010101, s0);
                    s0 = __dp4a((int)x0.y, 0x01010101, s0);
                    s0 = __dp4a((int)x0.z, 0x01010101, s0);
                    s0 = __dp4a((int)x0.w, 0x01010101, s0);
                    s1 = __dp4a((int)x1.x, 0x01010101, s1);
                    s1 = __dp4a((int)x1.y, 0x01010101, s1);
                    s1 = __dp4a((int)x1.z, 0x01010101, s1);
                    s1 = __dp4a((int)x1.w, 0x01010101, s1);
                    asc[(NBLK + j) * BN + r] = (float)s0;
                    asc[(2 * NBLK + j) * BN + r] = (float)s1;
                }
            }
        };

        // chunks 0 .. LA - 1: their stages are free (first use)
#pragma unroll 1
        for (int h = 0; h < LA; ++h) {
            if (h < nG) issue(h);
            cp_async_commit();
        }
#pragma unroll 1
        for (int g = 0; g < nG; ++g) {
            if constexpr (LA > 0) {
                // committed: chunks 0 .. g + LA - 1 (a group each, empty past nG); chunk g's landed
                cp_async_wait<(LA > 0 ? LA - 1 : 0)>();
                nb_sync(WS_BAR_PROD, PT);  // every producer's copies of g visible; all done with g - 1
                const int h = g + LA;      // its raw slot held chunk h - RS <= g - 1
                if (h < nG) {
                    if (h >= DS) nb_sync(WS_BAR_EMPTY(h % DS), NT);  // the consumers are done with chunk h - DS
                    issue(h);
                }
                cp_async_commit();
            } else {
                // no lookahead: chunk g copied now, into the raw slot of chunk g - RS <= g - 2 (every
                // producer passed the barrier of g - 1 after decoding g - 2)
                if (g >= DS) nb_sync(WS_BAR_EMPTY(g % DS), NT);
                issue(g);
                cp_async_commit();
                cp_async_wait<0>();
                nb_sync(WS_BAR_PROD, PT);
            }
            prep(g);
            nb_arrive(WS_BAR_FULL(g % DS), NT);
        }
        // the consumers' EMPTY arrivals the loop did not wait for (chunks max(0, nG - DS) .. nG - 1)
#pragma unroll 1
        for (int c = nG - DS > 0 ? nG - DS : 0; c < nG; ++c) nb_sync(WS_BAR_EMPTY(c % DS), NT);
        cp_async_wait<0>();
    } else {
        // ============================================================ consumers
        const int wm = warp % WM, wn = warp / WM;
        const int t4 = lane & 3;
        const uint32_t a_off = (uint32_t)((wm * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * WSTR + (lane >> 4) * 16);
        const int rA = wm * 16 + (lane >> 2), rB = rA + 8;
        const uint32_t stage0_s = smem_u32(stage0);
        int g = 0;
#pragma unroll 1
        for (int k = 0; k < my_tiles; ++k) {
            const WsTile tl = ws_tile(tiles, (int)blockIdx.x + k * (int)gridDim.x, NTm);
            const int nvalid = tl.rend - tl.rbase;
            const int nt8 = (nvalid + 7) >> 3;
            const int ntw = nt8 > wn ? (nt8 - wn + WN - 1) / WN : 0;
            const bool active = (tl.n0 + wm * 16) < N;  // a warp whose 16 weight rows are all past N idles
            float acc[NT8][4];
#pragma unroll
            for (int s = 0; s < NT8; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.0f;
#pragma unroll 1
            for (int kc = 0; kc < nch; ++kc, ++g) {
                const int s = g % DS;
                const uint32_t st_s = stage0_s + s * G::STAGE_B;
                const float* st_f = reinterpret_cast<const float*>(stage0 + s * G::STAGE_B);
                nb_sync(WS_BAR_FULL(s), NT);
                if (active)
                    ws_dispatch<QT, NT8>(ntw, acc, st_s + G::S_WDEC, st_f + G::S_WSC / 4, st_f + G::S_ASC / 4,
                                         st_s + G::S_ACT, nb - kc * NBLK, a_off, lane, wn, rA, rB);
                nb_arrive(WS_BAR_EMPTY(s), NT);
            }
            const int nA = tl.n0 + rA, nB = tl.n0 + rB;
#pragma unroll
            for (int s = 0; s < NT8; ++s) {
                const int i = wn + WN * s;
                const int r0 = tl.rbase + i * 8 + 2 * t4;
                if (r0 < tl.rend) {
                    float* o = out + (long long)r0 * ldo;
                    if (nA < N) o[nA] = acc[s][0];
                    if (nB < N) o[nB] = acc[s][2];
                }
                if (r0 + 1 < tl.rend) {
                    float* o = out + (long long)(r0 + 1) * ldo;
                    if (nA < N) o[nA] = acc[s][1];
                    if (nB < N) o[nB] = acc[s][3];
                }
            }
        }
    }
}

// The parameters are mmq.cu's before MmqArgs (MMQ_ENTRY's 16, in its order); the host packs them by name.
// Kernel names: ws_<mmq.cu's name> (ws_mmq_q8_0, ws_mmq_iq2_xs, ...).
#define MMQ_WS_ENTRY(NAME, QT)                                                                           \
    extern "C" __global__ void MMQ_WS_BOUNDS                                                         \
        ws_##NAME(const uint8_t* __restrict__ w, long long w_stride, int N, int K,                     \
                  const uint8_t* __restrict__ act, int R_total, const int* __restrict__ bounds,         \
                  int n_exp, float* __restrict__ out, long long ldo, const uint8_t* __restrict__ tab,  \
                  int tile_rows, long long w_pair, float* out2, const int4* __restrict__ tiles,        \
                  int n_tiles) {                                                                         \
        const bool second = blockIdx.y != 0;                                                             \
        if (tiles == nullptr) return;                                                                    \
        mmq_ws_body<QT>(second ? w + w_pair : w, N, K, act, R_total, second ? out2 : out, ldo, tab,     \
                        tiles, n_tiles);                                                                 \
    }                                                                                                    \
    extern "C" __device__ int ws_##NAME##_smem = GeoWS<QT>::SMEM;

MMQ_KERNELS(MMQ_WS_ENTRY)

// Geometry for the host (read with get_global): {BM, BN, threads, MINB}.
extern "C" __device__ int mmq_ws_geometry[4] = {MMQ_BM, MMQ_BN, MMQ_NT, MMQ_MINB};
