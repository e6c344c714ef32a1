// SwiGLU of the gate and up products: H = silu(g) * u.
//
// Definition: strata.moe.swiglu = strata.numerics.silu(gate) * up, elementwise, with
//   silu(x) = x / (1.0f + exp(-x))   (exp: the shared polynomial of strata.numerics.exp;
//   IEEE division; x < -88 gives -0.0, as in NumPy)
// Rows r < rows of n values: g at + r * ldg, u at + r * ldu, h at + r * ldh (pointers already
// offset to the first row of the range). h may alias g or u.

#include <stdint.h>

__device__ __forceinline__ float strata_exp(float x)
{
    if (x != x) return x;
    if (x > 88.0f) return __int_as_float(0x7f800000);
    if (x < -87.0f) return 0.0f;
    const float n = rintf(__fmul_rn(x, 0x1.715476p+0f));
    float r = __fsub_rn(x, __fmul_rn(n, 0x1.62e4p-1f));
    r = __fsub_rn(r, __fmul_rn(n, 0x1.7f7d1cp-20f));
    float p = 0x1.a01a02p-13f;
    p = __fadd_rn(__fmul_rn(p, r), 0x1.6c16c2p-10f);
    p = __fadd_rn(__fmul_rn(p, r), 0x1.111112p-7f);
    p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-5f);
    p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-3f);
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    return __fmul_rn(p, __int_as_float(((int)n + 127) << 23));
}

extern "C" __global__ void __launch_bounds__(256)
swiglu_rows(const float* g, long long ldg, const float* u, long long ldu, float* h, long long ldh,
            int rows, int n)
{
    const long long total = (long long)rows * n;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long r = idx / n;
        const long long i = idx - r * n;
        const float x = g[r * ldg + i];
        const float silu = x / __fadd_rn(1.0f, strata_exp(-x));
        h[r * ldh + i] = __fmul_rn(silu, u[r * ldu + i]);
    }
}
