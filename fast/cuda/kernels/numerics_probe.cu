// Checks of strata_numerics.cuh's forms: the fused exponential against the plain one on every
// float (exhaustive, bit for bit), and attention's primitives on given inputs for the NumPy
// oracles.
//
// Definition: strata_prefill.contract.numerics.exp, .exp2c and .fma (docs/numerics.md section
// 1), and np.rint for the P codes' rint. Used by verify/test_kernels_cuda.py only.
#include <stdint.h>
#include "strata_numerics.cuh"

// Over the floats with bits lo .. lo + n - 1: count those where differs(bits) holds into bad,
// and the smallest such bit pattern into first (0xFFFFFFFF if none). One grid-stride loop for
// every probe below, each giving its own comparison.
template <class Differs>
__device__ __forceinline__ void count_differences(unsigned lo, unsigned n, unsigned long long* bad, unsigned* first,
                                                  Differs differs)
{
    unsigned long long mine = 0;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        if (differs(lo + i)) {
            ++mine;
            atomicMin(first, lo + i);
        }
    }
    if (mine) atomicAdd(bad, mine);
}

// Floats with bits lo .. lo + n - 1 (any): count where the fused strata_exp (the kernels',
// two steps in fewer instructions) and the plain one give different bits.
extern "C" __global__ void probe_exp_fused(unsigned lo, unsigned n, unsigned long long* bad, unsigned* first)
{
    count_differences(lo, n, bad, first, [](unsigned bits) {
        const float x = __uint_as_float(bits);
        return __float_as_uint(strata_exp_form<1>(x)) != __float_as_uint(strata_exp_form<0>(x));
    });
}

// Attention's primitives on given inputs, for the NumPy oracles
// (strata_prefill.contract.numerics.exp2c, .fma, and np.rint for rint_nonneg_magic):
// y_exp2c[i] = strata_exp2c(x[i]); y_fma[i] = __fmaf_rn(x[i], b[i], c[i]);
// y_rint[i] = rint_nonneg_magic(-x[i]) - MAGIC_F (for 0 <= -x[i] < 2^22).
extern "C" __global__ void probe_values(const float* x, const float* b, const float* c, int n, float* y_exp2c,
                                        float* y_fma, float* y_rint)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y_exp2c[i] = strata_exp2c(x[i]);
        y_fma[i] = __fmaf_rn(x[i], b[i], c[i]);
        y_rint[i] = __fsub_rn(rint_nonneg_magic(-x[i]), MAGIC_F);
    }
}
