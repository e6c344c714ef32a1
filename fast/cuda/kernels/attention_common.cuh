// The shared part of the attention kernels (attention_pair.cu, attention_split.cu): the definition
// they both compute (strata_prefill.contract.attention.attend), KEY_BLOCK, the tensor-core and quantization helpers,
// the V^T staging step (split-K), the steps of a key block in the prefill kernel (Q.K, mask and
// maxima, exponential, V-scale fold, the O and L accumulation), its output and its entry macro.
// Include strata_numerics.cuh first.
//
// Definition: strata_prefill.contract.attention.attend (docs/numerics.md section 5), bit for bit:
//   Q quantized per head row: codes |q| <= 255, one scale dq (row_quantize_warp, qmax 255); K
//     likewise at 511, stored in the cache as float16 codes with one scale dk per token and head.
//   score of key j, in base 2: sumf = sum_i q_i * k_ji, an exact integer (|sumf| < 2^24, so any
//     order: fp16 tensor cores with a float32 accumulator here); s = (sumf * dk_j) * dqs with
//     dqs = dq * kq2 (kq2 = float32(log2(e) / sqrt(head_dim))).
//   keys in blocks of 64 at absolute positions, c = 0 .. pos/64 ascending; key j valid iff
//     j <= pos. m_c = max valid s_j; m_new = max(M, m_c); alpha = exp2c(M - m_new);
//   p_j = valid ? exp2c(s_j - m_new) : 0; lsum = tree_sum(p[0..63]) (p_l + p_{l+32}, then the
//     halving tree 16..1); w_j = p_j * dv_j; amax = max w_j, d_inv = 127 / amax (not finite:
//     scale 0, codes 0), wq_j = rint(w_j * d_inv), dw = 1 / d_inv; pvf_i = sum_j wq_j * vq_ji
//     (exact int32); L = L * alpha + lsum; O_i = fma(dw, pvf_i, O_i * alpha); M = m_new;
//     finally out_i = O_i / L.
//   exp2c is strata_numerics.cuh's strata_exp2c (strata_prefill.contract.numerics.exp2c).
// The options (the *_sinks_window kernels; docs/numerics.md section 5, "Sinks", "Sliding
// window"): a sink logit per query head starts the state at M = sink * LOG2E_F, L = 1.0f (O = 0);
// a window of W keys makes key j valid iff lo <= j <= pos with lo = max(pos - W + 1, 0), and a
// query merges the blocks lo/64 .. pos/64 only (a block before them leaves its state as it is).
// GQA: query head h reads KV head h / group (group = n_head / n_head_kv). Cache of one layer as
// strata_prefill.contract.attention.KVCache: k_codes [n_kv, cap, HD] float16, k_scale [n_kv, cap]
// f32, v_codes [n_kv, cap, HD] int8, v_scale [n_kv, cap] f32; keys at or past `cap` are never read.
// Integer parts are exact whatever the summation order, so they may run on tensor cores (Q.K:
// mma.sync m16n8k16 f16 with an f32 accumulator, every partial sum an integer below 2^24; P.V:
// m16n8k32 s8) with any key order inside a block; every float step keeps the definition's
// operations and order.
// Compiled with --fmad=false; float steps are written with __fmul_rn / __fadd_rn / __fmaf_rn.
#ifndef STRATA_ATTENTION_COMMON_CUH
#define STRATA_ATTENTION_COMMON_CUH

#define KEY_BLOCK 64

__device__ __forceinline__ float magic_to_float(int acc)  // acc = MAGIC_I + exact int
{
    return __fsub_rn(__int_as_float(acc), MAGIC_F);
}

