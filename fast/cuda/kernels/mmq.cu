// Grouped MMQ products on int8 tensor cores.
//
// Definition: strata_prefill.contract.mmq.mmq_prepared (strata_prefill.contract.mmq.mmq for raw weight rows) (docs/numerics.md section 3). Every output element is
//   acc = 0.0f; for each 32-value block b of the weight row, ascending:
//     acc = acc + <the type's epilogue>(dw, da, sumi [, mw, sa, mi]; HALVES: dw0, dw1, da, S0, S1)
// with sumi exact integers from the tensor cores (the DMIN types' mi from exact integer sums of
// the activation codes). Weight rows come in their GGUF blocks and are decoded here (block layouts: contract/quants.py); the IQ grids and the
// sign table are uploaded from strata_prefill.contract.quants' tables (one source), never written here; the codebook
// types' codebooks (contract/codebooks.py) come in the generated header, qformats.cuh, four words each.
//
// Compiled with --fmad=false: every `a * b + c` below is two roundings, as in NumPy.
//
// Launch (the names below are the kernels' parameters; fast/cuda/products.py passes each by its
// name, in the order this signature gives, read from it by fast/cuda/signatures.py):
// one launch multiplies up to 16 "experts". Expert q's weight matrix (N rows of K
// values, GGUF blocks, row-major) starts at w + q * w_stride; its activation rows are rows
// [bounds[2q], bounds[2q+1]) of the q8_1 buffer act (R_total rows, column-block-major,
// block_q8_1_mmq, the layout the weight type selects). out is float32 [R_total, ldo];
// out[r, n] is written for rows inside a bound and n < N only.
// A pair of matrices per expert (gate and up) in one launch: gridDim.y = 2, and the CTAs with
// blockIdx.y == 1 multiply the matrix at w + w_pair + q * w_stride into out2 (same bounds,
// same activation rows, same tiles). gridDim.y = 1 multiplies w into out only (w_pair and
// out2 unused). Each output element's arithmetic is the same either way: one launch saves
// the host a launch per group, not a bit of the result.
//
// A tile list instead of bounds (tiles != NULL; bounds and n_exp unused): any number of
// experts in one launch, each read where it lies. Entry i of tiles (int4) is one row tile:
// activation rows [x, y) of one expert whose matrix starts at w + (z | (long long)(its w) << 32)
// (a byte offset, even). CTA tile t multiplies entry t / ceil(N / MMQ_BM) with weight-row
// tile t % ceil(N / MMQ_BM). The host cuts each expert's rows into whole tiles of tile_rows
// rows, the last what remains (fast/tiles.py row_tiles), or a kernel cuts them so on the device
// from the routing tables (fast/tiles.py routed_row_lists: the list then ends in empty entries,
// see MMQ_EMPTY_EXIT);
// how rows are cut changes which CTA computes an output element, never its arithmetic. This
// serves the expert cache read in place: a layer's resident experts in one launch, no gather
// (fast/walk.py, in_place and device_plan).
//
// Tiling: a CTA computes MMQ_BM weight rows x (up to) MMQ_BN activation rows of one expert.
// The bounds path cuts an expert's rows into ceil(rows / tile_rows) tiles of equal size (a
// multiple of 8); a tile list brings its own cut (above).
// 16*MMQ_WM x MMQ_BN per CTA, MMQ_WM x MMQ_WN warps; warp (wm, wn) owns weight rows
// wm*16..wm*16+15 and the activation n8 tiles wn, wn+WN, wn+2WN, ...
// K is walked in chunks of 128 values (one q8_1 block: four blocks of a 32-value type, two of
// NVFP4's 64; half a super-block for the 256-value types, the K-quants and the IQ types, whose
// raw chunk is then the whole 256-value block): raw
// weight bytes (16-byte pieces from the 16-aligned address below the chunk) and activation
// blocks are copied with cp.async into a ring of MMQ_STAGES slots (Geo::STAGES: fewer where a
// type's blocks do not fit; a 256-value type's block is copied once, with its first chunk, into
// a ring of its own, see raw_slots), the weights are decoded to int8 codes + float scales in shared
// memory, then ldmatrix + mma.sync. Because of the 16-byte pieces the kernel may read
// up to 15 bytes before a matrix's first row and after its last one: callers keep the group
// buffer's tail (16 bytes) allocated.
//
// Integer -> float: the mma accumulator starts at the bits of 1.5*2^23 (0x4B400000); for a
// dot product S with |S| < 2^22 the result's bits are the float 1.5*2^23 + S exactly, so
// (float)S = __int_as_float(D) - 12582912.0f (exact). Sub-scales are applied in float on
// exact integers below 2^24 (u * S, u0 * S0 + u1 * S1): the same value as (float)sumi.

//
// Its speed and what bounds it (the contract's epilogue is about half of its instructions; the
// decode, the staging and the chunk barrier hold most of its stalls) are measured in
// docs/performance.md, "What limits each kernel" and "Figures from the kernels' comments";
// earlier measurements are in docs/results/.

#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>
#include "strata_numerics.cuh"  // MAGIC_I, MAGIC_F
// QT_*, LAYOUT_*, TAB_*, QFormat<QT> and MMQ_KERNELS: written from contract/qformats.py at compile
// time (fast/cuda/generated.py; no file of this name): every fact of a format the host also
// knows (type numbers, block sizes, q8_1 layouts, half-field offsets, scale factors, the table
// buffer's offsets, the kernel names) comes from there, so the two cannot disagree.
#include "qformats.cuh"

#ifndef MMQ_WM
#define MMQ_WM 8
#endif
#ifndef MMQ_WN
#define MMQ_WN 2
#endif
#ifndef MMQ_BN
#define MMQ_BN 128
#endif
#ifndef MMQ_STAGES
#define MMQ_STAGES 4
#endif
// The decoded chunk (codes and scales) is double-buffered, so warps decode chunk kc+1 while
// others still multiply chunk kc: one barrier per chunk; the staging ring needs 3 slots.
static_assert(MMQ_STAGES >= 3, "double-buffered decode needs MMQ_STAGES >= 3");
// CTAs per SM asked of the compiler (__launch_bounds__ min blocks): caps registers per thread.
#ifndef MMQ_MINB
#define MMQ_MINB 1
#endif
// The decode mixed into the products: when this chunk and the next are whole (4 blocks, all BM
// weight rows) and the tile holds more than MMQ_MIX_MIN activation rows, the next chunk's
// decode (weights and activation scales) is written inside this chunk's unrolled products,
// before block MMQ_MIX_AT, with no branch, so the compiler interleaves its dependent
// shared-memory loads with the epilogue's float work instead of every warp stalling on them
// before the products; other chunks decode before the products, as a loop with bound checks.
// The decode writes the other buffer of the pair the products read, between the same two
// barriers either way: same bytes. Tiles of few rows keep the checked form: their products are
// too short to hide the decode, and the unchecked one copies scales for all BN rows
// (docs/performance.md).
#ifndef MMQ_MIX_AT
#define MMQ_MIX_AT 2
#endif
// the mixed decode applies to tiles of more than MMQ_MIX_MIN activation rows (default
// MMQ_BN / 2; 0: every whole tile)
#ifndef MMQ_MIX_MIN
#define MMQ_MIX_MIN (MMQ_BN / 2)
#endif
// MMQ_ASC_PAIRED 1: where a type reads two activation-scale arrays (da and a sum: Q4_K, Q5_K,
// Q4_1, Q5_1), they are interleaved by pair of activation rows (asc_at), so the products read
// both arrays' values of the two rows a thread's outputs take in one 16-byte load; 0: the
// arrays apart (the earlier layout, for an A/B).
#ifndef MMQ_ASC_PAIRED
#define MMQ_ASC_PAIRED 1
#endif
// MMQ_EMPTY_EXIT 1: the tile-list form of a list cut on the device from the routing tables
// (routing_tables.cu routed_row_tiles, for device_plan). The host knows the list only as a
// worst-case count and a configuration the counts may not choose: it launches one list per
// configuration the counts could call for, each over its worst case, and the cut writes each
// list's live entries to `live` (0 for the lists not chosen). The launch reads that count
// first: a CTA past it returns before it loads anything, the CTAs that remain walk the live
// tiles (the grid may be smaller than the tiles: a CTA takes tile, tile + gridDim.x, ...), and
// an empty entry is skipped. Without the define (every other launch, live NULL) the kernels are
// compiled as before.
#ifndef MMQ_EMPTY_EXIT
#define MMQ_EMPTY_EXIT 0
#endif
#define MMQ_DBUF 2
#define MMQ_NT (32 * MMQ_WM * MMQ_WN)
#define MMQ_BM (16 * MMQ_WM)
#define MMQ_NT8 (MMQ_BN / (8 * MMQ_WN))
#define MMQ_MAX_EXP 16
// dynamic shared memory a CTA may take on sm_90 (227 KB, less 1 KB the runtime reserves)
#define MMQ_SMEM_MAX (232448 - 1024)
// the dynamic shared memory under which MMQ_MINB CTAs fit an SM: its 228 KB shared by MMQ_MINB,
// less the 1 KB the runtime reserves for each and at most 512 bytes the kernel declares itself
// (s_pre .. s_nrt, aligned)
#define MMQ_CTA_FIT (233472 / MMQ_MINB - 1024 - 512)

