// Float weights (F32, F16, BF16) times float32 activation rows, float32 out.
//
// Definition: strata_prefill.contract.dense.float_matmul (docs/numerics.md section 3a, "Float products").
//   y[t, n] = sum_k w[n, k] * x[t, k], per output element:
//   lane j: acc = 0.0f; for k = j, j+32, ... < K: acc = acc + w[n,k] * x[t,k]
//           (the product rounded to float, then the add: --fmad=false keeps them apart)
//   then the xor butterfly with offsets 16, 8, 4, 2, 1. After offset 16, lane j holds
//   p[j] + p[j^16], which is (v[:16] + v[16:])[j mod 16] (IEEE addition is commutative);
//   after offset 8, (level-1 tree)[j mod 8] + its partner 8 away, and so on: every lane ends
//   with the bits of the halving tree v[:16]+v[16:], v[:8]+v[8:], ... of the definition.
//   The definition pads K to a multiple of 32 with zeros; a lane here simply stops at K,
//   which gives the same bits (adding +0.0 to a partial never changes it).
// F16 and BF16 weights widen to float exactly (__half2float; BF16 is float's upper 16 bits).
//
// One warp per weight row n and FD_TOK consecutive tokens: the lanes load each weight
// element once and use it for FD_TOK outputs, each with its own accumulator (the order per
// output is exactly the one above). Weight rows are contiguous (row n at w + n * K); x rows
// at x + t * ldx, y rows at y + t * ldy. Compiled with --fmad=false.

#include <stdint.h>
#include <cuda_fp16.h>

#define FD_WARPS 8
#define FD_TOK 4

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(uint16_t v) { return __uint_as_float(((uint32_t)v) << 16); }

