// Float weights (F32, F16, BF16) times float32 activation rows, float32 out.
//
// Definition: strata.dense.float_matmul (docs/numerics.md section 3a, "Float products").
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

extern "C" __global__ void __launch_bounds__(32 * FD_WARPS)
float_dense_f32(const float* w, const float* x, long long ldx, float* y, long long ldy, int N, int K, int T)
{
    float_dense_rows<float>(w, x, ldx, y, ldy, N, K, T);
}

extern "C" __global__ void __launch_bounds__(32 * FD_WARPS)
float_dense_f16(const __half* w, const float* x, long long ldx, float* y, long long ldy, int N, int K, int T)
{
    float_dense_rows<__half>(w, x, ldx, y, ldy, N, K, T);
}

extern "C" __global__ void __launch_bounds__(32 * FD_WARPS)
float_dense_bf16(const uint16_t* w, const float* x, long long ldx, float* y, long long ldy, int N, int K, int T)
{
    float_dense_rows<uint16_t>(w, x, ldx, y, ldy, N, K, T);
}
