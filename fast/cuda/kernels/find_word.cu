// How many 32-bit words of a buffer equal a value, and the first of them.
//
// Definition: NumPy `hits = np.flatnonzero(a.view("<u4") == v)`, giving (hits.size, hits[0]),
// or (0, n) where there is none (verify/device_checks.py:unwritten_words holds both forms).
// The tests poison an output before a launch and ask this where the kernel left poison: every
// word is read where it lies, so an output of gigabytes is checked without its copy to the host.
//
// out[0] (the count) must be 0 and out[1] (the first index) n before the launch.

#include <stdint.h>

extern "C" __global__ void __launch_bounds__(256)
find_word(const uint32_t* a, unsigned long long n, uint32_t v, unsigned long long* out)
{
    unsigned long long count = 0, first = n;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (a[i] == v) {
            count += 1;
            first = i < first ? i : first;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {  // the warp's sums and minima, then one atomic per warp
        count += __shfl_down_sync(0xffffffffu, count, off);
        const unsigned long long f = __shfl_down_sync(0xffffffffu, first, off);
        first = f < first ? f : first;
    }
    if ((threadIdx.x & 31) == 0 && count) {
        atomicAdd(out, count);
        atomicMin(out + 1, first);
    }
}
