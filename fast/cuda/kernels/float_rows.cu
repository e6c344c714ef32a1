// The MoE input of float gate/up experts: the normed rows themselves, copied into the
// expert-sorted order by the routing tables (docs/numerics.md section 6; never quantized).
//
// Definition: strata_prefill.contract.moe.gather_rows (row r of out is x[src[r]]) and strata_prefill.contract.moe.scatter_rows
// (row slot[t * k_used + k] of out is x[t], for k < k_used). Copies only, so every output
// float has its input's bits; the two write the same rows, since slot and src are inverse.
// x rows at x + t * ldx; out rows contiguous (K floats each).

#include <stdint.h>

extern "C" __global__ void __launch_bounds__(256)
gather_rows_f32(const float* __restrict__ x, long long ldx, const int* __restrict__ src,
                float* __restrict__ out, int n_rows, int K)
{
    const long long total = (long long)n_rows * K;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long r = idx / K;
        const long long i = idx - r * K;
        out[idx] = x[(long long)src[r] * ldx + i];
    }
}

extern "C" __global__ void __launch_bounds__(256)
scatter_rows_f32(const float* __restrict__ x, long long ldx, const int* __restrict__ slot,
                 float* __restrict__ out, int n_tok, int k_used, int K)
{
    const long long total = (long long)n_tok * k_used * K;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long pair = idx / K;  // t * k_used + k
        const long long i = idx - pair * K;
        const long long t = pair / k_used;
        out[(long long)slot[pair] * K + i] = x[t * ldx + i];
    }
}