// c += a.b: A 16x32 s8 (row), B 32x8 s8 (col), C 16x8 s32; exact.
__device__ __forceinline__ void mma_s8(int (&c)[4], const int (&a)[4], int b0, int b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a.b: A 16x16 f16 (row), B 16x8 f16 (col), C 16x8 f32. With integer codes whose partial
// sums stay below 2^24 in magnitude every sum is exact, whatever the order inside the mma.
__device__ __forceinline__ void mma_f16(float (&c)[4], const int (&a)[4], int b0, int b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// P codes of w >= 0 quantized with the row's di (d_inv, or 0 for a block whose 127/amax is not
// finite: codes 0): rint_nonneg_magic(w * di), byte 0 of each float's bits is its code.
template <int NT>
__device__ __forceinline__ void p_code_bits(const float (&w)[NT][4], float di0, float di1, unsigned (&cb)[NT][4])
{
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        cb[nt][0] = __float_as_uint(rint_nonneg_magic(__fmul_rn(w[nt][0], di0)));
        cb[nt][1] = __float_as_uint(rint_nonneg_magic(__fmul_rn(w[nt][1], di0)));
        cb[nt][2] = __float_as_uint(rint_nonneg_magic(__fmul_rn(w[nt][2], di1)));
        cb[nt][3] = __float_as_uint(rint_nonneg_magic(__fmul_rn(w[nt][3], di1)));
    }
}

// bytes 0 of a, b, c, d -> one word a | b << 8 | c << 16 | d << 24
__device__ __forceinline__ int pack_lo(unsigned a, unsigned b, unsigned c, unsigned d)
{
    return (int)__byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

// The k32 A fragment of P from accumulators n0 .. n0 + 3: k = 4 tq + i <- lambda =
// 8 (i >> 1) + 2 tq + (i & 1) (accumulators n0, n0 + 1), + 16 for registers 2 and 3 (n0 + 2, + 3);
// registers 0 and 2 row r0, 1 and 3 row r1.
template <int NT>
__device__ __forceinline__ void p_fragment(const unsigned (&cb)[NT][4], int n0, int (&a)[4])
{
    a[0] = pack_lo(cb[n0][0], cb[n0][1], cb[n0 + 1][0], cb[n0 + 1][1]);
    a[1] = pack_lo(cb[n0][2], cb[n0][3], cb[n0 + 1][2], cb[n0 + 1][3]);
    a[2] = pack_lo(cb[n0 + 2][0], cb[n0 + 2][1], cb[n0 + 3][0], cb[n0 + 3][1]);
    a[3] = pack_lo(cb[n0 + 2][2], cb[n0 + 2][3], cb[n0 + 3][2], cb[n0 + 3][3]);
}

// Step idx of staging a V^T block (VW words a dim row) in shared memory: word slot = idx % 16 of
// the dim rows 4m .. 4m+3 (m = idx / 16) from four keys' words r[u] (key u's codes of those
// dims); byte u of each word is key u's code. Which keys the slot holds is the caller's layout.
template <int VW>
__device__ __forceinline__ void put_v_transposed(int* svt, int idx, const unsigned (&r)[4])
{
    const int slot = idx % (KEY_BLOCK / 4);
    const int m = idx / (KEY_BLOCK / 4);
    const unsigned lo01 = __byte_perm(r[0], r[1], 0x5140);
    const unsigned hi01 = __byte_perm(r[0], r[1], 0x7362);
    const unsigned lo23 = __byte_perm(r[2], r[3], 0x5140);
    const unsigned hi23 = __byte_perm(r[2], r[3], 0x7362);
    svt[(4 * m + 0) * VW + slot] = (int)__byte_perm(lo01, lo23, 0x5410);
    svt[(4 * m + 1) * VW + slot] = (int)__byte_perm(lo01, lo23, 0x7632);
    svt[(4 * m + 2) * VW + slot] = (int)__byte_perm(hi01, hi23, 0x5410);
    svt[(4 * m + 3) * VW + slot] = (int)__byte_perm(hi01, hi23, 0x7632);
}

// ---- staging: cp.async into shared memory

// bar.sync on named barrier id for THREADS threads (a pair of warps, the consumer warpgroups)
template <int THREADS>
__device__ __forceinline__ void named_barrier(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(THREADS) : "memory"); }
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// cp.async of `bytes` (4, 8 or 16); src_ok false: the bytes are zero-filled (nothing is read)
template <int BYTES>
__device__ __forceinline__ void cp_async(unsigned dst, const void* src, bool src_ok)
{
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_ok ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(BYTES),
                     "r"(src_ok ? BYTES : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// ---- per row and block: lane quad g (lanes 4 g + tq) holds rows r0 and r1 (M0, M1); each
// lane computes one row's value (tq even: r0, odd: r1) and the quad shares them

// alpha = exp2c(M - m_new) of the quad's two rows (al0, al1): 1.0f exactly (exp2c(0)) while
// every row of the warp keeps a finite maximum, the exponential skipped
__device__ __forceinline__ void row_alpha(float M0, float M1, float mn0, float mn1, int tq, int lane, float& al0,
                                          float& al1)
{
    const float INF = __int_as_float(0x7f800000);
    al0 = 1.0f;
    al1 = 1.0f;
    const bool keep = M0 == mn0 && fabsf(M0) < INF && M1 == mn1 && fabsf(M1) < INF;
    if (!__all_sync(0xffffffffu, keep)) {
        const float a = strata_exp2c(__fsub_rn((tq & 1) ? M1 : M0, (tq & 1) ? mn1 : mn0));
        al0 = __shfl_sync(0xffffffffu, a, lane & ~3);
        al1 = __shfl_sync(0xffffffffu, a, (lane & ~3) | 1);
    }
}

// The P quantization's scales of the quad's two rows from their amax: d_inv = 127 / amax (di,
// the codes' factor) and dw = 1 / d_inv (wd); a row whose d_inv is not finite: both 0 (codes
// 0). Two divisions a lane, not four.
__device__ __forceinline__ void p_scales(float amax0, float amax1, int tq, int lane, float& di0, float& di1,
                                         float& wd0, float& wd1)
{
    const float d_inv = q8_inv_scale((tq & 1) ? amax1 : amax0);
    const bool ok = d_inv < __int_as_float(0x7f800000);
    const float wd = ok ? q8_scale(d_inv) : 0.0f, di = ok ? d_inv : 0.0f;
    di0 = __shfl_sync(0xffffffffu, di, lane & ~3);
    di1 = __shfl_sync(0xffffffffu, di, (lane & ~3) | 1);
    wd0 = __shfl_sync(0xffffffffu, wd, lane & ~3);
    wd1 = __shfl_sync(0xffffffffu, wd, (lane & ~3) | 1);
}

// ============================================================================ tensor cores

template <bool B>
struct BoolTag {
    static constexpr bool value = B;
};

// ---- the per-(query, key) steps both prefill kernels share. A thread holds NT x 4 scores of a
// key block: accumulator (nt, e) is query row r0 (e < 2) or r1 (positions pos0, pos1) and the
// absolute key key(nt, e), which each kernel's key layout gives. A key past its row's position
// is invalid, and so is one that lo(key, e) rejects (a window's first key; NoLow: none);
// FULL: the block lies inside both rows' keys, every key valid (no tests).

// The lower bound of the valid keys where there is none: every key passes.
struct NoLow {
    __device__ __forceinline__ constexpr bool operator()(int, int) const { return true; }
};

// s = (sumf * dk) * dqs from the Q.K accumulators (dk(nt): the float2 scales of the keys with
// e & 1 = 0 and 1; dqs0, dqs1: rows r0, r1), -inf where invalid; (mc0, mc1) = the rows' maxima
// over the lane quad.
template <bool FULL, int NT, class Key, class DK, class Lo = NoLow>
__device__ __forceinline__ void scale_mask_max(float (&s)[NT][4], float dqs0, float dqs1, DK dk, int pos0, int pos1,
                                               Key key, float& mc0, float& mc1, Lo lo = Lo{})
{
    const float NEG_INF = __int_as_float(0xff800000);
    mc0 = NEG_INF;
    mc1 = NEG_INF;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const float2 d = dk(nt);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const bool valid = FULL || (key(nt, e) <= ((e < 2) ? pos0 : pos1) && lo(key(nt, e), e));
            const float sc = __fmul_rn(__fmul_rn(s[nt][e], (e & 1) ? d.y : d.x), (e < 2) ? dqs0 : dqs1);
            s[nt][e] = valid ? sc : NEG_INF;
        }
        mc0 = fmaxf(mc0, fmaxf(s[nt][0], s[nt][1]));
        mc1 = fmaxf(mc1, fmaxf(s[nt][2], s[nt][3]));
    }
    mc0 = quad_max(mc0);
    mc1 = quad_max(mc1);
}

// s = p = exp2c(s - m_new) of the row, 0 where invalid (an invalid key's -inf clamps inside
// exp2c and is then replaced).
template <bool FULL, int NT, class Key, class Lo = NoLow>
__device__ __forceinline__ void exp_masked(float (&s)[NT][4], float mn0, float mn1, int pos0, int pos1, Key key,
                                           Lo lo = Lo{})
{
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const bool valid = FULL || (key(nt, e) <= ((e < 2) ? pos0 : pos1) && lo(key(nt, e), e));
            const float x = __fsub_rn(s[nt][e], (e < 2) ? mn0 : mn1);
            const float pe = strata_exp2c(x);
            s[nt][e] = valid ? pe : 0.0f;
        }
    }
}

