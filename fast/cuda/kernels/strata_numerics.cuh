// Numerics primitives shared by the kernels, each the CUDA form of a NumPy definition
// (contract/numerics.py, contract/q8_1.py, contract/attention.py; docs/numerics.md section 1).
// Compiled with --fmad=false: every * and + below is its own IEEE rounding. fast/cuda/runtime.py
// inlines this file where a kernel includes it. One home for: the exponential, SwiGLU, round
// half away from zero, the q8-style block quantize (scale, codes, zero rules), warp reductions.
#ifndef STRATA_NUMERICS_CUH
#define STRATA_NUMERICS_CUH
#include <stdint.h>

// Exact integer <-> float without the (quarter-rate) conversion pipe, for |i| < 2^22: the float
// with bits MAGIC_I + i is 1.5 * 2^23 + i, so subtracting MAGIC_F leaves (float)i exactly; and
// y + MAGIC_F rounds y to the nearest integer, ties to even (= rintf), whose bits minus MAGIC_I
// are that integer.
#define MAGIC_I 0x4B400000
#define MAGIC_F 12582912.0f

// u * (float)i from the mma bits d = MAGIC_I + i (|i| < 2^22) in one fused multiply-add, for a
// small integer u (|u| <= 64) with |u * i| < 2^24; nu_magic = -u * MAGIC_F, exact (3u * 2^22).
// The float of d is 1.5 * 2^23 + i exactly, so the fused operation's exact value
// u * (1.5 * 2^23 + i) - u * 1.5 * 2^23 is the integer u * i, a float: its one rounding changes
// nothing, and the bits are those of u * ((float)i), two exact operations. This and the
// exponential's reduction below (its fused form) are exact by construction; the others are the
// contract's own (attention's exp2c and O update, docs/numerics.md): --fmad=false keeps every
// other product and sum apart.
__device__ __forceinline__ float scaled_magic(float u, float nu_magic, int d)
{
    return __fmaf_rn(u, __int_as_float(d), nu_magic);
}

// The kernels' exponential is the fused form (FUSED = 1): two steps of strata_exp_core in fewer
// instructions, the same bits (below). The plain form (FUSED = 0), the definition's steps one
// by one, is no kernel's: numerics_probe.cu checks the fused form against it on every float
// (verify/test_kernels_cuda.py), and the kernel tests check the fused one against NumPy.

// strata_prefill.contract.numerics.exp's arithmetic for x in [-87, 88]: n = rintf(x * log2e) through MAGIC_F,
// the two-part ln 2 reduction, the polynomial, 2^n from exponent bits. Out of that range its
// value is not the definition's (the callers below select theirs).
// The fused form, why the bits are the same:
// - x - n * ln2_hi as one fused multiply-add: n is an integer with |n| <= 127 there and ln2_hi
//   has 15 significant bits, so n * ln2_hi is exact and the one rounding of the fused form is
//   the subtraction's own.
// - p * 2^n as an integer add to p's exponent field: p is in about [0.70, 1.42] (|r| <= ln2/2)
//   and for x in [-87, 88] the product is a normal float (n = -126 only for x <= -86.99, where
//   p > 1.39; n = 127 with p < 2), so the product is exact and its bits are p's plus n << 23.
//   The bits of tn are MAGIC_I + n and MAGIC_I << 23 is 0 modulo 2^32, so n << 23 is tn's bits
//   << 23 (unsigned: wraps, no overflow). One integer instruction instead of a subtraction,
//   an add, a shift and a float product.
template <int FUSED>
__device__ __forceinline__ float strata_exp_core_form(float x)
{
    const float tn = __fadd_rn(__fmul_rn(x, 0x1.715476p+0f), MAGIC_F);
    const float n = __fsub_rn(tn, MAGIC_F);
    float r = FUSED ? __fmaf_rn(-n, 0x1.62e4p-1f, x) : __fsub_rn(x, __fmul_rn(n, 0x1.62e4p-1f));
    r = __fsub_rn(r, __fmul_rn(n, 0x1.7f7d1cp-20f));
    float p = 0x1.a01a02p-13f;
    p = __fadd_rn(__fmul_rn(p, r), 0x1.6c16c2p-10f);
    p = __fadd_rn(__fmul_rn(p, r), 0x1.111112p-7f);
    p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-5f);
    p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-3f);
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    if (FUSED) return __uint_as_float(__float_as_uint(p) + (__float_as_uint(tn) << 23));
    const int ni = __float_as_int(tn) - MAGIC_I;
    return __fmul_rn(p, __int_as_float((ni + 127) << 23));
}

