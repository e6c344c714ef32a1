// Router: softmax over all experts, top-K, renormalized weights (router_topk); or top-K on the
// biased logits and a softmax over the K selected (router_topk_selected).
//
// router_topk -- definition: strata_prefill.contract.routing.top_k (docs/numerics.md section 4), with strata_prefill.contract.numerics.softmax:
//   m = max_i v_i (fmaxf: exact in any order); e_i = exp(v_i - m) (the shared polynomial exp);
//   s = lane_sum(e) (lane l: acc = acc + e_i for i = l, l+32, ...; then xor butterfly 16..1);
//   p_i = e_i / s (IEEE division).
//   top-K by p descending, ties to the lower expert id (numpy's stable argsort of -p);
//   total = 0.0f; for r in rank order: total = total + p_r;
//   w_r = p_r / max(total, 6.1035e-5f).
// One warp per token; the row's probabilities live in shared memory (E floats per warp).
// logits: T rows of E floats, row t at + t * ld. ids int32 [T, K], weights float32 [T, K].
// K <= 32 and K <= E (checked by the host). A row whose probabilities are NaN (a NaN or
// infinite logit) picks experts 0..K-1 with NaN weights, as the definition's stable sort does.

#include <stdint.h>
#include "strata_numerics.cuh"  // strata_exp, warp_max, warp_sum

#define ROUTER_WARPS 4


extern "C" __global__ void __launch_bounds__(32 * ROUTER_WARPS)
router_topk(const float* __restrict__ logits, long long ld, int T, int E, int K,
            int* __restrict__ ids, float* __restrict__ weights)
{
    extern __shared__ float sm[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long t = (long long)blockIdx.x * ROUTER_WARPS + warp;
    if (t >= T) return;
    float* p = sm + (long long)warp * E;
    const float* v = logits + t * ld;

    float m = __int_as_float(0xff800000);
    for (int i = lane; i < E; i += 32) m = fmaxf(m, v[i]);
    m = warp_max(m);

    float acc = 0.0f;
    for (int i = lane; i < E; i += 32) {
        const float e = strata_exp(__fsub_rn(v[i], m));
        p[i] = e;
        acc = __fadd_rn(acc, e);
    }
    acc = warp_sum(acc);
    for (int i = lane; i < E; i += 32) p[i] = p[i] / acc;
    __syncwarp();

    float total = 0.0f;
    float my_p = 0.0f;
    int my_id = 0;
    for (int r = 0; r < K; ++r) {
        // the pick's key: the probability (>= 0), a NaN one -0.5 (below every number, as
        // numpy's sort puts NaN last), a taken one -1 (its mark); nothing is below -1, so
        // every lane's pick is an expert id even where every probability is NaN
        float bp = -1.0f;
        int bi = 0x7fffffff;
        for (int i = lane; i < E; i += 32) {
            const float pi = p[i];
            const float key = pi != pi ? -0.5f : pi;
            if (key > bp) {  // ascending i: the first of equal values (lowest id) stays
                bp = key;
                bi = i;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float op = __shfl_xor_sync(0xffffffffu, bp, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (op > bp || (op == bp && oi < bi)) {
                bp = op;
                bi = oi;
            }
        }
        bp = p[bi];  // the probability itself (a NaN key stands for a NaN)
        total = __fadd_rn(total, bp);
        if (lane == r) {
            my_p = bp;
            my_id = bi;
        }
        __syncwarp();
        if (lane == 0) p[bi] = -1.0f;
        __syncwarp();
    }
    const float denom = fmaxf(total, 0x1.ffffaap-15f);  // float32(6.1035e-5)
    if (lane < K) {
        ids[t * K + lane] = my_id;
        weights[t * K + lane] = my_p / denom;
    }
}

// router_topk_selected -- definition: strata_prefill.contract.routing.top_k(logits, K, bias=bias,
// gating="softmax_selected") (docs/numerics.md section 4):
//   v_i = logits_i + bias_i (one float32 addition; bias NULL: v_i = logits_i);
//   top-K by v descending, ties to the lower id, a NaN after every number (numpy's stable argsort
//   of -v; +0.0 and -0.0 are equal there, so they tie too);
//   m = the selected values' max; e_r = exp(v_r - m); s = lane_sum(e_0 .. e_{K-1}); w_r = e_r / s.
// m here is rank 0's value: with no NaN among the selected it is their max (a +-0.0 difference
// changes no v - m: x - 0 == x - -0 for x != 0, and exp(+-0) == 1); with one, the definition's m is
// NaN, and so is this s (the NaN lane's e), so every weight is NaN either way. The selected values
// sit one per lane (lane r: rank r), so warp_sum over them, lanes >= K holding 0.0f, is lane_sum.
// One warp per token; the row's biased logits in shared memory (E floats per warp). Nothing is
// marked as taken: rank r's pick is the first, in the order above, of the values after rank
// r - 1's pick (the order is total: ids are distinct). K <= 32 and K <= E (checked by the host).

// a (state sa, value va, id ia) comes before b in the rank order; state 2: a number, 1: NaN,
// 0: no candidate, 3: before everything (nothing picked yet)
__device__ __forceinline__ bool rank_before(int sa, float va, int ia, int sb, float vb, int ib)
{
    if (sa != sb) return sa > sb;
    if (sa == 2 && va != vb) return va > vb;
    return ia < ib;
}

extern "C" __global__ void __launch_bounds__(32 * ROUTER_WARPS)
router_topk_selected(const float* __restrict__ logits, long long ld, const float* __restrict__ bias, int T,
                     int E, int K, int* __restrict__ ids, float* __restrict__ weights)
{
    extern __shared__ float sm[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long t = (long long)blockIdx.x * ROUTER_WARPS + warp;
    if (t >= T) return;
    float* v = sm + (long long)warp * E;
    const float* x = logits + t * ld;
    for (int i = lane; i < E; i += 32) v[i] = (bias != nullptr) ? __fadd_rn(x[i], bias[i]) : x[i];
    __syncwarp();

    int ps = 3;  // the previous pick; none yet
    float pv = 0.0f;
    int pi = -1;
    float my_v = 0.0f;
    int my_id = 0;
    for (int r = 0; r < K; ++r) {
        int bs = 0;
        float bv = 0.0f;
        int bi = 0x7fffffff;
        for (int i = lane; i < E; i += 32) {
            const float vi = v[i];
            const int si = (vi != vi) ? 1 : 2;
            if (rank_before(ps, pv, pi, si, vi, i) && rank_before(si, vi, i, bs, bv, bi)) {
                bs = si;
                bv = vi;
                bi = i;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const int os = __shfl_xor_sync(0xffffffffu, bs, o);
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (rank_before(os, ov, oi, bs, bv, bi)) {
                bs = os;
                bv = ov;
                bi = oi;
            }
        }
        ps = bs;
        pv = bv;
        pi = bi;
        if (lane == r) {
            my_v = bv;
            my_id = bi;
        }
    }
    const float m = __shfl_sync(0xffffffffu, my_v, 0);
    const float e = (lane < K) ? strata_exp(__fsub_rn(my_v, m)) : 0.0f;
    const float s = warp_sum(e);
    if (lane < K) {
        ids[t * K + lane] = my_id;
        weights[t * K + lane] = e / s;
    }
}
