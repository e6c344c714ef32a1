// Exhaustive checks of the special-domain forms in strata_numerics.cuh against the general ones.
//
// Definition: strata_prefill.contract.numerics.roundf and strata_prefill.contract.numerics.exp (docs/numerics.md section 1). The
// general device forms (roundf_away, strata_exp) are checked against NumPy by the kernel tests;
// the fast forms that attention_pair.cu uses where its inputs allow (round_nonneg_magic for
// y >= 0, strata_exp_nonpos for x <= 0) are checked here against them on every float of their
// domain, bit for bit, and the fused exponential against the plain one on every float. Used by verify/test_kernels_cuda.py only.
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

// Floats with bits lo .. lo + n - 1 (all >= 0): count where round_nonneg_magic's code differs
// from (int)roundf_away.
extern "C" __global__ void probe_round_nonneg(unsigned lo, unsigned n, unsigned long long* bad, unsigned* first)
{
    count_differences(lo, n, bad, first, [](unsigned bits) {
        const float y = __uint_as_float(bits);
        return __float_as_int(round_nonneg_magic(y)) - MAGIC_I != (int)roundf_away(y);
    });
}

// Floats with bits lo .. lo + n - 1 (negative: x <= -0.0): count where strata_exp_nonpos and
// strata_exp give different bits.
extern "C" __global__ void probe_exp_nonpos(unsigned lo, unsigned n, unsigned long long* bad, unsigned* first)
{
    count_differences(lo, n, bad, first, [](unsigned bits) {
        const float x = __uint_as_float(bits);
        return __float_as_uint(strata_exp_nonpos(x)) != __float_as_uint(strata_exp(x));
    });
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

// Both fast forms of given inputs, for the NumPy oracle: y_exp[i] = strata_exp_nonpos(x[i]),
// y_round[i] = round_nonneg_magic(-x[i]) - MAGIC_F (as a float; for -x[i] < 2^22).
extern "C" __global__ void probe_values(const float* x, int n, float* y_exp, float* y_round)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y_exp[i] = strata_exp_nonpos(x[i]);
        y_round[i] = __fsub_rn(round_nonneg_magic(-x[i]), MAGIC_F);
    }
}