// Table buffer (uploaded by fast/cuda/products.py from strata_prefill.contract.qformats; offsets TAB_*, bytes
// TABLEN_*): at TAB_SIGN the sign masks, 128 entries x 8 bytes, 0xFF where the sign table says
// -1; then each IQ grid at TAB_<its name>: int8 entries (IQ2_XS 512 x 8, IQ3_XXS 256 x 4, IQ3_S
// 512 x 4, IQ2_XXS 256 x 8, IQ2_S 1024 x 8), and the IQ1 grid (2048 x 8 of -1, 0, 1, IQ1_S's and
// IQ1_M's) as one uint32 an entry, g + 1 of value k in nibble k (strata_prefill.contract.qformats._IQ1Format.table).
// A CTA stages in shared memory only what its type's decode reads (Staged<QT>): the sign masks
// where its signs index them (SIGNS), then its own grid: at most 8 KB (IQ2_S's grid, and IQ1's as
// nibbles rather than 16 KB of int8 entries, so that the largest tiles keep 2 CTAs an SM). Shared
// memory and not global loads through L1: every lane of a warp decodes a different weight row,
// so a grid load is 32 scattered entries, a few bank conflicts in shared memory but up to 32
// separate L1 wavefronts from global memory; and the decode runs inside the products' unrolled
// body, where a load's latency is what stalls the warp.


static_assert(MMQ_NT8 % 2 == 0, "need an even number of n8 tiles per warp");

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
// llama-quantize's mixes (contract/kquants.py). Q4_0, Q5_0: PLAIN with signed codes, as Q8_0.
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
// The grid types of llama-quantize's IQ file types, PLAIN with odd sub-scales as the three above:
// IQ2_XXS and IQ1_S one sub-scale per 32 values, as IQ3_XXS (aux: u); IQ2_S and IQ1_M one per 16,
// split as IQ2_XS (aux: u0, u1).
template <> struct Tr<QT_IQ2_XXS> : QFormat<QT_IQ2_XXS> { enum { SPLIT = 0, NAUX = 1, ASUM = 0 }; };
template <> struct Tr<QT_IQ2_S>   : QFormat<QT_IQ2_S>   { enum { SPLIT = 1, NAUX = 2, ASUM = 0 }; };
template <> struct Tr<QT_IQ1_S>   : QFormat<QT_IQ1_S>   { enum { SPLIT = 0, NAUX = 1, ASUM = 0 }; };
template <> struct Tr<QT_IQ1_M>   : QFormat<QT_IQ1_M>   { enum { SPLIT = 1, NAUX = 2, ASUM = 0 }; };

// The codebook types (contract/codebooks.py), codes from a 16-entry codebook. IQ4_NL, MXFP4: PLAIN
// as Q8_0. IQ4_XS: PLAIN with one signed sub-scale per 32 values, as IQ3_S (aux: u). NVFP4: the
// HALVES epilogue, a float scale per 16 values, split (aux: dw1, the second half's scale).
template <> struct Tr<QT_IQ4_NL>  : QFormat<QT_IQ4_NL>  { enum { SPLIT = 0, NAUX = 0, ASUM = 0 }; };
template <> struct Tr<QT_IQ4_XS>  : QFormat<QT_IQ4_XS>  { enum { SPLIT = 0, NAUX = 1, ASUM = 0 }; };
template <> struct Tr<QT_MXFP4>   : QFormat<QT_MXFP4>   { enum { SPLIT = 0, NAUX = 0, ASUM = 0 }; };
template <> struct Tr<QT_NVFP4>   : QFormat<QT_NVFP4>   { enum { SPLIT = 1, NAUX = 1, ASUM = 0 }; };

// What a CTA of type QT stages of the table buffer, in shared memory from byte 0: the sign masks
// at SIGN (where SIGNS), its grid at GRID; BYTES in all (0: a type without a grid).
template <int QT, bool T = Tr<QT>::TAB> struct Staged { enum { SIGN = 0, GRID = 0, BYTES = 0 }; };
template <int QT> struct Staged<QT, true> {
    enum { SIGN = 0, GRID = Tr<QT>::SIGNS ? TABLEN_SIGN : 0, BYTES = GRID + Tr<QT>::GRID_BYTES };
    static_assert(TAB_SIGN % 16 == 0 && TABLEN_SIGN % 16 == 0 && Tr<QT>::GRID % 16 == 0 &&
                  Tr<QT>::GRID_BYTES % 16 == 0, "the table is staged in 16-byte pieces");
};

// Slots of the raw weight ring for a staging ring of `stages` chunks: one a chunk, or, for a
// 256-value type, one a block. Both chunks of a 256-value block decode it, so it is copied once,
// with the even chunk: half the weight copies of a copy a chunk, and for the K-quants at BN 128
// a CTA small enough that two fit an SM (docs/performance.md; the decode reads the same staged
// bytes). Block b (chunks 2b, 2b + 1) is issued with chunk 2b at the end of chunk 2b - stages's
// products; by then chunks up to 2b - stages + 1 are decoded, so the blocks still read are those
// from chunk 2b - stages + 2 on: with the new one, at most ceil(stages / 2) of them.
template <int QT> constexpr int raw_slots(int stages) {
    return Tr<QT>::VPB > 128 ? (stages + 1) / 2 : stages;
}

