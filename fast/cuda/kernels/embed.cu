// Token embedding: rows of a quantized token_embd matrix, dequantized on the device.
//
// Definition: strata_prefill.contract.quants.dequantize of the rows (as
// strata_prefill.formats.pack.Pack.embedding_rows gives them): per value, the contract's formula
// over the decoded form (docs/numerics.md section 3), every product and difference rounded to
// float32 on its own (the build has --fmad=false; __fmul_rn and __fsub_rn say it here too):
//   Q8_0 (PLAIN, one unit sub-scale):                     dw * c
//   Q6_K, IQ4_XS (PLAIN, a sub-scale u per 16 / 32 values): (dw * u) * c
//   Q2_K, Q4_K, Q5_K (DMIN, u and v per 16 / 32 values):   (dw * u) * c - mw * v   (dw = d, mw = dmin)
// The bit layouts are the decode_blocks of contract/kquants.py (Q4_K, Q5_K, Q6_K),
// contract/qformats.py (Q2_K) and contract/codebooks.py (IQ4_XS: c = codebook[nibble]).
// table: n_vocab rows of row_bytes = n / VPB * BS bytes; ids int32 [T] (in range: checked by the
// caller); out: T rows of n floats at + t * ldo. One thread per output value: the host's
// dequantize of the same rows took most of a short prompt's time before its first kernel.

#include <cuda_fp16.h>
#include <stdint.h>

#include "qformats.cuh"
#include "embed_kernels.cuh"  // EMBED_KERNELS

