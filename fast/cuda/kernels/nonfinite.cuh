// The run's NaN/Inf watch in a kernel: the test of a value and a warp's mark, shared by
// nonfinite.cu (the mark after an op) and the SwiGLU kernels (swiglu.cu, swiglu_q8_1.cu: the
// mark of the gate and up rows they read anyway). Definition: strata_prefill.formats.nonfinite.mark.
// fast/cuda/runtime.py inlines one level of local headers, so this file includes none.
#ifndef STRATA_NONFINITE_CUH
#define STRATA_NONFINITE_CUH

// A float is NaN or +-Inf exactly when its 8 exponent bits are all ones: the test is on the
// bits, so it holds under any compiler flag (never isnan / isfinite).
__device__ __forceinline__ unsigned int not_finite(unsigned int bits) {
    return (bits & 0x7f800000u) == 0x7f800000u;
}

// first = min(first, code) where any lane of the warp saw a non-finite value (bad != 0): one
// atomicMin a warp, from lane 0. Every lane of the warp must reach this call (full-mask vote).
__device__ __forceinline__ void mark_warp(unsigned long long* first, unsigned int bad, unsigned long long code) {
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) atomicMin(first, code);
}

#endif  // STRATA_NONFINITE_CUH
