// Router: softmax over all experts, top-K, renormalized weights.
//
// Definition: strata.routing.top_k (docs/numerics.md section 4), with strata.numerics.softmax:
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
