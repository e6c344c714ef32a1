// SwiGLU of the gate and up products: H = silu(g) * u.
//
// swiglu_rows -- definition: strata_prefill.contract.moe.swiglu = strata_prefill.contract.numerics.silu(gate) * up, elementwise, with
//   silu(x) = x / (1.0f + exp(-x))   (exp: the shared polynomial of strata_prefill.contract.numerics.exp;
//   IEEE division; x < -88 gives -0.0, as in NumPy)
// Rows r < rows of n values: g at + r * ldg, u at + r * ldu, h at + r * ldh (pointers already
// offset to the first row of the range). h may alias g or u.
//
// swiglu_oai_rows -- the clamped SwiGLU of gpt-oss with its expert biases: definition
//   strata_prefill.contract.moe.swiglu_oai(strata_prefill.contract.moe.add_expert_bias(gate, bg, rexp), add_expert_bias(up, bu, rexp),
//   alpha, limit) (docs/numerics.md section 6): g = gate + bg[rexp[r]], u = up + bu[rexp[r]] (one
//   float32 addition each), then strata_swiglu_oai. rexp: the expert of each row of the range
//   (strata_prefill.contract.routing.row_experts, offset like g); bg, bu: bias rows of n values, row e at + e * ldb.
//   rexp NULL: no biases (bg, bu unused). The same rows, aliasing and layout as swiglu_rows.
//
// The watch's mark (both kernels): first NULL, none. Else first = min(first, code_gate) where a
// gate value of the range holds a NaN or an Inf and min(first, code_up) where an up value
// does: strata_prefill.formats.nonfinite.mark of g's rows, then of u's rows, under those codes, exactly
// what two nonfinite.cu launches over the same rows would leave (the smaller code wins, in
// either order). The values tested are the ones loaded, before the biases (nonfinite.cuh's
// not_finite, on the bits); one vote a warp, one atomicMin a warp that saw one. The branch on
// first is taken once, alike by the whole grid: the unmarked loop is the loop without a mark.

#include <stdint.h>
#include "strata_numerics.cuh"  // strata_swiglu, strata_swiglu_oai
#include "nonfinite.cuh"        // not_finite, mark_warp


// Both kernels' loop; kOai: gpt-oss's clamped SwiGLU with the expert biases (alpha, limit, rexp,
// bg, bu, ldb unused without it); kMark: the watch's mark (first, code_gate, code_up unused
// without it).
template <bool kOai, bool kMark>
__device__ __forceinline__ void swiglu_rows_body(
    const float* g, long long ldg, const float* u, long long ldu, float* h, long long ldh, int rows, int n,
    float alpha, float limit, const int* __restrict__ rexp, const float* __restrict__ bg,
    const float* __restrict__ bu, long long ldb, unsigned long long* first, unsigned long long code_gate,
    unsigned long long code_up)
{
    const long long total = (long long)rows * n;
    const long long stride = (long long)gridDim.x * blockDim.x;
    unsigned int bad_g = 0, bad_u = 0;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long r = idx / n;
        const long long i = idx - r * n;
        float gv = g[r * ldg + i], uv = u[r * ldu + i];
        if constexpr (kMark) {
            bad_g |= not_finite(__float_as_uint(gv));
            bad_u |= not_finite(__float_as_uint(uv));
        }
        if constexpr (kOai) {
            if (rexp != nullptr) {
                const long long e = rexp[r];
                gv = __fadd_rn(gv, bg[e * ldb + i]);
                uv = __fadd_rn(uv, bu[e * ldb + i]);
            }
            h[r * ldh + i] = strata_swiglu_oai(gv, uv, alpha, limit);
        } else {
            h[r * ldh + i] = strata_swiglu(gv, uv);
        }
    }
    if constexpr (kMark) {  // every lane of the warp reaches here (blocks of whole warps, no early exit)
        mark_warp(first, bad_g, code_gate);
        mark_warp(first, bad_u, code_up);
    }
}

extern "C" __global__ void __launch_bounds__(256)
swiglu_rows(const float* g, long long ldg, const float* u, long long ldu, float* h, long long ldh,
            int rows, int n, unsigned long long* first, unsigned long long code_gate, unsigned long long code_up)
{
    if (first == nullptr)
        swiglu_rows_body<false, false>(g, ldg, u, ldu, h, ldh, rows, n, 0.0f, 0.0f, nullptr, nullptr, nullptr, 0,
                                       nullptr, 0, 0);
    else
        swiglu_rows_body<false, true>(g, ldg, u, ldu, h, ldh, rows, n, 0.0f, 0.0f, nullptr, nullptr, nullptr, 0,
                                      first, code_gate, code_up);
}

extern "C" __global__ void __launch_bounds__(256)
swiglu_oai_rows(const float* g, long long ldg, const float* u, long long ldu, float* h, long long ldh,
                int rows, int n, float alpha, float limit, const int* __restrict__ rexp,
                const float* __restrict__ bg, const float* __restrict__ bu, long long ldb,
                unsigned long long* first, unsigned long long code_gate, unsigned long long code_up)
{
    if (first == nullptr)
        swiglu_rows_body<true, false>(g, ldg, u, ldu, h, ldh, rows, n, alpha, limit, rexp, bg, bu, ldb,
                                      nullptr, 0, 0);
    else
        swiglu_rows_body<true, true>(g, ldg, u, ldu, h, ldh, rows, n, alpha, limit, rexp, bg, bu, ldb,
                                     first, code_gate, code_up);
}