__device__ __forceinline__ float strata_exp_core(float x) { return strata_exp_core_form<1>(x); }

// strata_prefill.contract.numerics.exp: the shared polynomial exponential (NaN passes, > 88 -> inf, < -87 -> 0).
// The polynomial runs for every x and the special cases are selected after (no branches; out
// of range its value is dropped).
template <int FUSED>
__device__ __forceinline__ float strata_exp_form(float x)
{
    float y = strata_exp_core_form<FUSED>(x);
    y = (x < -87.0f) ? 0.0f : y;
    y = (x > 88.0f) ? __int_as_float(0x7f800000) : y;
    return (x != x) ? x : y;
}

__device__ __forceinline__ float strata_exp(float x) { return strata_exp_form<1>(x); }

// strata_prefill.contract.numerics.exp2c: attention's base-2 exponential (docs/numerics.md section
// 1), for x <= 0, -inf or NaN (both clamp to -125): 2^x as p(f) * 2^n with n = rint(x) through
// MAGIC_F, f = x - n (exact), p a degree-4 polynomial in four fused multiply-adds with p(0) = 1,
// and 2^n added to p's exponent field. The low 9 bits of t's bits are n mod 512 (MAGIC_I's are
// 0), so t's bits << 23 is n << 23 modulo 2^32; p lies in about [0.707, 1.415] and n in
// [-125, 0], so the exponent field stays in [1, 127] and the result is a normal float. Nine
// instructions: the clamp, three for n and f, four fused multiply-adds, one shift-and-add.
#define EXP2C_C1 0x1.62e12cp-1f
#define EXP2C_C2 0x1.ec0378p-3f
#define EXP2C_C3 0x1.c9fc46p-5f
#define EXP2C_C4 0x1.3a02b6p-7f
__device__ __forceinline__ float strata_exp2c(float x)
{
    x = fmaxf(x, -125.0f);  // NaN -> -125 as well: fmaxf returns the operand that is a number
    const float t = __fadd_rn(x, MAGIC_F);
    const float f = __fsub_rn(x, __fsub_rn(t, MAGIC_F));
    float p = __fmaf_rn(EXP2C_C4, f, EXP2C_C3);
    p = __fmaf_rn(p, f, EXP2C_C2);
    p = __fmaf_rn(p, f, EXP2C_C1);
    p = __fmaf_rn(p, f, 1.0f);
    return __uint_as_float(__float_as_uint(p) + (__float_as_uint(t) << 23));
}

// log2(e) as float32, for a sink logit's base-2 form (sink * LOG2E_F) and the scores' scale.
#define LOG2E_F 0x1.715476p+0f

// strata_prefill.contract.moe.swiglu of one value: silu(g) * u with silu(x) = x / (1.0f + exp(-x)) (IEEE
// division; x < -88 gives -0.0, as in NumPy). The one home of the formula: swiglu.cu and
// swiglu_q8_1.cu must give the same bits.
__device__ __forceinline__ float strata_swiglu(float g, float u)
{
    const float silu = g / __fadd_rn(1.0f, strata_exp(-g));
    return __fmul_rn(silu, u);
}

// strata_prefill.contract.moe.swiglu_oai of one value (gpt-oss's clamped SwiGLU): g = min(g, limit) and
// u = min(max(u, -limit), limit) by comparisons, so that a NaN passes as in the definition
// (fminf/fmaxf would drop it); t = alpha * g; s = g / (1.0f + exp(-t)); H = s * (u + 1.0f). The one
// home of the formula: swiglu.cu and swiglu_q8_1.cu must give the same bits.
__device__ __forceinline__ float strata_swiglu_oai(float g, float u, float alpha, float limit)
{
    g = (g > limit) ? limit : g;
    u = (u > limit) ? limit : ((u < -limit) ? -limit : u);
    const float s = g / __fadd_rn(1.0f, strata_exp(-__fmul_rn(alpha, g)));
    return __fmul_rn(s, __fadd_rn(u, 1.0f));
}

