// Elementwise sums of float32 arrays, one IEEE addition per element.
//
// add_f32: the attention residual x = x + o. Definition: NumPy `x + y` on float32 arrays
// (the attention halves' `x + out`). out may alias x or y. When the host sees all three
// pointers 16-byte aligned it passes vec4 = 1 and the kernel moves float4s (the same
// additions, element by element).
//
// add_row_bias_f32: a dense product's bias on every row, y[t, i] = y[t, i] + b[i]
// (strata_prefill.contract.dense.add_row_bias; docs/numerics.md section 5, Biases). out may
// alias y. A thread an element; the bias row is read through the cache (n floats shared by
// every row).

#include <stdint.h>

extern "C" __global__ void __launch_bounds__(256)
add_f32(const float* x, const float* y, float* out, long long n, int vec4)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long done = 0;
    if (vec4) {
        const long long n4 = n >> 2;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const float4* y4 = reinterpret_cast<const float4*>(y);
        float4* o4 = reinterpret_cast<float4*>(out);
        for (long long i = i0; i < n4; i += stride) {
            const float4 a = x4[i];
            const float4 b = y4[i];
            float4 c;
            c.x = a.x + b.x;
            c.y = a.y + b.y;
            c.z = a.z + b.z;
            c.w = a.w + b.w;
            o4[i] = c;
        }
        done = n4 << 2;
    }
    for (long long i = done + i0; i < n; i += stride) out[i] = x[i] + y[i];
}

extern "C" __global__ void __launch_bounds__(256)
add_row_bias_f32(const float* y, const float* __restrict__ b, float* out, long long total, int n)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
        out[i] = y[i] + __ldg(b + (int)(i % n));
}