// s = w = p * dv (dv(nt): the float2 scales of keys with e & 1 = 0 and 1), 0 where invalid;
// (amax0, amax1) = the rows' max |w| over the lane quad.
template <bool FULL, int NT, class Key, class DV, class Lo = NoLow>
__device__ __forceinline__ void fold_v_scale(float (&s)[NT][4], int pos0, int pos1, Key key, DV dv,
                                             float& amax0, float& amax1, Lo lo = Lo{})
{
    amax0 = 0.0f;
    amax1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const float2 d = dv(nt);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const bool valid = FULL || (key(nt, e) <= ((e < 2) ? pos0 : pos1) && lo(key(nt, e), e));
            const float we = __fmul_rn(s[nt][e], (e & 1) ? d.y : d.x);
            s[nt][e] = valid ? we : 0.0f;
        }
        amax0 = fmaxf(amax0, fmaxf(fabsf(s[nt][0]), fabsf(s[nt][1])));
        amax1 = fmaxf(amax1, fmaxf(fabsf(s[nt][2]), fabsf(s[nt][3])));
    }
    amax0 = quad_max(amax0);
    amax1 = quad_max(amax1);
}

// O = fma(dw, pvf, O * alpha) for one 16 x 8 output tile (pv: its exact P.V sums as floats),
// rows r0 (e < 2) and r1; a row that does not reach the block (live false) keeps its O. KEEP:
// every alpha of the warp is 1.0f, and O * 1.0f is O, so the products are left out.
template <bool KEEP>
__device__ __forceinline__ void o_step_f(float (&o)[4], const float (&pv)[4], float al0, float al1, float wd0,
                                         float wd1, bool live0, bool live1)
{
    const float s0 = KEEP ? o[0] : __fmul_rn(o[0], al0);
    const float s1 = KEEP ? o[1] : __fmul_rn(o[1], al0);
    const float s2 = KEEP ? o[2] : __fmul_rn(o[2], al1);
    const float s3 = KEEP ? o[3] : __fmul_rn(o[3], al1);
    const float o0 = __fmaf_rn(wd0, pv[0], s0);
    const float o1 = __fmaf_rn(wd0, pv[1], s1);
    const float o2 = __fmaf_rn(wd1, pv[2], s2);
    const float o3 = __fmaf_rn(wd1, pv[3], s3);
    o[0] = live0 ? o0 : o[0];
    o[1] = live0 ? o1 : o[1];
    o[2] = live1 ? o2 : o[2];
    o[3] = live1 ? o3 : o[3];
}

