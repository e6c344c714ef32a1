// Numerics primitives shared by the kernels, each the CUDA form of a NumPy definition in
// strata/numerics.py (docs/numerics.md section 1). Compiled with --fmad=false: every * and +
// below is its own IEEE rounding. fast/cuda/runtime.py inlines this file where a kernel
// includes it.
#ifndef STRATA_NUMERICS_CUH
#define STRATA_NUMERICS_CUH
#include <stdint.h>

// strata.numerics.exp: the shared polynomial exponential (NaN passes, > 88 -> inf,
// < -87 -> 0, 2^n from exponent bits).
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

// strata.numerics.roundf: round half away from zero (C roundf), exact for every float.
__device__ __forceinline__ float roundf_away(float x)
{
    const float t = truncf(x);
    return (fabsf(x - t) >= 0.5f) ? t + copysignf(1.0f, x) : t;
}

// An int8 code from an already rounded value; a non-finite value (127/amax overflowed) -> 0.
__device__ __forceinline__ int8_t to_i8(float v)
{
    return (isfinite(v)) ? (int8_t)(int)v : (int8_t)0;
}

// Max over the warp (exact in any order).
__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif  // STRATA_NUMERICS_CUH
