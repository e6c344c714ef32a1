// Gathering expert blobs into the MMQ group buffers.
//
// Definition: strata_prefill.contract.moe.group_buffers (docs/numerics.md section 5 / DESIGN section 5.4). Each
// expert's blob is its bytes [gate | up | down] (2*gu_bytes + d_bytes). Expert q's gate|up lands
// at q * (2*gu_bytes) of the gate/up buffer, its down at q * d_bytes of the down buffer; after the
// last expert, tail_bytes zero bytes in each (the MMQ kernel reads past a tile's last row there).
//
// gather_native_group: ONE launch for up to 16 experts; their blob addresses travel by value in
//   the kernel parameters (no upload, no wait). blockIdx.y = q < n copies expert q (all
//   blockIdx.x share the bytes), blockIdx.y = n zeroes the two tails.
// gather_native_one: one expert q per launch (the opt-out path); blockIdx.y = 1 zeroes tail_bytes
//   after expert q when tail_bytes > 0 (the caller passes it for the group's last expert).
// Copies move 16 bytes at a time where source and destination share their alignment mod 16,
// else 4 bytes (same alignment mod 4), else single bytes; heads and tails bytewise.

#include <stdint.h>

#define GATHER_MAX 16

struct BlobPtrs {
    const uint8_t* p[GATHER_MAX];
};

__device__ __forceinline__ void copy_bytes(uint8_t* __restrict__ dst, const uint8_t* __restrict__ src,
                                           long long n, long long tid, long long nth)
{
    const unsigned md = (unsigned)((uintptr_t)dst & 15u);
    const unsigned ms = (unsigned)((uintptr_t)src & 15u);
    long long head, nv, done;
    if (md == ms) {
        head = (long long)((16u - md) & 15u);
        if (head > n) head = n;
        nv = (n - head) >> 4;
        const int4* s = reinterpret_cast<const int4*>(src + head);
        int4* d = reinterpret_cast<int4*>(dst + head);
        for (long long i = tid; i < nv; i += nth) d[i] = s[i];
        done = head + (nv << 4);
    } else if ((md & 3u) == (ms & 3u)) {
        head = (long long)((4u - (md & 3u)) & 3u);
        if (head > n) head = n;
        nv = (n - head) >> 2;
        const uint32_t* s = reinterpret_cast<const uint32_t*>(src + head);
        uint32_t* d = reinterpret_cast<uint32_t*>(dst + head);
        for (long long i = tid; i < nv; i += nth) d[i] = s[i];
        done = head + (nv << 2);
    } else {
        head = 0;
        done = 0;
    }
    for (long long i = tid; i < head; i += nth) dst[i] = src[i];
    for (long long i = done + tid; i < n; i += nth) dst[i] = src[i];
}

__device__ __forceinline__ void zero_bytes(uint8_t* __restrict__ dst, long long n, long long tid, long long nth)
{
    long long head = (long long)((16u - (unsigned)((uintptr_t)dst & 15u)) & 15u);
    if (head > n) head = n;
    const long long nv = (n - head) >> 4;
    int4* d = reinterpret_cast<int4*>(dst + head);
    for (long long i = tid; i < nv; i += nth) d[i] = make_int4(0, 0, 0, 0);
    for (long long i = tid; i < head; i += nth) dst[i] = 0;
    for (long long i = head + (nv << 4) + tid; i < n; i += nth) dst[i] = 0;
}

extern "C" __global__ void __launch_bounds__(256)
gather_native_group(BlobPtrs blobs, int n, long long gu_bytes, long long d_bytes, long long tail_bytes,
                    uint8_t* __restrict__ gu_buf, uint8_t* __restrict__ d_buf)
{
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long nth = (long long)gridDim.x * blockDim.x;
    const int q = blockIdx.y;
    const long long gu2 = 2 * gu_bytes;
    if (q < n) {
        const uint8_t* src = blobs.p[q];
        copy_bytes(gu_buf + (long long)q * gu2, src, gu2, tid, nth);
        copy_bytes(d_buf + (long long)q * d_bytes, src + gu2, d_bytes, tid, nth);
    } else if (q == n) {
        zero_bytes(gu_buf + (long long)n * gu2, tail_bytes, tid, nth);
        zero_bytes(d_buf + (long long)n * d_bytes, tail_bytes, tid, nth);
    }
}

extern "C" __global__ void __launch_bounds__(256)
gather_native_one(const uint8_t* __restrict__ src, int q, long long gu_bytes, long long d_bytes,
                  long long tail_bytes, uint8_t* __restrict__ gu_buf, uint8_t* __restrict__ d_buf)
{
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long nth = (long long)gridDim.x * blockDim.x;
    const long long gu2 = 2 * gu_bytes;
    if (blockIdx.y == 0) {
        copy_bytes(gu_buf + (long long)q * gu2, src, gu2, tid, nth);
        copy_bytes(d_buf + (long long)q * d_bytes, src + gu2, d_bytes, tid, nth);
    } else if (tail_bytes > 0) {
        zero_bytes(gu_buf + (long long)(q + 1) * gu2, tail_bytes, tid, nth);
        zero_bytes(d_buf + (long long)(q + 1) * d_bytes, tail_bytes, tid, nth);
    }
}