template <typename W>
__device__ __forceinline__ void float_dense_rows(const W* __restrict__ w, const float* __restrict__ x,
                                                 long long ldx, float* __restrict__ y, long long ldy,
                                                 int N, int K, int T)
{
    const int lane = threadIdx.x & 31;
    const long long warp = (long long)blockIdx.x * FD_WARPS + (threadIdx.x >> 5);
    const long long n_tgroups = (T + FD_TOK - 1) / FD_TOK;
    if (warp >= (long long)N * n_tgroups) return;  // whole warps leave: the shuffles stay full
    const int n = (int)(warp % N);
    const long long t0 = (warp / N) * FD_TOK;
    const int nt = (int)min((long long)FD_TOK, (long long)T - t0);
    const W* wr = w + (long long)n * K;

    float acc[FD_TOK];
#pragma unroll
    for (int j = 0; j < FD_TOK; ++j) acc[j] = 0.0f;
    for (int k = lane; k < K; k += 32) {
        const float wv = widen(wr[k]);
#pragma unroll
        for (int j = 0; j < FD_TOK; ++j) {
            if (j < nt) {
                const float p = wv * x[(t0 + j) * ldx + k];
                acc[j] = acc[j] + p;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < FD_TOK; ++j) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[j] = acc[j] + __shfl_xor_sync(0xffffffffu, acc[j], o);
        if (lane == 0 && j < nt) y[(t0 + j) * ldy + n] = acc[j];
    }
}

// ---- the tiled form (many tokens): the same per-output arithmetic, laid out for throughput.
// The definition fixes, for each output, 32 lane partials (partial j adds w*x over k = j,
// j+32, ... ascending) and the halving tree over them; it does not fix which thread holds
// which partial. Here lane j of a warp holds partial j of FT_R x FT_C outputs (FT_R weight
// rows x FT_C tokens): per k step it reads FT_R weights and FT_C activations for FT_R * FT_C
// products, where the one-warp kernel above loads 1 + FD_TOK values for FD_TOK products.
// A CTA of FT_WN x FT_WT warps covers FT_WN * FT_R rows x FT_WT * FT_C tokens; blockIdx.x
// walks the rows, blockIdx.y the tokens (the CTAs sharing a token tile run together, so its
// activations come from HBM about once). Two ways to feed the lanes, the same partials: the
// direct form (F32) and the staged form (F16, BF16), below. The tree is then a transposing
// butterfly: at offset o each lane keeps half of its values (the half its lane bit o
// selects), sends the other half to lane ^ o and adds what it receives: p[j] + p[j ^ o] of the
// same output, the tree's level (IEEE addition is commutative). After offsets 16, 8, 4, 2, 1
// lane j holds outputs 2j and 2j + 1 (output index r * FT_C + c), each the full tree's bits.
#define FT_R 8
#define FT_C 8
#define FT_WN 2
#define FT_WT 4
#define FT_KC 64
#define FT_THREADS (32 * FT_WN * FT_WT)
// CTAs per SM asked of the compiler (__launch_bounds__): the staged form runs best at 2 (128
// registers a thread), the direct one at 1 (its 16 loads in flight need the registers; measured
// in docs/performance.md, "Figures from the kernels' comments")
#ifndef FT_MINB
#define FT_MINB 2
#endif
#ifndef FT_MINB_DIRECT
#define FT_MINB_DIRECT 1
#endif
#define FT_ROWS (FT_WN * FT_R)
#define FT_TOKS (FT_WT * FT_C)
static_assert(FT_R * FT_C == 64, "the butterfly below halves 64 values per lane down to 2");
static_assert((FT_ROWS * FT_KC) % FT_THREADS == 0 && (FT_TOKS * FT_KC) % FT_THREADS == 0, "whole staging loads");

// One level of the transposing butterfly at offset O over the lane's first 2M values: keep
// the half lane bit O selects, send the other, add the partner's (constant indices only, so
// the values stay in registers).
template <int O, int M>
__device__ __forceinline__ void tree_level(float (&v)[FT_R * FT_C], int lane)
{
    const bool up = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < M; ++i) {
        const float keep = up ? v[M + i] : v[i];
        const float send = up ? v[i] : v[M + i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}

// The transposing butterfly (64 -> 32 -> 16 -> 8 -> 4 -> 2 values per lane), then lane j
// stores outputs 2j and 2j + 1 of the warp's tile (rows n0.., tokens t0..) inside N x T.
__device__ __forceinline__ void tree_store(float (&v)[FT_R * FT_C], int lane, float* __restrict__ y, long long ldy,
                                           int n0, long long t0, int N, int T)
{
    tree_level<16, 32>(v, lane);
    tree_level<8, 16>(v, lane);
    tree_level<4, 8>(v, lane);
    tree_level<2, 4>(v, lane);
    tree_level<1, 2>(v, lane);
    const int n = n0 + (2 * lane) / FT_C;
    const long long t = t0 + (2 * lane) % FT_C;
    if (n < N) {
        if (t < T) y[t * ldy + n] = v[0];
        if (t + 1 < T) y[(t + 1) * ldy + n] = v[1];
    }
}

// The direct form, for F32 weights: each lane loads its 8 + 8 values of a k step straight
// from global memory (coalesced over the lanes) and the tile's loads stay in flight together.
// For 16-bit weights the compiler, at the register cap, serializes those loads (one 2-byte
// load, its use, the next); the staged form below is their path (measured in
// docs/performance.md, "Figures from the kernels' comments").
template <typename W>
__device__ __forceinline__ void float_dense_tile_direct(const W* __restrict__ w, const float* __restrict__ x,
                                                        long long ldx, float* __restrict__ y, long long ldy,
                                                        int N, int K, int T)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n0 = blockIdx.x * FT_ROWS + (warp % FT_WN) * FT_R;
    const long long t0 = (long long)blockIdx.y * FT_TOKS + (warp / FT_WN) * FT_C;
    if (n0 >= N || t0 >= T) return;  // whole warps leave: the shuffles stay full
    const W* wr[FT_R];
    const float* xr[FT_C];
#pragma unroll
    for (int r = 0; r < FT_R; ++r) wr[r] = w + (long long)min(n0 + r, N - 1) * K;
#pragma unroll
    for (int c = 0; c < FT_C; ++c) xr[c] = x + min(t0 + c, (long long)T - 1) * ldx;

    float v[FT_R * FT_C];
#pragma unroll
    for (int i = 0; i < FT_R * FT_C; ++i) v[i] = 0.0f;
    for (int k = lane; k < K; k += 32) {  // a lane past K adds nothing more (the definition's padding)
        float wv[FT_R], xv[FT_C];
#pragma unroll
        for (int r = 0; r < FT_R; ++r) wv[r] = widen(wr[r][k]);
#pragma unroll
        for (int c = 0; c < FT_C; ++c) xv[c] = xr[c][k];
#pragma unroll
        for (int r = 0; r < FT_R; ++r)
#pragma unroll
            for (int c = 0; c < FT_C; ++c) v[r * FT_C + c] = v[r * FT_C + c] + wv[r] * xv[c];
    }
    tree_store(v, lane, y, ldy, n0, t0, N, T);
}

// The staged form, for 16-bit weights (F16, BF16): K is walked in chunks of FT_KC values; the
// CTA copies a chunk of its rows (widened to float) and of its tokens into shared memory with
// coalesced loads, one chunk ahead in registers, and every warp reads its 8 + 8 values per k
// step from there (lane j: k = chunk + 32 s + j, so the lane keeps partial j's ascending
// order). Values past K, rows past N and tokens past T are staged as zeros: a partial starts
// at +0.0 and so is never -0.0, and adding 0 * 0 = +0.0 leaves it unchanged (the definition's
// own zero padding of K); padded outputs are not stored.
template <typename W>
__device__ __forceinline__ void float_dense_tile(const W* __restrict__ w, const float* __restrict__ x,
                                                 long long ldx, float* __restrict__ y, long long ldy,
                                                 int N, int K, int T)
{
    constexpr int PW = FT_ROWS * FT_KC / FT_THREADS, PX = FT_TOKS * FT_KC / FT_THREADS;
    __shared__ float sw[2][FT_ROWS * FT_KC];
    __shared__ float sx[2][FT_TOKS * FT_KC];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n_cta = blockIdx.x * FT_ROWS;
    const long long t_cta = (long long)blockIdx.y * FT_TOKS;
    const int wr0 = (warp % FT_WN) * FT_R, wt0 = (warp / FT_WN) * FT_C;  // the warp's rows, tokens in the tile

    float pw[PW], px[PX];
    auto fetch = [&](int k0) {  // element i = tid + FT_THREADS * m of the chunk: row i / FT_KC, k0 + i % FT_KC
#pragma unroll
        for (int m = 0; m < PW; ++m) {
            const int i = tid + FT_THREADS * m, n = n_cta + i / FT_KC, k = k0 + i % FT_KC;
            pw[m] = (n < N && k < K) ? widen(w[(long long)n * K + k]) : 0.0f;
        }
#pragma unroll
        for (int m = 0; m < PX; ++m) {
            const int i = tid + FT_THREADS * m, k = k0 + i % FT_KC;
            const long long t = t_cta + i / FT_KC;
            px[m] = (t < T && k < K) ? x[t * ldx + k] : 0.0f;
        }
    };
    auto put = [&](int b) {
#pragma unroll
        for (int m = 0; m < PW; ++m) sw[b][tid + FT_THREADS * m] = pw[m];
#pragma unroll
        for (int m = 0; m < PX; ++m) sx[b][tid + FT_THREADS * m] = px[m];
    };

    float v[FT_R * FT_C];
#pragma unroll
    for (int i = 0; i < FT_R * FT_C; ++i) v[i] = 0.0f;
    const int n_chunks = (K + FT_KC - 1) / FT_KC;
    fetch(0);
    put(0);
    __syncthreads();
    for (int kc = 0; kc < n_chunks; ++kc) {
        if (kc + 1 < n_chunks) fetch((kc + 1) * FT_KC);
        const float* bw = sw[kc & 1] + wr0 * FT_KC + lane;
        const float* bx = sx[kc & 1] + wt0 * FT_KC + lane;
#pragma unroll
        for (int s = 0; s < FT_KC / 32; ++s) {
            float wv[FT_R], xv[FT_C];
#pragma unroll
            for (int r = 0; r < FT_R; ++r) wv[r] = bw[r * FT_KC + 32 * s];
#pragma unroll
            for (int c = 0; c < FT_C; ++c) xv[c] = bx[c * FT_KC + 32 * s];
#pragma unroll
            for (int r = 0; r < FT_R; ++r)
#pragma unroll
                for (int c = 0; c < FT_C; ++c) v[r * FT_C + c] = v[r * FT_C + c] + wv[r] * xv[c];
        }
        if (kc + 1 < n_chunks) {
            put((kc + 1) & 1);  // that buffer was last read before the previous barrier
            __syncthreads();
        }
    }
    tree_store(v, lane, y, ldy, n_cta + wr0, t_cta + wt0, N, T);
}

#define FLOAT_DENSE_ENTRIES(SUFFIX, W, MINB)                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * FD_WARPS)                                          \
    float_dense_##SUFFIX(const W* w, const float* x, long long ldx, float* y, long long ldy, int N, int K,  \
                         int T)                                                                          \
    {                                                                                                    \
        float_dense_rows<W>(w, x, ldx, y, ldy, N, K, T);                                                 \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(FT_THREADS, MINB)                                       \
    float_dense_tile_##SUFFIX(const W* w, const float* x, long long ldx, float* y, long long ldy, int N,  \
                              int K, int T)                                                              \
    {                                                                                                    \
        if constexpr (sizeof(W) == 4) float_dense_tile_direct<W>(w, x, ldx, y, ldy, N, K, T);             \
        else float_dense_tile<W>(w, x, ldx, y, ldy, N, K, T);                                            \
    }

FLOAT_DENSE_ENTRIES(f32, float, FT_MINB_DIRECT)
FLOAT_DENSE_ENTRIES(f16, __half, FT_MINB)
FLOAT_DENSE_ENTRIES(bf16, uint16_t, FT_MINB)

// Tile geometry for the host (read with get_global): {rows per CTA, tokens per CTA, threads}.
extern "C" __device__ int float_dense_tile_geometry[3] = {FT_ROWS, FT_TOKS, FT_THREADS};