// The shared-memory layout of a CTA of type QT. DW_ROW: a 256-value type's block scale dw, the
// same for the four 32-value blocks of a chunk, kept once a weight row in the decoded scales,
// not once a block. Geo<QT> takes it only where the layout would otherwise be too large for
// MMQ_MINB CTAs an SM (Q5_K at the big tiles): there it won its A/B; a type that fits either way
// was as fast or faster without it (docs/results/2026-12-06-mmq-raw-once.md).
template <int QT, bool DW_ROW> struct GeoOf {
    enum {
        KC = 128,
        NBLK = 4,
        // raw bytes of one chunk of one row: 128 / VPB blocks (VPB 32, 64), or the whole 256-value block
        CB = (Tr<QT>::VPB <= 128) ? (128 / Tr<QT>::VPB) * Tr<QT>::BS : Tr<QT>::BS,
        // the chunk's start within its 16-byte piece: 0..14 (blocks of an even size in 2-byte
        // aligned buffers), 0..15 for a block of an odd size (MXFP4's 17 bytes: rows start anywhere)
        OMAX = (Tr<QT>::BS % 2) ? 15 : 14,
        PMAX = (CB + OMAX + 15) / 16,                             // 16-byte pieces
        RAWB = PMAX * 16 + ((PMAX % 2) ? 0 : 16),                 // staged bytes per row (odd x 16)
        ASTR = 144,                                               // act row stride in smem
        WSTR = KC + 16,                                           // decoded weight row stride
        NAA = (Tr<QT>::LAY == LAYOUT_D4) ? 1 + Tr<QT>::ASUM : ((Tr<QT>::LAY == LAYOUT_DS4) ? 2 : 3),  // act scale arrays
        TABB = Staged<QT>::BYTES,
        WDEC_B = MMQ_BM * WSTR,                                   // bytes of one decoded buffer
        // one weight-scale buffer: dw at [j * DW_J + row], aux a at [AUX0 + (a * NBLK + j) * BM + row]
        DW_J = DW_ROW ? 0 : MMQ_BM,
        AUX0 = DW_J ? NBLK * MMQ_BM : MMQ_BM,
        WSC_F = AUX0 + Tr<QT>::NAUX * NBLK * MMQ_BM,              // floats of one weight-scale buffer
        ASC_F = NAA * NBLK * MMQ_BN,                              // floats of one act-scale buffer
        // The staging ring's slots: MMQ_STAGES, or 3 (the least, above) for a type whose staged
        // blocks are too large for MMQ_STAGES at these tiles (`python3 -m dev.mmq_occupancy
        // --config JSON` shows each type's bytes). The ring's depth decides how far ahead chunks
        // are copied, never a bit of a result.
        RAW_B = MMQ_BM * RAWB,                                    // one raw slot
        ACT_B = MMQ_BN * ASTR,                                    // one activation slot
        UNSTAGED_B = TABB + MMQ_DBUF * (WDEC_B + 4 * WSC_F + 4 * ASC_F),
        STAGES = (UNSTAGED_B + raw_slots<QT>(MMQ_STAGES) * RAW_B + MMQ_STAGES * ACT_B <= MMQ_SMEM_MAX)
                     ? MMQ_STAGES : 3,
        RSLOTS = raw_slots<QT>(STAGES),
        RAW_ONCE = RSLOTS != STAGES,                              // a raw slot a block, not a chunk
        OFF_RAW = TABB,
        OFF_ACT = OFF_RAW + RSLOTS * RAW_B,
        OFF_WDEC = OFF_ACT + STAGES * MMQ_BN * ASTR,
        OFF_WSC = OFF_WDEC + MMQ_DBUF * WDEC_B,
        OFF_ASC = OFF_WSC + MMQ_DBUF * WSC_F * 4,
        SMEM = OFF_ASC + MMQ_DBUF * ASC_F * 4,
    };
    static_assert(SMEM <= MMQ_SMEM_MAX, "shared memory over the sm_90 limit");
};
template <int QT>
struct Geo : GeoOf<QT, ((Tr<QT>::VPB > 128) && (GeoOf<QT, false>::SMEM > MMQ_CTA_FIT))> {};

// Where array a (0: da; 1, 2: the sums) of the activation scales of block j, activation row r
// lies in an act-scale buffer. A type of two arrays keeps them interleaved by pair of rows,
// {da[r], da[r + 1], s[r], s[r + 1]} for even r (MMQ_ASC_PAIRED); otherwise array a is [a][j][BN].
template <int QT> __host__ __device__ constexpr bool asc_paired() { return MMQ_ASC_PAIRED && GeoOf<QT, false>::NAA == 2; }
template <int QT> __device__ __forceinline__ int asc_at(int j, int a, int r) {
    if constexpr (asc_paired<QT>())
        return j * 2 * MMQ_BN + (r >> 1) * 4 + a * 2 + (r & 1);
    else
        return (a * 4 + j) * MMQ_BN + r;
}

// The types whose staging copies recompute each 16-byte piece's offsets at every issue, from the
// thread index passed through an empty asm the compiler cannot see through. Left to itself,
// ptxas hoists the offsets out of the tile loop and, for Q6_K at the big tiles, spills them to the
// stack, reloaded before every tile's copies; recomputed, the copies wait on no such load
// (docs/performance.md, "Q6_K's staging offsets"). Q4_K and Q8_0 spill nothing there, and the
// recompute gives them a stack frame, so they keep the hoisted form.
template <int QT> __host__ __device__ constexpr bool stage_offsets_recomputed() { return QT == QT_Q6_K; }

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
// every type here: IQ2_XS 31 * 16 * 127 * 43, IQ3_XXS 31 * 32 * 127 * 62, Q2_K 15 * 16 * 127 * 3,
// IQ2_XXS 31 * 32 * 127 * 43, IQ2_S 31 * 16 * 127 * 43, IQ1_S 15 * 32 * 127 * 9, IQ1_M 15 * 16 * 127 * 9).
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

// The 8 codes 8*g + s (s = +1, or -1 where neg) of IQ1 grid entry e (as staged: value k's
// t = g + 1, 0..2, in nibble k) in two words. __byte_perm(w, 0, sel) gives output byte n byte
// (nibble n of sel) & 7 of the pair: a nibble t picks byte t of w, which holds the three codes of
// the sign: -7, 1, 9 (s = +1) or -9, -1, 7 (s = -1), i.e. 8 (t - 1) + s. Values 0..3 from e's low
// half, 4..7 from its high half: two byte permutes a grid entry.
__device__ __forceinline__ void iq1_codes(uint32_t e, bool neg, uint32_t& lo, uint32_t& hi) {
    const uint32_t w = neg ? 0x0007FFF7u : 0x000901F9u;  // bytes -9 -1 7 0 / -7 1 9 0
    lo = __byte_perm(w, 0, e);
    hi = __byte_perm(w, 0, e >> 16);
}

// ---- the codebook types (contract/codebooks.py): each type's decode its own function, of
// decode_unit's interface (rowb, o, j: the staged row, the chunk's offset, the 32-block; c, dw,
// aux out), so either core can call it.