// The same from P.V accumulators on MAGIC_I (acc = MAGIC_I + the exact sum).
template <bool KEEP>
__device__ __forceinline__ void o_step(float (&o)[4], const int (&acc)[4], float al0, float al1, float wd0,
                                       float wd1, bool live0, bool live1)
{
    const float pv[4] = {magic_to_float(acc[0]), magic_to_float(acc[1]), magic_to_float(acc[2]),
                         magic_to_float(acc[3])};
    o_step_f<KEEP>(o, pv, al0, al1, wd0, wd1, live0, live1);
}

// L = L * alpha + lsum of the thread's two rows, after the block's o_step calls (KEEP and live
// as there).
template <bool KEEP>
__device__ __forceinline__ void l_step(float& L0, float& L1, float al0, float al1, float ls0, float ls1, bool live0,
                                       bool live1)
{
    const float l0 = __fadd_rn(KEEP ? L0 : __fmul_rn(L0, al0), ls0);
    const float l1 = __fadd_rn(KEEP ? L1 : __fmul_rn(L1, al1), ls1);
    L0 = live0 ? l0 : L0;
    L1 = live1 ? l1 : L1;
}

// pv(BoolTag<KEEP>) with KEEP true where alpha is 1.0f in every row of the warp (the
// rescaling products would change no bit), else with KEEP false.
template <class PV>
__device__ __forceinline__ void pv_keep_or_rescale(PV pv, float al0, float al1)
{
    if (__all_sync(0xffffffffu, al0 == 1.0f && al1 == 1.0f)) pv(BoolTag<true>{});
    else pv(BoolTag<false>{});
}