// strata_prefill.contract.numerics.roundf: round half away from zero (C roundf), exact for every float.
__device__ __forceinline__ float roundf_away(float x)
{
    const float t = truncf(x);
    return (fabsf(x - t) >= 0.5f) ? t + copysignf(1.0f, x) : t;
}

// (int)roundf_away(x) for finite |x| < 2^22 without the conversion pipe: rintf through MAGIC_F,
// then a tie that went toward zero steps away (x - rn is exact). Checked exhaustively for
// |x| <= 128.
__device__ __forceinline__ int roundf_away_int(float x)
{
    const float t = __fadd_rn(x, MAGIC_F);
    int ri = __float_as_int(t) - MAGIC_I;
    const float d = __fsub_rn(x, __fsub_rn(t, MAGIC_F));
    const int away = (x > 0.0f) ? 1 : -1;
    return (d == copysignf(0.5f, x)) ? ri + away : ri;
}

// rint(y) for 0 <= y < 2^22 as the float MAGIC_F + rint(y) (round half to even, the float
// add's own rounding): its bits are MAGIC_I + the integer, so for a code below 256 the low byte
// of the bits is the code itself. Attention's P codes (strata_prefill.contract.attention: rint
// of w * d_inv, in [0, 127]): one instruction, no byte extraction.
__device__ __forceinline__ float rint_nonneg_magic(float y) { return __fadd_rn(y, MAGIC_F); }

// ---- the q8-style block quantize: d_inv = 127 / amax, code = roundf_away(x * d_inv),
// d = 1 / d_inv. The zero rules differ by block kind and each caller keeps its own (its NumPy
// definition's):
// - q8_1 activation blocks (quantize_q8_1.cu, strata_prefill.contract.q8_1): amax == 0 -> d = 0, codes 0; codes
//   are (int)q8_round(x, d_inv) truncated to a byte.
// - attention's P blocks (attention_pair.cu, attention_split.cu, strata_prefill.contract.attention):
//   d_inv not finite (amax 0 or below 127 / FLT_MAX) -> scale 0, codes 0; codes round half to
//   even (rint_nonneg_magic).
// The KV cache's rows and attention's Q take row_quantize_warp (below).
__device__ __forceinline__ float q8_inv_scale(float amax) { return 127.0f / amax; }
__device__ __forceinline__ float q8_scale(float d_inv) { return 1.0f / d_inv; }
__device__ __forceinline__ float q8_round(float x, float d_inv) { return roundf_away(__fmul_rn(x, d_inv)); }

// ---- warp reductions (xor butterflies: every lane ends with the result)

// Max over the warp (exact in any order).
__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The per-row quantize of attention's Q (qmax 255) and the KV cache's K (511) and V (127), a
// row of 32 R values held R a lane
// (value 32 r + lane in x[r]): amax = max |x|; amax == 0 -> d = 0, codes 0; else d_inv = qmax /
// amax, code = roundf(x * d_inv) (non-finite: 0), d = 1 / d_inv (strata_prefill.contract
// .blockquant.quantize_blocks with that bound over one block of the row). The codes come back
// as floats (integers, |code| <= qmax, zero always +0.0: the cache stores K's as float16 bits);
// returns d. A tiny amax makes d_inv = inf: every code 0 (x * inf is not finite) and d = 0.
template <int R>
__device__ __forceinline__ float row_quantize_warp(const float (&x)[R], float qmax, float (&code)[R])
{
    float m = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) m = fmaxf(m, fabsf(x[r]));
    const float amax = warp_max(m);
    float d = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) code[r] = 0.0f;
    if (amax > 0.0f) {
        const float d_inv = qmax / amax;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float c = roundf_away(__fmul_rn(x[r], d_inv));
            code[r] = isfinite(c) ? __fadd_rn(c, 0.0f) : 0.0f;  // + 0: a -0.0 code is the integer 0
        }
        d = 1.0f / d_inv;
    }
    return d;
}

// Max over each group of 4 lanes.
__device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Sum over the warp: the halving tree of strata_prefill.contract.numerics (offsets 16, 8, 4, 2, 1; float
// addition is commutative, so every lane holds the tree's bits).
__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif  // STRATA_NUMERICS_CUH