// The codes of the 8 nibbles of q from QT's 16-entry codebook (QFormat CODEBOOK0..3: entry 4w + b
// in byte b of word w): lo gets the low nibbles' codes (byte i from q's byte i), hi the high
// nibbles'. __byte_perm(x, y, s) takes, for result byte k, byte (nibble k of s) & 7 of the pair
// (x: bytes 0..3, y: 4..7): an index's low three bits pick among entries 0..7 (words 0, 1) and
// 8..15 (words 2, 3), its bit 3 (moved to bit 2) between the two picks. The 16-bit selector of
// q's bytes 2h, 2h+1 orders their nibbles low, high, low, high; the last two permutes part them.
template <int QT>
__device__ __forceinline__ void codebook8(uint32_t q, uint32_t& lo, uint32_t& hi) {
    uint32_t r[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint32_t s = q >> (16 * h);
        const uint32_t a = __byte_perm(QFormat<QT>::CODEBOOK0, QFormat<QT>::CODEBOOK1, s);
        const uint32_t b = __byte_perm(QFormat<QT>::CODEBOOK2, QFormat<QT>::CODEBOOK3, s);
        r[h] = __byte_perm(a, b, 0x3210u | ((s & 0x8888u) >> 1));
    }
    lo = __byte_perm(r[0], r[1], 0x6420u);
    hi = __byte_perm(r[0], r[1], 0x7531u);
}
// MXFP4's scale: e8m0 byte e as ggml's e8m0_to_fp32_half, 2^(e - 128) from its bits (e < 2: the
// subnormals 2^-128 and 2^-127, kept).
__device__ __forceinline__ float e8m0_half(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}
// NVFP4's scale: ue4m3 byte x times 0.5 (ggml's ue4m3_to_fp32): exponent E = bits 3..6, mantissa
// M = bits 0..2 (bit 7 ignored); M * 2^-10 for E = 0, (1 + M/8) * 2^(E - 8) else, from its bits;
// 0x7F gives 0. Every one is exact.
__device__ __forceinline__ float ue4m3_half(uint32_t x) {
    const uint32_t e = (x >> 3) & 15, m = x & 7;
    const float v = e ? __uint_as_float(((e + 119) << 23) | (m << 20)) : (float)m * 0.0009765625f;
    return x == 0x7Fu ? 0.0f : v;
}
// The 32 codes of a block whose 16 index bytes are at p: value i < 16 the low nibble of byte i,
// 16 + i its high nibble (IQ4_NL's and MXFP4's qs, one of IQ4_XS's 32-blocks).
template <int QT>
__device__ __forceinline__ void codebook32(const uint8_t* rowb, int p, uint32_t (&c)[8]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) codebook8<QT>(ldw(rowb, p + 4 * k), c[k], c[k + 4]);
}
// IQ4_NL: d, qs[16].
template <int QT>
__device__ __forceinline__ void decode_iq4_nl(const uint8_t* rowb, int o, int j, uint32_t (&c)[8], float& dw,
                                              float (&aux)[5]) {
    const int p = o + Tr<QT>::BS * j;
    dw = h2f(ldh(rowb, p + Tr<QT>::HALF_D));
    codebook32<QT>(rowb, p + 2, c);
}
// MXFP4: e (e8m0), qs[16].
template <int QT>
__device__ __forceinline__ void decode_mxfp4(const uint8_t* rowb, int o, int j, uint32_t (&c)[8], float& dw,
                                             float (&aux)[5]) {
    const int p = o + Tr<QT>::BS * j;
    dw = e8m0_half(ldb(rowb, p));
    codebook32<QT>(rowb, p + 1, c);
}
// IQ4_XS: d, scales_h u16, scales_l[4], qs[128]; 32-block j's 6-bit scale ls is nibble j & 1 of
// scales_l[j >> 1] under bits 2j .. 2j+1 of scales_h, u = ls - 32; its codes from qs[16j .. 16j+15].
template <int QT>
__device__ __forceinline__ void decode_iq4_xs(const uint8_t* rowb, int o, int j, uint32_t (&c)[8], float& dw,
                                              float (&aux)[5]) {
    dw = h2f(ldh(rowb, o + Tr<QT>::HALF_D));
    const uint32_t lo = (ldb(rowb, o + 4 + (j >> 1)) >> (4 * (j & 1))) & 15;
    const uint32_t hi = (ldh(rowb, o + 2) >> (2 * j)) & 3;
    aux[0] = (float)((int)(lo | (hi << 4)) - 32);  // u, -32..31
    codebook32<QT>(rowb, o + 8 + 16 * j, c);
}
// NVFP4: d[4] (ue4m3, one per 16 values), qs[32]; 32-block j is half j & 1 of 64-value block
// j >> 1: its 16-value sub-blocks s = 2 (j & 1) + e take scale byte s and, as values 16e ..
// 16e+15, the low nibbles of qs[8s .. 8s+7], then their high nibbles. dw: the first half's
// scale, aux[0] the second's (HALVES).
template <int QT>
__device__ __forceinline__ void decode_nvfp4(const uint8_t* rowb, int o, int j, uint32_t (&c)[8], float& dw,
                                             float (&aux)[5]) {
    const int p = o + Tr<QT>::BS * (j >> 1), h = j & 1;
    dw = ue4m3_half(ldb(rowb, p + 2 * h));
    aux[0] = ue4m3_half(ldb(rowb, p + 2 * h + 1));
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int q = p + 4 + 16 * h + 8 * e;
        codebook8<QT>(ldw(rowb, q), c[4 * e], c[4 * e + 2]);
        codebook8<QT>(ldw(rowb, q + 4), c[4 * e + 1], c[4 * e + 3]);
    }
}

// Decode 32-block j (of this chunk) of one staged row. rowb: staged words of the row;
// o: byte offset of the chunk's first byte in rowb. tab: the type's staged tables in shared
// memory (Staged<QT>).
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
            const uint2 g = *reinterpret_cast<const uint2*>(tab + Staged<QT>::GRID + 8 * (q & 511));
            const uint2 m = *reinterpret_cast<const uint2*>(tab + Staged<QT>::SIGN + 8 * (q >> 9));
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
            const uint2 m = *reinterpret_cast<const uint2*>(tab + Staged<QT>::SIGN + 8 * ((a32 >> (7 * l)) & 127));
            const uint32_t i1 = ldb(rowb, o + 2 + 8 * j + 2 * l);
            const uint32_t i2 = ldb(rowb, o + 2 + 8 * j + 2 * l + 1);
            const uint32_t g1 = *reinterpret_cast<const uint32_t*>(tab + Staged<QT>::GRID + 4 * i1);
            const uint32_t g2 = *reinterpret_cast<const uint32_t*>(tab + Staged<QT>::GRID + 4 * i2);
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
            const uint32_t g1 = *reinterpret_cast<const uint32_t*>(tab + Staged<QT>::GRID + 4 * i1);
            const uint32_t g2 = *reinterpret_cast<const uint32_t*>(tab + Staged<QT>::GRID + 4 * i2);
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
    } else if constexpr (QT == QT_IQ4_NL) {  // the codebook types: their functions above
        decode_iq4_nl<QT>(rowb, o, j, c, dw, aux);
    } else if constexpr (QT == QT_IQ4_XS) {
        decode_iq4_xs<QT>(rowb, o, j, c, dw, aux);
    } else if constexpr (QT == QT_MXFP4) {
        decode_mxfp4<QT>(rowb, o, j, c, dw, aux);
    } else if constexpr (QT == QT_NVFP4) {
        decode_nvfp4<QT>(rowb, o, j, c, dw, aux);
    }
    // ---- the grid types of llama-quantize's IQ file types (contract/qformats.py, after the K-quants)
    else if constexpr (QT == QT_IQ2_XXS) {
        // d, then per 32-block j 8 bytes at 2 + 8j: 4 grid indices (one per 8 values), a u32 of
        // four 7-bit sign indices and the scale in bits 28..31
        dw = h2f(ldh(rowb, o + Tr<QT>::HALF_D)) * Tr<QT>::DW_FACTOR;
        const uint32_t q4 = ldw(rowb, o + 2 + 8 * j), a32 = ldw(rowb, o + 6 + 8 * j);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint2 g = *reinterpret_cast<const uint2*>(tab + Staged<QT>::GRID + 8 * ((q4 >> (8 * l)) & 255));
            const uint2 m = *reinterpret_cast<const uint2*>(tab + Staged<QT>::SIGN + 8 * ((a32 >> (7 * l)) & 127));
            c[2 * l] = sgn(g.x, m.x);
            c[2 * l + 1] = sgn(g.y, m.y);
        }
        aux[0] = (float)(2 * (a32 >> 28) + 1);
    } else if constexpr (QT == QT_IQ2_S) {
        // d, qs[32] (index bits 0..7), signs[32] (a bit a value), qh[8] (index bits 8..9 of
        // entry 4j + l at bits 2l of byte j), scales[8] (a nibble per 16 values)
        dw = h2f(ldh(rowb, o + Tr<QT>::HALF_D)) * Tr<QT>::DW_FACTOR;
        const uint32_t q4 = ldw(rowb, o + 2 + 4 * j), s4 = ldw(rowb, o + 34 + 4 * j), qh = ldb(rowb, o + 66 + j);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t i = ((q4 >> (8 * l)) & 255) | (((qh >> (2 * l)) & 3) << 8);
            const uint2 g = *reinterpret_cast<const uint2*>(tab + Staged<QT>::GRID + 8 * i);
            const uint32_t sb = (s4 >> (8 * l)) & 255;
            c[2 * l] = sgn(g.x, expand4(sb & 15));
            c[2 * l + 1] = sgn(g.y, expand4(sb >> 4));
        }
        const uint32_t sc = ldb(rowb, o + 74 + j);
        aux[0] = (float)(2 * (sc & 15) + 1);
        aux[1] = (float)(2 * (sc >> 4) + 1);
    } else if constexpr (QT == QT_IQ1_S) {
        // d, qs[32] (index bits 0..7), qh u16[8] at 34: per 32-block j the index bits 8..10 of
        // entry 4j + l at bits 3l, the 3-bit scale at 12, the delta's sign at 15
        dw = h2f(ldh(rowb, o + Tr<QT>::HALF_D)) * Tr<QT>::DW_FACTOR;
        const uint32_t q4 = ldw(rowb, o + 2 + 4 * j), qh = ldh(rowb, o + 34 + 2 * j);
        const bool neg = (qh >> 15) != 0;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t i = ((q4 >> (8 * l)) & 255) | (((qh >> (3 * l)) & 7) << 8);
            iq1_codes(*reinterpret_cast<const uint32_t*>(tab + Staged<QT>::GRID + 4 * i), neg, c[2 * l], c[2 * l + 1]);
        }
        aux[0] = (float)(2 * ((qh >> 12) & 7) + 1);
    } else if constexpr (QT == QT_IQ1_M) {
        // qs[32] (index bits 0..7), qh[16] (a nibble per entry: index bits 8..10, the delta's
        // sign at bit 3), scales u16[4] at 48: 3-bit scale of 16 values 16 (4w + m) at bits 3m of
        // word w, and bits 12..15 of word w are bits 4w..4w+3 of the half d
        const uint32_t s01 = ldw(rowb, o + 48), s23 = ldw(rowb, o + 52);
        const uint32_t d = ((s01 >> 12) & 0xFu) | ((s01 >> 24) & 0xF0u) | ((s23 >> 4) & 0xF00u) | ((s23 >> 16) & 0xF000u);
        dw = h2f(d) * Tr<QT>::DW_FACTOR;
        const uint32_t q4 = ldw(rowb, o + 4 * j), qh = ldh(rowb, o + 32 + 2 * j);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t nib = (qh >> (4 * l)) & 15;
            const uint32_t i = ((q4 >> (8 * l)) & 255) | ((nib & 7) << 8);
            iq1_codes(*reinterpret_cast<const uint32_t*>(tab + Staged<QT>::GRID + 4 * i), (nib & 8) != 0, c[2 * l],
                      c[2 * l + 1]);
        }
        // word j >> 1 (the high half of s01 or s23 where it is odd), bits 6 (j & 1) .. + 5
        const uint32_t sc = (((j >> 2) ? s23 : s01) >> (16 * ((j >> 1) & 1) + 6 * (j & 1))) & 63;
        aux[0] = (float)(2 * (sc & 7) + 1);
        aux[1] = (float)(2 * (sc >> 3) + 1);
    }
}