// The end of a prefill kernel: out = O / L in the thread's two query rows ta (sum L0) and tb
// (L1) of head h, nothing for a padding row (t >= T). NTL tiles of N dims: tile i holds dims
// dim(i) .. dim(i) + N - 1, its O values val(i, k) for row ta (k < N) and val(i, N + k) for tb.
template <int HD, int NTL, int N, class Dim, class Val>
__device__ __forceinline__ void store_out(float* __restrict__ out, long long ldo, int T, int h, long long ta,
                                          long long tb, float L0, float L1, Dim dim, Val val)
{
#pragma unroll
    for (int i = 0; i < NTL; ++i) {
        const int d = dim(i);
        if (ta < T) {
            float* o = out + ta * ldo + (long long)h * HD + d;
#pragma unroll
            for (int k = 0; k < N; ++k) o[k] = val(i, k) / L0;
        }
        if (tb < T) {
            float* o = out + tb * ldo + (long long)h * HD + d;
#pragma unroll
            for (int k = 0; k < N; ++k) o[k] = val(i, N + k) / L1;
        }
    }
}

// One entry point per kernel and head_dim: attend_<KIND>_hd<HD>, the same parameters, its body
// attend_<KIND>_body<HD>. v_t (v_blocks.cuh) is read by the pair kernel only.
#define ATTEND_KERNEL(KIND, HD, THREADS, MINB)                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                    \
    attend_##KIND##_hd##HD(const float* __restrict__ q, long long ldq, const int* __restrict__ positions,\
                           int T, int group, const uint16_t* __restrict__ k_codes,                 \
                           const float* __restrict__ k_scale, const int8_t* __restrict__ v_codes,  \
                           const float* __restrict__ v_scale, const int8_t* __restrict__ v_t,      \
                           int cap, float kq2, float* __restrict__ out, long long ldo)             \
    {                                                                                              \
        attend_##KIND##_body<HD>(q, ldq, positions, T, group, k_codes, k_scale, v_codes, v_scale,  \
                                 v_t, cap, kq2, out, ldo);                                         \
    }

// The same with the options: sinks (float32 [n_head], or null: no sink) and window (keys a
// query sees, or 0: every key up to its position): attend_<KIND>_sinks_window_hd<HD>, its body
// attend_<KIND>_body<HD, true> (whose OPT false, sinks null and window 0 are the defaults the
// plain entry takes).
#define ATTEND_KERNEL_SINKS_WINDOW(KIND, HD, THREADS, MINB)                                       \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                    \
    attend_##KIND##_sinks_window_hd##HD(const float* __restrict__ q, long long ldq,                \
                           const int* __restrict__ positions, int T, int group,                    \
                           const uint16_t* __restrict__ k_codes,                                   \
                           const float* __restrict__ k_scale, const int8_t* __restrict__ v_codes,  \
                           const float* __restrict__ v_scale, const int8_t* __restrict__ v_t,      \
                           int cap, float kq2, float* __restrict__ out, long long ldo,             \
                           const float* __restrict__ sinks, int window)                            \
    {                                                                                              \
        attend_##KIND##_body<HD, true>(q, ldq, positions, T, group, k_codes, k_scale, v_codes,     \
                                       v_scale, v_t, cap, kq2, out, ldo, sinks, window);           \
    }

#endif  // STRATA_ATTENTION_COMMON_CUH