__device__ __forceinline__ float half_at(const uint8_t* p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

// Q4_K's and Q5_K's 6-bit scale u and min v of 32-value block b, from scales[12]
// (contract/kquants.py _k_scale_min)
__device__ __forceinline__ void k_scale_min(const uint8_t* s, int b, int& u, int& v) {
    if (b < 4) {
        u = s[b] & 63;
        v = s[b + 4] & 63;
    } else {
        u = (s[b + 4] & 15) | ((s[b - 4] >> 2) & 48);
        v = (s[b + 4] >> 4) | ((s[b] >> 2) & 48);
    }
}

// value i of one block (0 <= i < VPB)
template <int QT> __device__ float block_value(const uint8_t* blk, int i);

template <> __device__ float block_value<QT_Q8_0>(const uint8_t* blk, int i) {
    return __fmul_rn(half_at(blk + QFormat<QT_Q8_0>::HALF_D), (float)(int)(int8_t)blk[2 + i]);
}

// DMIN: the code of value i is the low (even 32-block) or high (odd) nibble of qs[32 * (b / 2) + l],
// Q5_K's with bit b of qh[l] as bit 4
template <int QT> __device__ __forceinline__ float k_min_value(const uint8_t* blk, int i, int qs0, int qh0) {
    const int b = i >> 5, l = i & 31;
    int u, v;
    k_scale_min(blk + 4, b, u, v);
    const uint8_t q = blk[qs0 + 32 * (b >> 1) + l];
    int c = (b & 1) ? (q >> 4) : (q & 15);
    if (qh0 >= 0) c |= ((blk[qh0 + l] >> b) & 1) << 4;
    const float du = __fmul_rn(half_at(blk + QFormat<QT>::HALF_D), (float)u);
    const float mv = __fmul_rn(half_at(blk + QFormat<QT>::HALF_DMIN), (float)v);
    return __fsub_rn(__fmul_rn(du, (float)c), mv);
}

// Q2_K: value 128h + 32j + l is bits 2j..2j+1 of qs[32h + l]; u and v the low and high nibbles of
// scales[i / 16]
template <> __device__ float block_value<QT_Q2_K>(const uint8_t* blk, int i) {
    const int h = i >> 7, j = (i & 127) >> 5, l = i & 31;
    const int q = (blk[16 + 32 * h + l] >> (2 * j)) & 3;
    const int s = blk[i >> 4];
    const float du = __fmul_rn(half_at(blk + QFormat<QT_Q2_K>::HALF_D), (float)(s & 15));
    const float mv = __fmul_rn(half_at(blk + QFormat<QT_Q2_K>::HALF_DMIN), (float)(s >> 4));
    return __fsub_rn(__fmul_rn(du, (float)q), mv);
}

template <> __device__ float block_value<QT_Q4_K>(const uint8_t* blk, int i) {
    return k_min_value<QT_Q4_K>(blk, i, 16, -1);
}

template <> __device__ float block_value<QT_Q5_K>(const uint8_t* blk, int i) {
    return k_min_value<QT_Q5_K>(blk, i, 48, 16);
}

// Q6_K: 32-block b = 4h + g takes ql[64h + 32 (g & 1) + l] (low nibble for g < 2, high above)
// and bits 2g..2g+1 of qh[32h + l] as bits 4..5; code q - 32; sub-scale scales[i / 16]
template <> __device__ float block_value<QT_Q6_K>(const uint8_t* blk, int i) {
    const int b = i >> 5, l = i & 31, h = b >> 2, g = b & 3;
    const uint8_t lo = blk[64 * h + 32 * (g & 1) + l];
    const int q = ((g >> 1) ? (lo >> 4) : (lo & 15)) | (((blk[128 + 32 * h + l] >> (2 * g)) & 3) << 4);
    const float du = __fmul_rn(half_at(blk + QFormat<QT_Q6_K>::HALF_D), (float)(int)(int8_t)blk[192 + (i >> 4)]);
    return __fmul_rn(du, (float)(q - 32));
}

// IQ4_XS: 32-block b's u = (bits 4(b % 2).. of scales_l[b / 2] | bits 2b..2b+1 of scales_h << 4) - 32;
// value l < 16 the low nibble of qs[16b + l], l >= 16 the high one of qs[16b + l - 16], through the
// 16-entry codebook (entry 4w + k in byte k of CODEBOOKw)
template <> __device__ float block_value<QT_IQ4_XS>(const uint8_t* blk, int i) {
    using F = QFormat<QT_IQ4_XS>;
    const int b = i >> 5, l = i & 31;
    const int hi = ((blk[2] | (blk[3] << 8)) >> (2 * b)) & 3;
    const int u = (((blk[4 + (b >> 1)] >> (4 * (b & 1))) & 15) | (hi << 4)) - 32;
    const uint8_t q = blk[8 + 16 * b + (l & 15)];
    const int k = (l >> 4) ? (q >> 4) : (q & 15);
    const unsigned w = (k >> 2) == 0 ? F::CODEBOOK0 : (k >> 2) == 1 ? F::CODEBOOK1 : (k >> 2) == 2 ? F::CODEBOOK2 : F::CODEBOOK3;
    const int c = (int)(int8_t)((w >> (8 * (k & 3))) & 0xFF);
    return __fmul_rn(__fmul_rn(half_at(blk + F::HALF_D), (float)u), (float)c);
}

template <int QT>
__device__ __forceinline__ void embed_rows(const int* __restrict__ ids, int T, const uint8_t* __restrict__ table,
                                           long long row_bytes, int n, float* __restrict__ out, long long ldo) {
    const long long total = (long long)T * n;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long t = idx / n;
        const int i = (int)(idx - t * n);
        const int vpb = QFormat<QT>::VPB;
        const uint8_t* blk = table + (long long)ids[t] * row_bytes + (long long)(i / vpb) * QFormat<QT>::BS;
        out[t * ldo + i] = block_value<QT>(blk, i % vpb);
    }
}

#define EMBED_ENTRY(NAME, QT)                                                                            \
    extern "C" __global__ void __launch_bounds__(256)                                                    \
    NAME(const int* __restrict__ ids, int T, const uint8_t* __restrict__ table, long long row_bytes, int n, \
         float* __restrict__ out, long long ldo) {                                                       \
        embed_rows<QT>(ids, T, table, row_bytes, n, out, ldo);                                           \
    }

// one kernel a type with an embed_kernel in the registry (embed_kernels.cuh, written from it); a
// type added there needs its block_value above
EMBED_KERNELS(EMBED_ENTRY)