// ------------------------------------------------------------------ epilogues
// One n8 tile of one 32-block: ac[e] for (weight row A|B, activation column col|col+1).
// xA/xB: the weight rows' extra scales (see decode_unit); da, s: the columns' scales and, for a
// type of two activation arrays, their second (asc_at); asc: the act-scale buffer (Q2_K's sums).

template <int QT, int NX>
__device__ __forceinline__ void epi_one(float (&ac)[4], const int (&d)[4], float dwA, float dwB,
                                        const float (&xA)[NX], const float (&xB)[NX], float2 da, float2 s) {
    if constexpr (QT == QT_Q8_0 || QT == QT_Q4_0 || QT == QT_Q5_0) {
        ac[0] = ac[0] + (dwA * da.x) * ifl(d[0]);
        ac[1] = ac[1] + (dwA * da.y) * ifl(d[1]);
        ac[2] = ac[2] + (dwB * da.x) * ifl(d[2]);
        ac[3] = ac[3] + (dwB * da.y) * ifl(d[3]);
    } else if constexpr (QT == QT_IQ3_XXS || QT == QT_IQ3_S || QT == QT_IQ2_XXS || QT == QT_IQ1_S) {
        ac[0] = ac[0] + (dwA * da.x) * sub_sum(xA, 0, d[0]);
        ac[1] = ac[1] + (dwA * da.y) * sub_sum(xA, 0, d[1]);
        ac[2] = ac[2] + (dwB * da.x) * sub_sum(xB, 0, d[2]);
        ac[3] = ac[3] + (dwB * da.y) * sub_sum(xB, 0, d[3]);
    } else if constexpr (QT == QT_Q4_1 || QT == QT_Q5_1) {
        // s: the activation's block sums sa
        ac[0] = ac[0] + ((dwA * da.x) * ifl(d[0]) + xA[0] * s.x);
        ac[1] = ac[1] + ((dwA * da.y) * ifl(d[1]) + xA[0] * s.y);
        ac[2] = ac[2] + ((dwB * da.x) * ifl(d[2]) + xB[0] * s.x);
        ac[3] = ac[3] + ((dwB * da.y) * ifl(d[3]) + xB[0] * s.y);
    } else if constexpr (QT == QT_Q4_K || QT == QT_Q5_K) {
        // x: u v mw; s: the activation's integer 32-block sums (prep, ASUM). mi = v * sum is
        // exact (63 * 32 * 127 < 2^24), as sumi = u * S is (63 * 32 * 31 * 127 < 2^24, Q5_K's)
        const float mi0 = xA[1] * s.x, mi1 = xA[1] * s.y, mi2 = xB[1] * s.x, mi3 = xB[1] * s.y;
        ac[0] = ac[0] + ((dwA * da.x) * sub_sum(xA, 0, d[0]) - (xA[2] * da.x) * mi0);
        ac[1] = ac[1] + ((dwA * da.y) * sub_sum(xA, 0, d[1]) - (xA[2] * da.y) * mi1);
        ac[2] = ac[2] + ((dwB * da.x) * sub_sum(xB, 0, d[2]) - (xB[2] * da.x) * mi2);
        ac[3] = ac[3] + ((dwB * da.y) * sub_sum(xB, 0, d[3]) - (xB[2] * da.y) * mi3);
    } else if constexpr (QT == QT_IQ4_NL || QT == QT_MXFP4) {  // PLAIN, unit sub-scales: Q8_0's
        epi_one<QT_Q8_0>(ac, d, dwA, dwB, xA, xB, da, s);
    } else if constexpr (QT == QT_IQ4_XS) {  // PLAIN, one sub-scale per 32 values (x: u): IQ3_S's
        epi_one<QT_IQ3_S>(ac, d, dwA, dwB, xA, xB, da, s);
    }
}

template <int QT, int NX>
__device__ __forceinline__ void epi_split(float (&ac)[4], const int (&d0)[4], const int (&d1)[4], float dwA,
                                          float dwB, const float (&xA)[NX], const float (&xB)[NX], float2 da,
                                          const float* asc, int j, int col) {
    if constexpr (QT == QT_IQ2_XS || QT == QT_Q6_K || QT == QT_Q3_K || QT == QT_IQ2_S || QT == QT_IQ1_M) {
        ac[0] = ac[0] + (dwA * da.x) * (sub_sum(xA, 0, d0[0]) + sub_sum(xA, 1, d1[0]));
        ac[1] = ac[1] + (dwA * da.y) * (sub_sum(xA, 0, d0[1]) + sub_sum(xA, 1, d1[1]));
        ac[2] = ac[2] + (dwB * da.x) * (sub_sum(xB, 0, d0[2]) + sub_sum(xB, 1, d1[2]));
        ac[3] = ac[3] + (dwB * da.y) * (sub_sum(xB, 0, d0[3]) + sub_sum(xB, 1, d1[3]));
    } else if constexpr (QT == QT_Q2_K) {
        // x: u0 u1 v0 v1 mw; asc[1], asc[2]: integer sums of the activation halves
        const float2 s0 = *reinterpret_cast<const float2*>(asc + asc_at<QT>(j, 1, col));
        const float2 s1 = *reinterpret_cast<const float2*>(asc + asc_at<QT>(j, 2, col));
        const float mi0 = xA[2] * s0.x + xA[3] * s1.x, mi1 = xA[2] * s0.y + xA[3] * s1.y;
        const float mi2 = xB[2] * s0.x + xB[3] * s1.x, mi3 = xB[2] * s0.y + xB[3] * s1.y;
        ac[0] = ac[0] + ((dwA * da.x) * (sub_sum(xA, 0, d0[0]) + sub_sum(xA, 1, d1[0])) - (xA[4] * da.x) * mi0);
        ac[1] = ac[1] + ((dwA * da.y) * (sub_sum(xA, 0, d0[1]) + sub_sum(xA, 1, d1[1])) - (xA[4] * da.y) * mi1);
        ac[2] = ac[2] + ((dwB * da.x) * (sub_sum(xB, 0, d0[2]) + sub_sum(xB, 1, d1[2])) - (xB[4] * da.x) * mi2);
        ac[3] = ac[3] + ((dwB * da.y) * (sub_sum(xB, 0, d0[3]) + sub_sum(xB, 1, d1[3])) - (xB[4] * da.y) * mi3);
    } else if constexpr (QT == QT_NVFP4) {
        // HALVES (x: dw1): (dw0 * da) * S0 + (dw1 * da) * S1, each half's sum from the magic bits
        // (|S| <= 16 * 127 * 12), scaled by its own float
        ac[0] = ac[0] + ((dwA * da.x) * ifl(d0[0]) + (xA[0] * da.x) * ifl(d1[0]));
        ac[1] = ac[1] + ((dwA * da.y) * ifl(d0[1]) + (xA[0] * da.y) * ifl(d1[1]));
        ac[2] = ac[2] + ((dwB * da.x) * ifl(d0[2]) + (xB[0] * da.x) * ifl(d1[2]));
        ac[3] = ac[3] + ((dwB * da.y) * ifl(d0[3]) + (xB[0] * da.y) * ifl(d1[3]));
    }
}

