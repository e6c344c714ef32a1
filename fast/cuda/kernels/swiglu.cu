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

#include <stdint.h>
#include "strata_numerics.cuh"  // strata_swiglu, strata_swiglu_oai


extern "C" __global__ void __launch_bounds__(256)
swiglu_rows(const float* g, long long ldg, const float* u, long long ldu, float* h, long long ldh,
            int rows, int n)
{
    const long long total = (long long)rows * n;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long r = idx / n;
        const long long i = idx - r * n;
        h[r * ldh + i] = strata_swiglu(g[r * ldg + i], u[r * ldu + i]);
    }
}

extern "C" __global__ void __launch_bounds__(256)
swiglu_oai_rows(const float* g, long long ldg, const float* u, long long ldu, float* h, long long ldh,
                int rows, int n, float alpha, float limit, const int* __restrict__ rexp,
                const float* __restrict__ bg, const float* __restrict__ bu, long long ldb)
{
    const long long total = (long long)rows * n;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long r = idx / n;
        const long long i = idx - r * n;
        float gv = g[r * ldg + i], uv = u[r * ldu + i];
        if (rexp != nullptr) {
            const long long e = rexp[r];
            gv = __fadd_rn(gv, bg[e * ldb + i]);
            uv = __fadd_rn(uv, bu[e * ldb + i]);
        }
        h[r * ldh + i] = strata_swiglu_oai(gv, uv, alpha, limit);
    }
}
