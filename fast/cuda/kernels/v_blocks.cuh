// The KV cache's V codes again, transposed per 64-key block (v_t), so that the pair kernel's
// P.V (attention_pair.cu) reads its B fragments with plain ldmatrix and no byte
// permutes. Layout definition, mirrored in NumPy by fast/cuda/attention.py v_blocks_host:
//   per KV head and 64-key block: hd rows of 64 bytes; row vt_row(d) is dim d, and byte
//   vt_slot(kappa) of it is the code of the block's key kappa. The byte of (KV head h, key j,
//   dim d) sits at ((h * nblk + j / 64) * hd + vt_row(d)) * 64 + vt_slot(j % 64), where
//   nblk = ceil(capacity / 64).
//   vt_slot(kappa) = 32 * (kappa & 1) + k(kappa >> 1): keys of parity 1 are the pair kernel's
//     second k-step, and within a k-step the column k of its P A fragment that holds lambda:
//     k(lambda) = 16 (lambda >> 4) + 4 ((lambda >> 1) & 3) + 2 ((lambda >> 3) & 1) + (lambda & 1)
//     (the inverse of the fragment's lambda = 8 (i >> 1) + 2 tq + (i & 1) for k = 4 tq + i,
//     + 16 for k >= 16);
//   vt_row(d) = 16 (d >> 4) + 8 (d & 1) + ((d & 15) >> 1): a 16-dim group's even dims, then its
//     odd ones, so each 8-row ldmatrix matrix (8 even or 8 odd dims: one n8 tile) is 8
//     consecutive rows of the staged block.
// It holds the same int8 codes as v_codes (one scale per token, v_scale): a layout, no numerics.
#ifndef V_BLOCKS_CUH
#define V_BLOCKS_CUH

__device__ __forceinline__ int vt_slot(int kappa)
{
    const int l = kappa >> 1;
    return 32 * (kappa & 1) + 16 * (l >> 4) + 4 * ((l >> 1) & 3) + 2 * ((l >> 3) & 1) + (l & 1);
}

__device__ __forceinline__ int vt_row(int d) { return 16 * (d >> 4) + 8 * (d & 1) + ((d & 15) >> 1); }

// The 64-key blocks a KV head holds in v_t: ceil(capacity / 64).
__device__ __forceinline__ int vt_blocks(int capacity) { return (capacity + 63) >> 6; }

// Byte offset of (KV head h, key j, dim d) in v_t.
__device__ __forceinline__ long long vt_offset(int h, long long j, int d, int hd, int capacity)
{
    return (((long long)h * vt_blocks(capacity) + (j >> 6)) * hd + vt_row(d)) * 64 + vt_slot((int)(j & 63));
}

#endif  // V_BLOCKS_CUH