// ------------------------------------------------------------------ the kernel body
// Built for issue rate and latency:
// - the products of one chunk run in a branch-free unrolled body, templated on the warp's
//   number of n8 tile pairs (P) and on whether the chunk holds all 4 blocks: every ldmatrix
//   of a 32-block is issued up front, and pair p+1's mma is issued before pair p's epilogue,
//   so tensor, shared-memory and FP32 latencies overlap within a warp; the warp's tile count
//   selects the unrolled body;
// - activation staging is one linear copy (the chunk's rows are contiguous in the q8_1
//   buffer and the shared row stride is the global one); weight staging uses per-thread piece
//   offsets fixed for the whole launch;
// - MMQ_MINB CTAs per SM in __launch_bounds__ (registers <= 64K / (MMQ_NT * MMQ_MINB)).

// MID: call mid() (the next chunk's decode, mixed in) inside the unrolled body, before block MMQ_MIX_AT.
template <int QT, int T, bool FULL, bool MID, class F>
__device__ __forceinline__ void mmq2_chunk(float (&acc)[MMQ_NT8][4], uint32_t wdec_s, const float* wsc,
                                           const float* asc, uint32_t act_s, int jlim, uint32_t a_off,
                                           int lane, int wn, int rA, int rB, F&& mid) {
    constexpr int NBLK = 4, BM = MMQ_BM, BN = MMQ_BN, WN = MMQ_WN, ASTR = 144;
    constexpr int NAUX = Tr<QT>::NAUX;
    constexpr bool SPL = Tr<QT>::SPLIT;
    constexpr int P = (T + 1) / 2;  // ldmatrix x4 loads (tile pairs)
    const int t4 = lane & 3;
#pragma unroll
    for (int j = 0; j < NBLK; ++j) {
        if (!FULL && j >= jlim) break;
        if constexpr (MID) {
            if (j == MMQ_MIX_AT) mid();
        }
        uint32_t a[4];
        ldsm_x4(a, wdec_s + a_off + j * 32);
        const int acode = 16 + j * 32 + ((lane >> 3) & 1) * 16;
        // pair s2's B rows: tiles i0 = wn + 2*WN*s2 (lanes 0-15) and i0 + WN (lanes 16-31)
        const uint32_t bbase = act_s + (((lane >> 4) ? WN : 0) + wn) * 8 * ASTR + (lane & 7) * ASTR + acode;
        constexpr uint32_t BSTEP = 2 * WN * 8 * ASTR;
        uint32_t b[P][4];
        ldsm_x4(b[0], bbase);
        if constexpr (P > 1) ldsm_x4(b[1], bbase + BSTEP);
        const float dwA = wsc[j * Geo<QT>::DW_J + rA], dwB = wsc[j * Geo<QT>::DW_J + rB];
        float xA[NAUX > 0 ? NAUX : 1], xB[NAUX > 0 ? NAUX : 1];
#pragma unroll
        for (int x = 0; x < NAUX; ++x) {
            xA[x] = wsc[Geo<QT>::AUX0 + (x * NBLK + j) * BM + rA];
            xB[x] = wsc[Geo<QT>::AUX0 + (x * NBLK + j) * BM + rB];
        }
        // tile t (= n8 tile wn + WN*t, acc[t]) uses b[t / 2] halves (t & 1); its mma results
        // d[t & 1] are double-buffered: tile t+1's mma is issued before tile t's epilogue
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
            float2 da, s;  // s: the second array's pair where the type reads one
            if constexpr (asc_paired<QT>()) {
                const float4 q = *reinterpret_cast<const float4*>(asc + asc_at<QT>(j, 0, c));
                da = make_float2(q.x, q.y);
                s = make_float2(q.z, q.w);
            } else {
                da = *reinterpret_cast<const float2*>(asc + asc_at<QT>(j, 0, c));
                if constexpr (Geo<QT>::NAA == 2) s = *reinterpret_cast<const float2*>(asc + asc_at<QT>(j, 1, c));
                else s = da;  // (read by no epilogue)
            }
            if constexpr (SPL)
                epi_split<QT>(acc[t], d[t & 1][0], d[t & 1][NM - 1], dwA, dwB, xA, xB, da, asc, j, c);
            else
                epi_one<QT>(acc[t], d[t & 1][0], dwA, dwB, xA, xB, da, s);
        }
    }
}

// MIXED: this chunk and the next are whole and mid() decodes the next one; otherwise
// mid() is empty and the caller decoded before.
template <int QT, int T, bool MIXED, class F>
__device__ __forceinline__ void mmq2_chunk_any(float (&acc)[MMQ_NT8][4], uint32_t wdec_s, const float* wsc,
                                               const float* asc, uint32_t act_s, int jlim, uint32_t a_off,
                                               int lane, int wn, int rA, int rB, F&& mid) {
    if constexpr (MIXED)
        mmq2_chunk<QT, T, true, true>(acc, wdec_s, wsc, asc, act_s, jlim, a_off, lane, wn, rA, rB, mid);
    else if (jlim >= 4)
        mmq2_chunk<QT, T, true, false>(acc, wdec_s, wsc, asc, act_s, jlim, a_off, lane, wn, rA, rB, mid);
    else
        mmq2_chunk<QT, T, false, false>(acc, wdec_s, wsc, asc, act_s, jlim, a_off, lane, wn, rA, rB, mid);
}

// Dispatch on the warp's n8 tile count (1 .. NT8; 0: no products, but a MIXED chunk's mid()
// still runs: every thread decodes its share).
template <int QT, int T, bool MIXED, class F>
__device__ __forceinline__ void mmq2_dispatch(int nt, float (&acc)[MMQ_NT8][4], uint32_t wdec_s,
                                              const float* wsc, const float* asc, uint32_t act_s, int jlim,
                                              uint32_t a_off, int lane, int wn, int rA, int rB, F&& mid) {
    if constexpr (T >= 1) {
        if (nt == T)
            mmq2_chunk_any<QT, T, MIXED>(acc, wdec_s, wsc, asc, act_s, jlim, a_off, lane, wn, rA, rB, mid);
        else
            mmq2_dispatch<QT, T - 1, MIXED>(nt, acc, wdec_s, wsc, asc, act_s, jlim, a_off, lane, wn, rA, rB, mid);
    } else if constexpr (MIXED) {
        mid();
    }
}

