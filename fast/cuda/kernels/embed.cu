// Token embedding from a Q8_0 token_embd matrix.
//
// Definition: strata_prefill.contract.quants.dequantize for Q8_0 rows (as strata_prefill.formats.pack.Pack.embedding_rows gives
// them): per 34-byte block, d = half -> float (exact), value_i = d * (float)q_i.
// table: n_vocab rows of row_bytes = n/32 * 34 bytes; ids int32 [T] (in range: checked by the
// caller); out: T rows of n floats at + t * ldo. One thread per output value.

#include <cuda_fp16.h>
#include <stdint.h>

extern "C" __global__ void __launch_bounds__(256)
embed_q8_0(const int* __restrict__ ids, int T, const uint8_t* __restrict__ table, long long row_bytes,
           int n, float* __restrict__ out, long long ldo)
{
    const long long total = (long long)T * n;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long t = idx / n;
        const int i = (int)(idx - t * n);
        const uint8_t* blk = table + (long long)ids[t] * row_bytes + (long long)(i >> 5) * 34;
        const unsigned short dbits = (unsigned short)(blk[0] | (blk[1] << 8));
        const float d = __half2float(__ushort_as_half(dbits));
        const float q = (float)(int)(int8_t)blk[2 + (i & 31)];
        out[t * ldo + i] = __fmul_rn(d, q);
    }
}
