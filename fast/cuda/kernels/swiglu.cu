// SwiGLU of the gate and up products: H = silu(g) * u.
//
// Definition: strata.moe.swiglu = strata.numerics.silu(gate) * up, elementwise, with
//   silu(x) = x / (1.0f + exp(-x))   (exp: the shared polynomial of strata.numerics.exp;
//   IEEE division; x < -88 gives -0.0, as in NumPy)
// Rows r < rows of n values: g at + r * ldg, u at + r * ldu, h at + r * ldh (pointers already
// offset to the first row of the range). h may alias g or u.

#include <stdint.h>
#include "strata_numerics.cuh"  // strata_swiglu


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