// LIST: the tile-list form (tiles != NULL), compiled apart so that neither form carries the
// other's registers.
template <int QT, bool LIST>
__device__ __forceinline__ void mmq_body(const uint8_t* __restrict__ W, long long w_stride, int N, int K,
                                          const uint8_t* __restrict__ A, int R_total,
                                          const int* __restrict__ bounds, int n_exp,
                                          float* __restrict__ out, long long ldo,
                                          const uint8_t* __restrict__ tabg, int tile_rows,
                                          const int4* __restrict__ tiles, int n_tiles,
                                          const int* __restrict__ live) {
    using G = Geo<QT>;
    constexpr int NBLK = G::NBLK, CB = G::CB, PMAX = G::PMAX, RAWB = G::RAWB, ASTR = G::ASTR, WSTR = G::WSTR;
    constexpr int STAGES = G::STAGES;
    constexpr int NAUX = Tr<QT>::NAUX, LAY = Tr<QT>::LAY;
    constexpr int BM = MMQ_BM, BN = MMQ_BN, NT = MMQ_NT, NT8 = MMQ_NT8, WN = MMQ_WN, WM = MMQ_WM;
    constexpr int WP = (BM * PMAX + NT - 1) / NT;  // weight pieces per thread per chunk

    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int s_pre[MMQ_MAX_EXP + 1], s_beg[MMQ_MAX_EXP], s_end[MMQ_MAX_EXP], s_rpt[MMQ_MAX_EXP],
        s_nrt[MMQ_MAX_EXP];

    uint8_t* tab = smem;
    uint8_t* raw = smem + G::OFF_RAW;
    uint8_t* act = smem + G::OFF_ACT;
    uint8_t* wdec0 = smem + G::OFF_WDEC;
    float* wsc0 = reinterpret_cast<float*>(smem + G::OFF_WSC);
    float* asc0 = reinterpret_cast<float*>(smem + G::OFF_ASC);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int t4 = lane & 3;
    const int NTm = (N + BM - 1) / BM;
#if MMQ_EMPTY_EXIT
    if constexpr (LIST) {  // a device-cut list: only its live entries (the same test for the whole CTA)
        if (live != nullptr) n_tiles = min(n_tiles, *live);
        if ((long long)blockIdx.x >= (long long)n_tiles * NTm) return;
    }
#endif
    const int nb = K / 32;
    const int nch = (K + 127) / 128;
    const int row_bytes = (K / Tr<QT>::VPB) * Tr<QT>::BS;
    if (n_exp > MMQ_MAX_EXP) n_exp = MMQ_MAX_EXP;

    if (tid < MMQ_MAX_EXP) {
        int b = 0, e = 0;
        if (tid < n_exp) {
            b = bounds[2 * tid];
            e = bounds[2 * tid + 1];
        }
        const int rows = e > b ? e - b : 0;
        const int nrt = (rows + tile_rows - 1) / tile_rows;
        const int rpt = nrt ? (((rows + nrt - 1) / nrt + 7) & ~7) : 0;
        s_beg[tid] = b;
        s_end[tid] = b + rows;
        s_nrt[tid] = nrt;
        s_rpt[tid] = rpt;
    }
    if constexpr (Tr<QT>::TAB) {  // the sign masks where the type reads them, then its grid (Staged<QT>)
        constexpr int NS = Staged<QT>::GRID / 16, NP = Staged<QT>::BYTES / 16;  // 16-byte pieces: the masks', all
        for (int i = tid; i < NP; i += NT)
            reinterpret_cast<uint4*>(tab)[i] =
                reinterpret_cast<const uint4*>(tabg)[i < NS ? TAB_SIGN / 16 + i : Tr<QT>::GRID / 16 + (i - NS)];
    }
    __syncthreads();
    if (tid == 0) {
        int acc = 0;
        for (int q = 0; q < MMQ_MAX_EXP; ++q) {
            s_pre[q] = acc;
            acc += s_nrt[q] * NTm;
        }
        s_pre[MMQ_MAX_EXP] = acc;
    }
    __syncthreads();
    const int total = LIST ? n_tiles * NTm : s_pre[MMQ_MAX_EXP];

    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        int rbase, rend, nt;
        long long woff;
        if constexpr (LIST) {
            const int ti = tile / NTm;
            nt = tile - ti * NTm;
            const int4 e = tiles[ti];
            rbase = e.x;
            rend = e.y;
#if MMQ_EMPTY_EXIT
            if (rend <= rbase) continue;  // padding of a device-cut list: the same for the whole CTA
#endif
            woff = (long long)(((unsigned long long)(unsigned)e.w << 32) | (unsigned)e.z);
        } else {
            int q = 0;
            while (q + 1 < MMQ_MAX_EXP && s_pre[q + 1] <= tile) ++q;
            const int local = tile - s_pre[q];
            const int rt = local / NTm;
            nt = local - rt * NTm;
            rbase = s_beg[q] + rt * s_rpt[q];
            rend = min(rbase + s_rpt[q], s_end[q]);
            woff = (long long)q * w_stride;
        }
        const int nvalid = rend - rbase;
        const int n0 = nt * BM;
        const int nrow_ok = min(BM, N - n0);  // weight rows of this tile
        const uint8_t* wtile = W + woff + (long long)n0 * row_bytes;
        const uint8_t* atile = A + (long long)rbase * 144;
        const long long achunk = (long long)R_total * 144;

        // the raw slot chunk kc's weights are staged in (raw_slots)
        auto raw_slot = [](int kc) { return G::RAW_ONCE ? (kc >> 1) % G::RSLOTS : kc % STAGES; };
        auto issue = [&](int kc) {
            if (kc < nch) {
                const int slot = kc % STAGES;
                const int coff = (Tr<QT>::VPB <= 128) ? kc * CB : (kc >> 1) * CB;
                const int cbytes = (Tr<QT>::VPB <= 128) ? min(CB, row_bytes - kc * CB) : CB;
                const uint32_t rawb = smem_u32(raw + raw_slot(kc) * G::RAW_B);
                const uint8_t* wc = wtile + coff;
                if (!G::RAW_ONCE || !(kc & 1)) {  // (an odd chunk's block came with the even one)
                    int stid = tid;  // (stage_offsets_recomputed)
                    if constexpr (stage_offsets_recomputed<QT>()) asm volatile("" : "+r"(stid));
#pragma unroll
                    for (int m = 0; m < WP; ++m) {
                        const int idx = stid + m * NT;
                        const int i = idx / PMAX, pc = idx - i * PMAX;  // row, 16-byte piece
                        if ((BM * PMAX % NT == 0 || idx < BM * PMAX) && i < nrow_ok) {
                            const uint8_t* p = wc + i * row_bytes;
                            const int o = (int)((uintptr_t)p & 15);
                            if (pc * 16 < o + cbytes) cp_async16(rawb + i * RAWB + pc * 16, p - o + pc * 16);
                        }
                    }
                }
                const uint32_t actb = smem_u32(act + slot * (BN * ASTR));
                const uint8_t* src = atile + kc * achunk;
                for (int idx = tid; idx < nvalid * 9; idx += NT) cp_async16(actb + idx * 16, src + idx * 16);
            }
            cp_async_commit();
        };

        // CHECK (a std::integral_constant): test each unit against the chunk's blocks, the tile's
        // weight rows and its activation rows; without it (a MIXED chunk: whole, all BM rows)
        // every unit is decoded and activation scales are copied for all BN staged rows (those
        // past the tile's rows are stale and feed only outputs that are never stored). A row
        // test there costs more than the copies it saves: it splits the unrolled body the decode
        // is mixed into (measured: docs/performance.md, "Figures from the kernels' comments").
        auto prep = [&](int kc, auto CHECK) {
            constexpr bool checked = decltype(CHECK)::value;
            const int slot = kc % STAGES;
            const int db = kc & 1;
            uint8_t* wdec = wdec0 + db * G::WDEC_B;
            float* wsc = wsc0 + db * G::WSC_F;
            float* asc = asc0 + db * G::ASC_F;
            const int coff = (Tr<QT>::VPB <= 128) ? kc * CB : (kc >> 1) * CB;
            const int jbase = (Tr<QT>::VPB <= 128) ? 0 : (kc & 1) * 4;
            const int jlim = min(NBLK, nb - kc * NBLK);
            const uint8_t* rawb = raw + raw_slot(kc) * G::RAW_B;
            const uint8_t* wc = wtile + coff;
#pragma unroll
            for (int u0 = 0; u0 < BM * NBLK; u0 += NT) {
                const int u = u0 + tid;
                if (BM * NBLK % NT != 0 && u >= BM * NBLK) break;
                const int i = u % BM, j = u / BM;
                if (checked && (i >= nrow_ok || j >= jlim)) continue;
                const int o = (int)((uintptr_t)(wc + i * row_bytes) & 15);
                uint32_t c[8];
                float dw, aux[5];
                decode_unit<QT>(rawb + i * RAWB, o, jbase + j, tab, c, dw, aux);
                uint4* dst = reinterpret_cast<uint4*>(wdec + i * WSTR + j * 32);
                dst[0] = make_uint4(c[0], c[1], c[2], c[3]);
                dst[1] = make_uint4(c[4], c[5], c[6], c[7]);
                if (G::DW_J || j == 0) wsc[j * G::DW_J + i] = dw;  // (DW_J 0: block 0's unit writes the row's)
#pragma unroll
                for (int a = 0; a < NAUX; ++a) wsc[G::AUX0 + (a * NBLK + j) * BM + i] = aux[a];
            }
            const uint8_t* actb = act + slot * (BN * ASTR);
#pragma unroll
            for (int u0 = 0; u0 < BN * NBLK; u0 += NT) {
                const int u = u0 + tid;
                if (BN * NBLK % NT != 0 && u >= BN * NBLK) break;
                const int r = u % BN, j = u / BN;
                if (checked && r >= nvalid) continue;
                const uint8_t* hb = actb + r * ASTR;
                if constexpr (LAY == LAYOUT_D4) {
                    asc[asc_at<QT>(j, 0, r)] = *reinterpret_cast<const float*>(hb + 4 * j);
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
                        asc[asc_at<QT>(j, 1, r)] = (float)sum;
                    }
                } else if constexpr (LAY == LAYOUT_DS4) {
                    asc[asc_at<QT>(j, 0, r)] = h2f(*reinterpret_cast<const uint16_t*>(hb + 4 * j));
                    asc[asc_at<QT>(j, 1, r)] = h2f(*reinterpret_cast<const uint16_t*>(hb + 4 * j + 2));
                } else {
                    asc[asc_at<QT>(j, 0, r)] = h2f(*reinterpret_cast<const uint16_t*>(hb + 2 * (j >> 1)));
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
                    asc[asc_at<QT>(j, 1, r)] = (float)s0;
                    asc[asc_at<QT>(j, 2, r)] = (float)s1;
                }
            }
        };

        float acc[NT8][4];
