// The run's watch for NaN and Inf: the first watched op (in the record file's order) whose
// output holds one, kept on the device so that no op waits for the host.
//
// Definition: strata_prefill.formats.nonfinite.mark (NumPy): first = code where x holds a NaN or an Inf and
// code < first, else first unchanged; a launch whose code is not below first reads nothing
// (an earlier op already holds the watch). A float is NaN or +-Inf exactly when its 8
// exponent bits are all ones, so the test is on the bits, under any compiler flag
// (nonfinite.cuh, shared with the SwiGLU kernels, which mark the gate and up rows they read).
// first is one uint64 the host sets to all ones before a run and reads once at its end.
// When the host sees x 16-byte aligned it passes vec4 = 1 and the kernel reads uint4s
// (the same floats, four at a time).

#include <stdint.h>
#include "nonfinite.cuh"  // not_finite, mark_warp

extern "C" __global__ void __launch_bounds__(256)
nonfinite_mark(const unsigned int* __restrict__ x, long long n, unsigned long long* first,
               unsigned long long code, int vec4)
{
    if (*((volatile unsigned long long*)first) <= code) return;  // the whole grid returns alike
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int bad = 0;
    long long done = 0;
    if (vec4) {
        const long long n4 = n >> 2;
        const uint4* x4 = reinterpret_cast<const uint4*>(x);
        for (long long i = i0; i < n4; i += stride) {
            const uint4 v = x4[i];
            bad |= not_finite(v.x) | not_finite(v.y) | not_finite(v.z) | not_finite(v.w);
        }
        done = n4 << 2;
    }
    for (long long i = done + i0; i < n; i += stride) bad |= not_finite(x[i]);
    mark_warp(first, bad, code);  // every lane of the warp reaches it (the loops hold no early exit)
}