#pragma unroll
        for (int s = 0; s < NT8; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.0f;

#pragma unroll
        for (int s = 0; s < STAGES; ++s) issue(s);
        cp_async_wait<STAGES - 2>();  // chunks 0 and 1
        __syncthreads();
        prep(0, std::true_type{});
        __syncthreads();

        const uint32_t a_off = (uint32_t)((wm * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * WSTR + (lane >> 4) * 16);
        const int rA = wm * 16 + (lane >> 2), rB = rA + 8;
        // this warp's n8 tiles: wn, wn + WN, ... below ceil(nvalid / 8); it multiplies exactly these
        const int nt8 = (nvalid + 7) >> 3;
        const int ntw = nt8 > wn ? (nt8 - wn + WN - 1) / WN : 0;
        const bool active = (n0 + wm * 16) < N;  // a warp whose 16 weight rows are all past N idles

        // the mixed decode: chunk kc + 1 is decoded inside chunk kc's products when both are whole and the
        // tile has more than MMQ_MIX_MIN rows
        const bool mix_tile = nrow_ok == BM && nvalid > MMQ_MIX_MIN;
        for (int kc = 0; kc < nch; ++kc) {
            const int db = kc & 1;
            const uint32_t wd_s = smem_u32(wdec0 + db * G::WDEC_B), act_s = smem_u32(act + (kc % STAGES) * (BN * ASTR));
            const float *wsc = wsc0 + db * G::WSC_F, *asc = asc0 + db * G::ASC_F;
            const bool mixed = mix_tile && kc + 1 < nch && nb - (kc + 1) * NBLK >= NBLK;
            if (mixed) {
                auto mid = [&]() { prep(kc + 1, std::false_type{}); };
                if (active)
                    mmq2_dispatch<QT, NT8, true>(ntw, acc, wd_s, wsc, asc, act_s, nb - kc * NBLK, a_off, lane, wn,
                                                 rA, rB, mid);
                else
                    mid();
            } else {
                if (kc + 1 < nch) prep(kc + 1, std::true_type{});
                if (active)
                    mmq2_dispatch<QT, NT8, false>(ntw, acc, wd_s, wsc, asc, act_s, nb - kc * NBLK, a_off, lane, wn,
                                                  rA, rB, [] {});
            }
            if (kc + 1 < nch) {
                cp_async_wait<STAGES - 3>();
                __syncthreads();
                issue(kc + STAGES);
            }
        }

        const int nA = n0 + rA, nB = n0 + rB;
#pragma unroll
        for (int s = 0; s < NT8; ++s) {
            const int i = wn + WN * s;
            const int r0 = rbase + i * 8 + 2 * t4;
            if (r0 < rend) {
                float* o = out + (long long)r0 * ldo;
                if (nA < N) o[nA] = acc[s][0];
                if (nB < N) o[nB] = acc[s][2];
            }
            if (r0 + 1 < rend) {
                float* o = out + (long long)(r0 + 1) * ldo;
                if (nA < N) o[nA] = acc[s][1];
                if (nB < N) o[nB] = acc[s][3];
            }
        }
        __syncthreads();
    }
}

// out2 carries no __restrict__: a single-matrix launch passes out again (and never writes it).
// The parameters are the host's field names (products._mmq_args packs them by name).
#define MMQ_ENTRY(NAME, QT)                                                                              \
    extern "C" __global__ void __launch_bounds__(MMQ_NT, MMQ_MINB)                                      \
        NAME(const uint8_t* __restrict__ w, long long w_stride, int N, int K,                          \
             const uint8_t* __restrict__ act, int R_total, const int* __restrict__ bounds, int n_exp,   \
             float* __restrict__ out, long long ldo, const uint8_t* __restrict__ tab, int tile_rows,   \
             long long w_pair, float* out2, const int4* __restrict__ tiles, int n_tiles,              \
             const int* __restrict__ live) {                                                            \
        const bool second = blockIdx.y != 0;                                                             \
        if (tiles != nullptr)                                                                            \
            mmq_body<QT, true>(second ? w + w_pair : w, w_stride, N, K, act, R_total, bounds, 0,        \
                               second ? out2 : out, ldo, tab, tile_rows, tiles, n_tiles, live);         \
        else                                                                                             \
            mmq_body<QT, false>(second ? w + w_pair : w, w_stride, N, K, act, R_total, bounds, n_exp,   \
                                second ? out2 : out, ldo, tab, tile_rows, tiles, n_tiles, live);        \
    }                                                                                                    \
    extern "C" __device__ int NAME##_smem = Geo<QT>::SMEM;

// one kernel per type with an mmq_kernel in contract/qformats.py, named as it says
MMQ_KERNELS(MMQ_ENTRY)

// Geometry for the host (read with get_global): {BM, BN, threads, max experts}.
extern "C" __device__ int mmq_geometry[4] = {MMQ_BM, MMQ_BN, MMQ_NT, MMQ_MAX_EXP};
